"""--launcher slurm: one real srun step on a throwaway one-node Slurm cluster."""

import pytest

from jaxrun.backends import scheduler as engines
from jaxrun.launcher.config import SchedulerOptions
from jaxrun.launcher.plan import Target

from engine_checks import check_crash_in_task_3, check_timeout_stops_the_step, check_toy, run_jaxrun  # noqa: F401 - fixture
from slurm_fixture import slurm_cluster  # noqa: F401 - session fixture

# This machine has fewer CPUs than processes.
SLURM = ["--launcher", "slurm"]


@pytest.mark.timeout(90)
def test_toy_matches_the_guide(slurm_cluster, run_jaxrun, tmp_path):
    check_toy(run_jaxrun, SLURM, tmp_path)


@pytest.mark.timeout(60)
def test_crash_in_task_3_ends_the_step_and_is_named(slurm_cluster, run_jaxrun, tmp_path):
    check_crash_in_task_3(run_jaxrun, SLURM, tmp_path)


@pytest.mark.timeout(60)
def test_timeout_dumps_stacks_and_stops_the_step(slurm_cluster, run_jaxrun, tmp_path):
    check_timeout_stops_the_step(run_jaxrun, SLURM, tmp_path)


def test_srun_command_is_one_step_that_dies_with_any_task():
    engine = SchedulerOptions("slurm", nodes=2, tasks_per_node=4, scheduler_args=("--overcommit",))
    task = engines.task_argv("python3", ("--", "t.py", "{process_id}"))
    assert engines.srun_command(engine, 8, task) == [
        "srun", "--kill-on-bad-exit=1", "--ntasks=8", "--nodes=2", "--ntasks-per-node=4", "--overcommit",
        "python3", "-m", "jaxrun.backends.scheduler_agent", "--", "python3", "-m", "jaxrun.shim", "--", "t.py", "{process_id}",
    ]


def test_launcher_usage_errors(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "s.py"
    script.write_text("")
    for bad in (["--nodes", "2"], ["--launcher", "mpirun", "--nodes", "2"], ["--launcher", "ssh"],
                ["--launcher", "slurm", "-H", "a"]):
        proc = subprocess.run([sys.executable, "-m", "jaxrun", *bad, str(script)], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("jaxrun: error:"), (bad, proc.stderr)
