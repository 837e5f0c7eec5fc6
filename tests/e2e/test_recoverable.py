"""Recoverable jobs (docs/restarts.md, "Fault-tolerant JAX programs"): when
every process enabled ``jax_enable_recoverability``, a failed process other
than 0 leaves the others running and, with restarts, starts again alone; a
dead process 0 still ends everyone; ``--no-recoverable`` keeps fail-fast.

Real 3-process JAX jobs of ``examples/recoverable.py`` (JAX's pattern without
collectives), whose ``--crash P`` SIGKILLs process P in its first run. The four
cases run side by side, locally (with the preloading server under CPU load;
without it, the two whose start differs), and over SSH (process 2 on hostB,
whose host agent starts it again, and on a host that refuses channels, its
session agent); the plain launch, restarted by hand, does the same; Slurm, Open
MPI and Ray keep the survivors and restart whole jobs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from fixtures.jobs import ROOT, TOKEN, overload
from fixtures.sshd import free_port

EXAMPLE = ROOT / "examples" / "recoverable.py"
SHORT = ("--steps", 6, "--step-seconds", 0.2)  # 1.2 s of steps: process 2 dies at 0.4 s
# 10 s of steps: the others are still at work when process 2 dies at 0.4 s,
# so a stop, and nothing else, ends them.
LONG = ("--steps", 50, "--step-seconds", 0.2)
CASES = {
    # name: (jaxrun's flags, the example's)
    "restarts": (("--max-restarts", 1, "--junit-xml", "{tmp}/restarts.xml"), ("--crash", 2, *SHORT)),
    "no restarts": ((), ("--crash", 2, "--wait", 2, *SHORT)),
    "process 0": (("--max-restarts", 0), ("--crash", 0, *SHORT)),
    "fail fast": (("--no-recoverable",), ("--crash", 2, *LONG)),
}
OTHERS_GO_ON = "the others go on (the job is recoverable: every process enabled jax_enable_recoverability)"


def start_cases(start, tmp_path, script, *where, cases=tuple(CASES), **kw) -> dict:
    jobs = {}
    for name in cases:
        flags, script_args = CASES[name]
        flags = [str(f).format(tmp=tmp_path) for f in flags]
        jobs[name] = start(*where, "--cpu-devices", 1, *flags, "--log-dir", tmp_path / name.replace(" ", "-"),
                           "--report", tmp_path / f"{name}.json", script, *script_args, **kw)
    return jobs


def report(tmp_path, name: str) -> dict:
    return json.loads((tmp_path / f"{name}.json").read_text())


def check_cases(jobs: dict, tmp_path, two: str = "process 2") -> None:
    """``two``: how the console names process 2 ("process 2 on hostB")."""
    codes = {name: job.wait(timeout=150) for name, job in jobs.items()}
    check_restarts(jobs["restarts"], codes["restarts"], tmp_path, two)
    check_no_restarts(jobs["no restarts"], codes["no restarts"], tmp_path, two)
    if "process 0" in jobs:
        check_process_0(jobs["process 0"], codes["process 0"], tmp_path)
        check_fail_fast(jobs["fail fast"], codes["fail fast"], tmp_path)


def check_restarts(job, code: int, tmp_path, two: str) -> None:
    """Process 2 dies, restarts allowed: 0 and 1 run once and finish; 2 runs twice, rejoins, finishes."""
    assert code == 0, job.stderr
    assert f"{two} failed (killed by SIGKILL); {OTHERS_GO_ON}; starting process 2 again alone " \
           "(restart 1 of 1)" in job.stderr, job.stderr
    found = report(tmp_path, "restarts")
    assert found["restarts"] == 0 and len(found["attempts"]) == 1, found  # no whole-job restart
    assert found["attempts"][0]["recoverable"] is True
    runs = {p["process_id"]: p["lives"] for p in found["processes"]}
    assert [len(runs[r]) for r in (0, 1, 2)] == [1, 1, 2], runs
    assert [p["pid"] for p in found["processes"][:2]] == [runs[0][0]["pid"], runs[1][0]["pid"]]
    first, second = runs[2]
    assert first["signal"] == "SIGKILL" and first["verdict"] == "failed, started again alone", first
    assert second["exit_code"] == 0 and second["pid"] != first["pid"], second
    assert second["started_at"] >= first["ended_at"]
    # Each life that ran its script to the end said so before it ended; the killed one never did.
    for life in (runs[0][0], runs[1][0], second):
        assert life["started_at"] < life["finished_at"] <= life["ended_at"], life
    assert first["finished_at"] is None, first
    rerun = open(second["stdout_log"]).read()
    assert "process 2 run 1 joined: 3 devices" in rerun and "process 2 done" in rerun, rerun
    for rank in (0, 1):
        assert f"process {rank} done" in job.stdout, job.stdout
    assert f"{two} started again alone once: life 1 (pid" in job.stderr
    junit = (tmp_path / "restarts.xml").read_text()
    assert junit.count("<testcase ") == 3 and 'failures="0"' in junit, junit
    assert "life 1 of 2 (pid" in junit and "killed by SIGKILL; started again alone" in junit, junit
    logs = subprocess.run([sys.executable, "-m", "jaxrun", "logs", "--log-dir", tmp_path, "restarts", "--ranks", "2"],
                          capture_output=True, text=True, timeout=60)
    assert "process 2 run 0 joined" in logs.stdout and "process 2, life 2 (started again alone):" in logs.stdout
    assert logs.stdout.index("process 2, life 2") < logs.stdout.index("process 2 run 1 joined"), logs.stdout



def check_no_restarts(job, code: int, tmp_path, two: str) -> None:
    """Process 2 dies, no restarts: 0 and 1 finish; the status and the summary name process 2."""
    assert code == 137, job.stderr
    assert f"{two} failed (killed by SIGKILL); {OTHERS_GO_ON}\n" in job.stderr, job.stderr
    assert f"{two} failed first: killed by SIGKILL" in job.stderr, job.stderr
    found = report(tmp_path, "no restarts")
    assert [p["verdict"] for p in found["processes"]] == ["ok", "ok", "failed first"], found["processes"]
    assert found["root_cause"]["process_id"] == 2 and len(found["attempts"]) == 1
    assert "process 0 done" in job.stdout and "process 1 done" in job.stdout



def check_process_0(job, code: int, tmp_path) -> None:
    """Process 0 dies: every process ends within seconds of it."""
    assert code == 137, job.stderr
    found = report(tmp_path, "process 0")
    assert found["root_cause"]["process_id"] == 0, found["root_cause"]
    ends = [p["ended_at"] for p in found["processes"]]
    assert max(ends) - ends[0] < 5, ends
    assert "the others go on" not in job.stderr



def check_fail_fast(job, code: int, tmp_path) -> None:
    """--no-recoverable: fail-fast, as for any job: the others, still at
    work, are stopped at once."""
    assert code == 137, job.stderr
    found = report(tmp_path, "fail fast")
    assert found["root_cause"]["process_id"] == 2 and found["attempts"][0]["recoverable"] is False
    assert [p["verdict"] for p in found["processes"]] == ["stopped by jaxrun", "stopped by jaxrun", "failed first"], \
        found["processes"]
    assert "the others go on" not in job.stderr and " done: " not in job.stdout, job.stdout


# The guide's plain launch, with the restart by hand: each process a background
# python whose initialize() gets the coordinator, count and id (the example
# leaves them to its launcher).
PLAIN = ("import functools, runpy, sys, jax; jax.distributed.initialize = "
         "functools.partial(jax.distributed.initialize, sys.argv[1], 3, int(sys.argv[2])); "
         "sys.argv = [sys.argv[3], *sys.argv[4:]]; runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.mark.timeout(120)
def test_the_plain_launch_behaves_alike(tmp_path):
    """What jaxrun does for the script is what its user would do by hand:
    the survivors keep their processes, and process 2 started again with its
    id rejoins and finishes."""
    coordinator = f"127.0.0.1:{free_port('127.0.0.1')}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXRUN_") or k == TOKEN}
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))

    def start(rank: int, run: int) -> subprocess.Popen:
        out = open(tmp_path / f"process-{rank}.run-{run}.out", "wb")
        with out:
            return subprocess.Popen([sys.executable, "-c", PLAIN, coordinator, str(rank), str(EXAMPLE), "--crash", "2",
                                     *map(str, SHORT)],
                                    env={**env, "JAXRUN_PROCESS_RESTARTS": str(run)}, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    procs = [start(rank, 0) for rank in range(3)]
    try:
        assert procs[2].wait(timeout=60) == -9  # the example's fault
        assert procs[0].poll() is None and procs[1].poll() is None  # nobody else stopped
        procs.append(start(2, 1))
        assert [p.wait(timeout=60) for p in (procs[0], procs[1], procs[3])] == [0, 0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    outputs = {name.name: name.read_text() for name in tmp_path.glob("*.out")}
    assert "process 2 run 1 joined: 3 devices" in outputs["process-2.run-1.out"], outputs
    for rank, run in ((0, 0), (1, 0), (2, 1)):
        assert f"process {rank} done: total 3012000" in outputs[f"process-{rank}.run-{run}.out"], outputs


@pytest.mark.both_modes  # the replacement is forked by the preloading server, or a fresh interpreter
@pytest.mark.timeout(250)
def test_a_failed_process_restarts_alone_and_the_others_go_on(launch, launch_mode, tmp_path):
    # How a process starts matters to the first two; the others are the same after the start.
    # Every case runs with the preloading server (the default), and with a busy loop per core
    # besides: a shared CI machine is always loaded, and load only makes each case harder.
    if launch_mode == "preload":
        with overload():
            check_cases(start_cases(launch, tmp_path, EXAMPLE, "-n", 3), tmp_path)
    else:
        check_cases(start_cases(launch, tmp_path, EXAMPLE, "-n", 3, cases=("restarts", "no restarts")), tmp_path)


@pytest.mark.timeout(200)
def test_over_ssh_the_host_agent_starts_it_again(sshd_hosts, start_job, tmp_path, shared_dir):
    script = shared_dir / "recoverable.py"
    shutil.copy(EXAMPLE, script)
    jobs = start_cases(start_job, tmp_path, script, "-H", "hostA,hostB:2", "--ssh-config", sshd_hosts.config,
                       "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN, cwd=shared_dir)
    check_cases(jobs, tmp_path, "process 2 on hostB")
    found = report(tmp_path, "restarts")
    assert [p["host"] for p in found["processes"]] == ["hostA", "hostB", "hostB"], found["processes"]


@pytest.mark.timeout(150)
def test_where_a_host_refuses_channels_its_session_agent_starts_it_again(sshd_hosts_without_forwarding, start_job,
                                                                         tmp_path, shared_dir):
    script = shared_dir / "recoverable.py"
    shutil.copy(EXAMPLE, script)
    jobs = start_cases(start_job, tmp_path, script, "-H", "hostC,hostD:2", "--ssh-config",
                       sshd_hosts_without_forwarding.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN,
                       cases=("restarts", "no restarts"), cwd=shared_dir)
    check_cases(jobs, tmp_path, "process 2 on hostD")

# Engines that start an attempt's processes as one gang: a recoverable job
# says so, keeps the survivors running, and restarts whole jobs only.
# (id, jaxrun's flags given the engine's fixture, that fixture, a program it needs, environment)
GANGS = [
    ("slurm", lambda _: ["--launcher", "slurm"], "slurm_cluster", "srun", {}),
    ("mpirun", lambda _: ["--launcher", "mpirun"], None, "mpirun", {"OMPI_MCA_rmaps_base_oversubscribe": "1"}),
    ("ray", lambda cluster: ["--launcher", "ray", "--ray-address", cluster.address], "ray_cluster", None,
     {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}),
]


@pytest.mark.parametrize("gang", GANGS, ids=[g[0] for g in GANGS])
@pytest.mark.timeout(200)
def test_a_gang_keeps_the_survivors_and_restarts_whole_jobs(gang, request, start_job, tmp_path, shared_dir):
    name, flags, fixture, program, env = gang
    if program and not shutil.which(program):
        pytest.skip(f"{program} is not installed")
    engine = request.getfixturevalue(fixture) if fixture else None
    script = shared_dir / "recoverable.py"
    shutil.copy(EXAMPLE, script)
    job = start_job(*flags(engine), "-n", 3, "--cpu-devices", 1, "--max-restarts", 1, "--log-dir", tmp_path / "logs",
                    "--report", tmp_path / "report.json", script, "--crash", 2, "--wait", 1, *SHORT, cwd=shared_dir,
                    env=env)
    assert job.wait(timeout=180) == 137, job.stderr
    title = {"slurm": "Slurm", "mpirun": "Open MPI's mpirun", "ray": "Ray"}[name]
    gang_line = (f"jaxrun: the job is recoverable: every process enabled jax_enable_recoverability; {title} starts "
                 "the processes as one gang and cannot start one of them again: a process other than 0 that fails "
                 "leaves the others running, and --max-restarts restarts only whole jobs")
    assert job.stderr.count(gang_line) == 2, job.stderr  # once in each attempt
    failed = re.findall(rf"process 2( on \S+)? failed \(killed by SIGKILL\); {re.escape(OTHERS_GO_ON)}\n", job.stderr)
    assert len(failed) == 2, job.stderr
    assert "jaxrun: restarting the whole job (restart 1 of 1)" in job.stderr
    found = json.loads((tmp_path / "report.json").read_text())
    assert len(found["attempts"]) == 2, found
    for attempt in found["attempts"]:
        assert attempt["recoverable"] is True and attempt["root_cause"]["process_id"] == 2, attempt
        assert [p["verdict"] for p in attempt["processes"]] == ["ok", "ok", "failed first"], attempt["processes"]
        assert [len(p["lives"]) for p in attempt["processes"]] == [1, 1, 1]
        # The task agents passed on that the survivors' scripts returned; the killed one's never did.
        assert [p["finished_at"] is not None for p in attempt["processes"]] == [True, True, False], attempt
    # The survivors finished in each attempt: the engine's own fail-fast left them be.
    assert job.stdout.count("process 0 done") == 2 and job.stdout.count("process 1 done") == 2, job.stdout
