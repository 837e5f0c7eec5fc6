"""The suite's fixtures live in tests/fixtures/; they are registered here.

``fixtures.jobs`` holds the leak guard every test gets: any process that
carries the test's token and outlives it fails the test.
"""

pytest_plugins = ["fixtures.jobs", "fixtures.sshd", "fixtures.netns", "fixtures.slurm", "fixtures.engines",
                  "fixtures.ray_cluster"]
