"""The suite's fixtures live in tests/fixtures/; they are registered here.

``fixtures.jobs`` holds the leak guard every test gets: any process that
carries the test's token and outlives it fails the test.  ``fixtures.signals``
gives every process a test starts the default signal dispositions, even when
pytest itself was started with SIGINT or SIGHUP ignored (``nohup ... &``).

The README's test command runs the suite in two pytest-xdist workers
(``-n 2 --dist loadgroup``), one per core of CI's machine.  Much of an
end-to-end test's time is spent waiting (on a grace period, a timeout, a
peer), not computing, so two workers finish in well under half of one
worker's time (CONTRIBUTING.md says why not three or four).  The
groups below keep each module in one worker, so that its module fixtures
(jobs shared by several checks) run once; and every test that uses the
Slurm cluster, the Ray cluster or the hosts a test powers off in one worker
each, so that only one of each is started (two slurmd on one node name
would clash; hostE-G have fixed addresses).
"""

import pytest

# fixtures.signals sets the dispositions at configure time, before any test or
# fixture starts a process (the daemons of the fixtures after it included).
pytest_plugins = ["fixtures.signals", "fixtures.jobs", "fixtures.sshd", "fixtures.netns", "fixtures.slurm",
                  "fixtures.engines", "fixtures.ray_cluster", "fixtures.slowed", "fixtures.others"]

# A test that needs one of these fixtures runs in the worker of that group:
# one Slurm cluster and one Ray cluster for the run, and the hosts a test
# powers off (hostE-G) at their fixed addresses, never two sets at once.
ENGINE_GROUPS = {"slurm_cluster": "slurm", "ray_cluster": "ray", "mortal_hosts": "mortal_hosts"}


def xdist_group(item: pytest.Item) -> str:
    # Parametrized tests that take an engine's fixture by name, when the
    # parameter says which (test_matrix's "ray-exit", test_interactive's "slurm").
    end_to_end = item.nodeid.startswith("tests/e2e/")
    words = set(item.callspec.id.split("-")) if end_to_end and hasattr(item, "callspec") else set()
    for fixture, group in ENGINE_GROUPS.items():
        if fixture in item.fixturenames or group in words:
            return group
    return item.nodeid.split("::", 1)[0]


# A session's cluster that costs CPU while it idles, stopped in a worker as
# soon as its group's last test there is done: Ray's 21 processes take 12% of a
# core between jobs (their heartbeats, metrics and dashboard), which the
# other worker's tests and the rest of this one's went without for the rest of
# the run.  Under --dist loadgroup a group reaches a worker whole and runs
# there in one stretch; elsewhere (one process, other --dist modes) the
# cluster lives for the session, as the fixture says.
STOPPED_AFTER_THE_GROUP = {"ray_cluster": "ray"}
DIST = "jaxrun_tests_dist"  # the controller's --dist, in each worker's input (a worker's own says "no")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    node.workerinput[DIST] = node.config.getoption("dist")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield
    if (getattr(item.config, "workerinput", None) or {}).get(DIST) != "loadgroup":
        return
    for fixture, group in STOPPED_AFTER_THE_GROUP.items():
        if xdist_group(item) == group and (nextitem is None or xdist_group(nextitem) != group):
            # FixtureDef.finish runs the fixture's teardown and forgets its value:
            # a test that asks for it after this (a rerun) starts it again.
            for definition in item.session._fixturemanager.getfixturedefs(fixture, item) or ():
                definition.finish(item._request)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadgroup``, the groups with the most end-to-end tests go
    first and the unit tests' groups last (xdist orders them by their count of
    tests alone, so a unit module of many quick cases goes before a long
    end-to-end one, which can then start last and run on alone): the run ends
    with quick groups to share among the workers, not with one long one."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class EndToEndFirst(LoadGroupScheduling):
        ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:
                self.ordered = True
                self.workqueue = type(self.workqueue)(sorted(self.workqueue.items(), key=end_to_end_first))
            super()._assign_work_unit(node)

    return EndToEndFirst(config, log)


def end_to_end_first(group: tuple[str, dict[str, bool]]) -> tuple[int, int]:
    """A group's place in the queue: its end-to-end tests, most first, then its tests."""
    _, tests = group
    return -sum(t.startswith("tests/e2e/") for t in tests), -len(tests)


def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Under ``--dist loadgroup``, every test's id that a worker sends ends
    in its group; where none does, xdist would spread a group's tests over
    both workers (two Slurm or Ray clusters at once), so the run stops here."""
    if node.config.getoption("dist") == "loadgroup" and ids and not any("@" in i for i in ids):
        pytest.exit(f"pytest-xdist's groups did not reach its scheduler (no test id ends in its group, first {ids[0]}):"
                    f" pytest {pytest.__version__} with this pytest-xdist; pyproject.toml's test extra says which"
                    f" pytest works", returncode=3)
