"""The scheduler backend's pure parts: srun and mpirun command lines, usage errors."""

import subprocess
import sys

import pytest

from jaxrun.backends import scheduler as engines
from jaxrun.launcher.config import SchedulerOptions


def test_srun_command_is_one_step_that_dies_with_any_task():
    engine = SchedulerOptions("slurm", nodes=2, tasks_per_node=4, scheduler_args=("--overcommit",))
    task = engines.task_argv("python3", ("--", "t.py", "{process_id}"))
    assert engines.srun_command(engine, 8, task) == [
        "srun", "--kill-on-bad-exit=1", "--ntasks=8", "--nodes=2", "--ntasks-per-node=4", "--overcommit",
        "python3", "-m", "jaxrun.backends.scheduler_agent", "--", "python3", "-m", "jaxrun.shim", "--", "t.py", "{process_id}",
    ]


def test_launcher_usage_errors(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    for bad in (["--nodes", "2"], ["--launcher", "mpirun", "--nodes", "2"], ["--launcher", "ssh"],
                ["--launcher", "slurm", "-H", "a"]):
        proc = subprocess.run([sys.executable, "-m", "jaxrun", *bad, str(script)], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("jaxrun: error:"), (bad, proc.stderr)


def test_mpirun_command_forwards_variables_by_name():
    engine = SchedulerOptions("mpirun", tasks_per_node=2, scheduler_args=("--oversubscribe",))
    env = {"PATH": "/bin", "JAXRUN_TASK_SECRET": "s3cret", "JAX_PLATFORMS": "cpu", "HOME": "/root"}
    argv = engines.mpirun_command(engine, 4, ["python", "-m", "jaxrun.backends.scheduler_agent"], env, is_root=True)
    assert argv[:7] == ["mpirun", "-n", "4", "--map-by", "ppr:2:node", "--allow-run-as-root", "-x"]
    assert "s3cret" not in " ".join(argv)  # values travel in the environment, not argv
    exported = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert exported == {"PATH", "JAXRUN_TASK_SECRET", "JAX_PLATFORMS"}
    assert argv[-4:] == ["--oversubscribe", "python", "-m", "jaxrun.backends.scheduler_agent"]
    with pytest.raises(engines.SchedulerError):
        engines.mpirun_command(SchedulerOptions("mpirun", nodes=2), 4, [], {}, is_root=False)
