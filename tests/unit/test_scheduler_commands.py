"""The scheduler backend's pure parts: srun and mpirun command lines, usage errors."""

import io
import subprocess
import sys

import pytest

from jaxrun import contract
from jaxrun.backends.scheduler import backend as scheduler, engines, mpirun, slurm, task_agent as scheduler_agent
from jaxrun.backends.scheduler.options import MpirunOptions, SlurmOptions, mpirun_options, slurm_options
from jaxrun.core.config import LaunchError
from jaxrun.launcher.setup import plan


def test_srun_command_is_one_step_that_dies_with_any_task():
    options = SlurmOptions(tasks_per_node=4, scheduler_args=("--overcommit",), nodes=2)
    task = scheduler.task_argv("python3", ("--", "t.py", "{process_id}"))
    assert slurm.srun_command(options, 8, task) == [
        "srun", "--kill-on-bad-exit=1", "--ntasks=8", "--export=ALL", "--nodes=2", "--ntasks-per-node=4",
        "--overcommit",
        "python3", "-m", "jaxrun.backends.scheduler.task_agent", "--",
        "python3", "-m", "jaxrun.shim", "--", "t.py", "{process_id}",
    ]


def test_srun_names_the_job_it_allocates_after_the_run_unless_the_user_does():
    launch = plan.LaunchOptions(target=plan.Target("t.py"), num_processes=2, coordinator="", run_id="r1",
                                scheduled=True)

    def argv(base_env, scheduler_args=()):
        backend = slurm.SlurmBackend(SlurmOptions(scheduler_args=scheduler_args), launch, io.StringIO(), base_env)
        return backend.step_process(2, ["agent"], []).argv({})

    assert argv({})[:5] == ["srun", "--kill-on-bad-exit=1", "--ntasks=2", "--export=ALL", "--job-name=jaxrun-r1"]
    assert not any(a.startswith("--job-name") for a in argv({"SLURM_JOB_ID": "7"}))  # a step of the user's job
    for mine in (("-J", "mine"), ("-Jmine",), ("--job-name=mine",), ("--job-name", "mine")):
        assert [a for a in argv({}, mine) if a.startswith(("--job-name", "-J"))] == [mine[0]], mine


class Ended:
    def __init__(self, returncode):
        self.returncode = returncode


@pytest.mark.parametrize(("returncode", "queued", "cancelled"), [
    (0, None, []),  # srun ended by itself: its job ended with it
    (137, None, []),  # so did one that ended its job on SIGTERM
    (-9, None, [["scancel", "--name=jaxrun-r1"]]),  # SIGKILLed: its job may stay allocated
    (None, None, [["scancel", "--name=jaxrun-r1"]]),  # about to be (the watchdog's settle)
    (0, "42", [["scancel", "42"]]),  # unnamed, but it said its job was queued
])
def test_an_srun_that_did_not_end_by_itself_has_its_job_cancelled(monkeypatch, returncode, queued, cancelled):
    calls = []
    monkeypatch.setattr(slurm.subprocess, "run", lambda argv, **kw: calls.append(argv))
    srun = slurm.SrunProcess(SlurmOptions(), 2, ["agent"], None, {}, io.StringIO(),
                             job_name=None if queued else "jaxrun-r1")
    srun.popen, srun.queued_job = Ended(returncode), queued
    srun.cleanup()
    srun.cleanup()  # the step watcher and close() both clean up: one scancel
    assert calls == cancelled


def test_launcher_usage_errors(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    for bad in (["--nodes", "2"], ["--launcher", "mpirun", "--nodes", "2"], ["--launcher", "ssh"],
                ["--launcher", "slurm", "-H", "a"]):
        proc = subprocess.run([sys.executable, "-m", "jaxrun", *bad, str(script)], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("jaxrun: error:"), (bad, proc.stderr)


def test_mpirun_command_forwards_variables_by_name():
    options = MpirunOptions(tasks_per_node=2, scheduler_args=("--oversubscribe",))
    env = {"PATH": "/bin", "JAXRUN_TASK_SECRET": "s3cret", "JAX_PLATFORMS": "cpu", "HOME": "/root"}
    task = ["python", "-m", "jaxrun.backends.scheduler.task_agent"]
    argv = mpirun.mpirun_command(options, 4, task, env, is_root=True)
    assert argv[:7] == ["mpirun", "-n", "4", "--map-by", "ppr:2:node", "--allow-run-as-root", "-x"]
    assert "s3cret" not in " ".join(argv)  # values travel in the environment, not argv
    exported = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert exported == {"PATH", "JAXRUN_TASK_SECRET", "JAX_PLATFORMS"}
    assert argv[-4:] == ["--oversubscribe", "python", "-m", "jaxrun.backends.scheduler.task_agent"]
    assert not hasattr(MpirunOptions(), "nodes")  # mpirun takes its hosts from its own arguments


def test_mpirun_forwards_what_the_plan_set_whatever_its_name():
    """--env/-x names and PYTHONUNBUFFERED reach other nodes too; mpirun
    forwards only what -x names, and the values stay off the command line."""
    launch = plan.LaunchOptions(target=plan.Target("t.py"), num_processes=2, coordinator="", run_id="r",
                                extra_env={"FOO": "s3cret value", "lower_case": "x"}, scheduled=True)
    specs = plan.plan(launch)
    options = MpirunOptions()
    env = scheduler.step_env("mpirun", specs, {"PATH": "/bin", "HOME": "/root", "UNRELATED": "1"})
    argv = mpirun.mpirun_command(options, 2, ["t"], env, is_root=False, planned=plan.common_env(specs))
    exported = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert {"FOO", "lower_case", "PYTHONUNBUFFERED", "PATH", contract.RANK_SOURCE} <= exported
    assert not exported & {"HOME", "UNRELATED"}
    assert "s3cret value" not in argv


def test_step_env_leaves_devices_to_each_task():
    """Per-rank device ids never travel in the one environment every task
    shares; --devices-per-process's count does, for the task agent, or "auto"."""
    launch = plan.LaunchOptions(target=plan.Target("t.py"), num_processes=1, coordinator="", run_id="r",
                                devices_per_process=2)
    specs = plan.plan(launch)  # not marked scheduled: one process gets ids [0, 1] from the plan
    assert specs[0].env[contract.JAX_LOCAL_DEVICE_IDS] == "0,1"
    env = scheduler.step_env("slurm", specs, {}, devices_per_process=2)
    assert contract.JAX_LOCAL_DEVICE_IDS not in env
    assert env[contract.TASK_DEVICES_PER_PROCESS] == "2"
    assert scheduler.step_env("slurm", specs, {})[contract.TASK_DEVICES_PER_PROCESS] == "auto"  # see test_task_gpus


@pytest.mark.parametrize("local, count, environ, expected", [
    (0, 2, {contract.TASK_DEVICES_PER_PROCESS: "3"}, "0,1,2"),
    (1, 2, {contract.TASK_DEVICES_PER_PROCESS: "3"}, "3,4,5"),
    (5, 8, {contract.TASK_DEVICES_PER_PROCESS: "1"}, "5"),
    (1, 2, {}, None),
])
def test_task_agent_derives_its_devices_from_its_local_rank(local, count, environ, expected):
    got = scheduler_agent.device_env(local, count, environ).get(contract.JAX_LOCAL_DEVICE_IDS)
    assert got == expected


VALUES = {"nodes": 2, "tasks_per_node": 4, "scheduler_args": ["--overcommit"]}


def test_the_options_type_is_the_engine():
    launch = plan.LaunchOptions(target=plan.Target("t.py"), num_processes=2, coordinator="", run_id="r")
    assert slurm_options(VALUES, launch) == SlurmOptions(4, ("--overcommit",), nodes=2)
    assert mpirun_options({**VALUES, "nodes": None}, launch) == MpirunOptions(4, ("--overcommit",))
    assert SlurmOptions() != MpirunOptions()  # the same values, two engines
    with pytest.raises(LaunchError, match="^--nodes works with --launcher slurm only"):
        mpirun_options(VALUES, launch)
    assert type(engines.start(SlurmOptions(), launch, sys.stderr, {})) is slurm.SlurmBackend
    assert type(engines.start(MpirunOptions(), launch, sys.stderr, {})) is mpirun.MpirunBackend


def test_mpirun_chooses_no_hosts():
    """mpirun takes its hosts from its own arguments: no pool, no recheck."""
    from jaxrun.core.backend import Ask

    launch = plan.LaunchOptions(target=plan.Target("t.py"), num_processes=2, coordinator="", run_id="r")
    backend = engines.start(MpirunOptions(), launch, sys.stderr, {})
    hosts = (plan.Host("a", slots=2),)
    assert backend.place(Ask(hosts, 2)).hosts == hosts
    with pytest.raises(NotImplementedError):
        backend.place(Ask(hosts, 2, recheck=True))
    with pytest.raises(NotImplementedError):
        backend.pool()


def test_srun_exports_everything_and_passes_the_cpus_per_task_unless_told():
    options = SlurmOptions()
    inside = {"SLURM_CPUS_PER_TASK": "6", "SLURM_EXPORT_ENV": "NONE"}
    assert slurm.srun_command(options, 2, ["agent"], env=inside)[3:] == ["--export=ALL", "--cpus-per-task=6", "agent"]
    mine = SlurmOptions(scheduler_args=("--export=ALL,FOO=1", "-c2"))
    assert slurm.srun_command(mine, 2, ["agent"], env=inside)[3:] == ["--export=ALL,FOO=1", "-c2", "agent"]
