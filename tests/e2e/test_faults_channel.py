"""Faults planted in the Slurm/MPI backends, with real srun and mpirun steps.

The task channel faces the network: during a real Slurm run it takes a flood
of connections, a client that sends its header one byte a second, headers
that are not ASCII, and a launcher that runs out of file descriptors, and the
run still completes with every byte in its logs.  A Slurm step that waits in
the queue is withdrawn when jaxrun gets SIGTERM.  A launcher thread of the
scheduler backend that dies ends the run, named, instead of hanging it.

Each test checks the bound it ends within, the exit status, the console, the
logs where they could be written, and (through the leak guard, and
``squeue``) that nothing is left.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from fixtures.engines import BYTES_PROBE, bytes_payload
from fixtures.jobs import ROOT, still_running

from jaxrun import contract
from jaxrun.backends.scheduler.options import SlurmOptions
from jaxrun.backends.scheduler.slurm import SrunProcess
from jaxrun.core.backend import RunHooks
from jaxrun.core.logfiles import log_paths
from jaxrun.wire import tasks

SLURM = ["--launcher", "slurm"]
FLOOD = 2000  # connections
BYTES = 1 << 20  # per process and stream, as the bytes probe writes them
HEADER_TIMEOUT = 10.0  # the channel's one deadline for a whole header

# Each rank says it started (its three channel connections are attached by
# then), waits for the test's go, then writes the bytes probe's payload.
GATED_PROBE = """\
import os, runpy, sys, time
rank, size, folder = sys.argv[1], sys.argv[2], sys.argv[3]
open(os.path.join(folder, "started-" + rank), "w").close()
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.05)
sys.argv = [{probe!r}, rank, size]
runpy.run_path({probe!r}, run_name="__main__")
"""

# The task agent starts a few seconds late, so that the channel is flooded
# while the tasks connect; the controllers themselves start at once.
SLOW_AGENT = """\
#!/bin/sh
case "$*" in *{agent}*) sleep {delay} ;; esac
exec {python} "$@"
"""


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def slow_python(folder: Path, delay: float) -> Path:
    return write(folder / "slowpython", SLOW_AGENT.format(agent=contract.SCHEDULER_AGENT_MODULE, delay=delay,
                                                          python=sys.executable), 0o755)


def wait_for(what, within: float, step: float = 0.05):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(step)
    return what()


def engine_process(job) -> psutil.Process | None:
    """The srun or mpirun jaxrun started (our own child, in its own session)."""
    try:
        for child in psutil.Process(job.proc.pid).children():
            if child.name() in ("srun", "mpirun"):
                return child
    except psutil.Error:
        pass
    return None


def channel_of(job) -> tuple[tuple[str, int], str]:
    """(the address jaxrun listens on, the address it told the tasks)."""

    def found():
        engine = engine_process(job)
        if engine is None:
            return None
        try:
            told = engine.environ().get(contract.TASK_CHANNEL)
            listening = [c.laddr for c in psutil.Process(job.proc.pid).net_connections(kind="tcp")
                         if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            return None
        return (listening[0], told) if told and listening else None

    result = wait_for(found, within=20)
    assert result, "jaxrun started no step with a task channel"
    (ip, port), told = result
    return (ip, port), told


def squeue_jobs(env: dict) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split("\n") if out.stdout.strip() else []


def check_bytes(logs: Path, ranks: int) -> None:
    for rank in range(ranks):
        for stream, want in zip(("stdout", "stderr"), bytes_payload(rank, BYTES)):
            got = (logs / f"process-{rank}.{stream}").read_bytes()
            assert (len(got), hashlib.sha256(got).hexdigest()) == (len(want), hashlib.sha256(want).hexdigest()), \
                (rank, stream)


# -- the hostile clients ---------------------------------------------------------
class Flood(threading.Thread):
    """``count`` connections as fast as they go: some silent, some with junk,
    some with a well-formed Hello and a wrong secret.  Up to ``hold`` stay
    open at once; the others are closed as new ones are made."""

    def __init__(self, address: tuple[str, int], count: int, hold: int = 200, silent_only: bool = False,
                 pace: float = 0.0):
        super().__init__(daemon=True)
        self.address, self.count, self.hold, self.silent_only = address, count, hold, silent_only
        self.pace = pace  # seconds between two connections, while the channel listens
        self.outcomes: collections.Counter = collections.Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        held: collections.deque = collections.deque()
        junk = [b"", b"GET / HTTP/1.0\r\n\r\n", b'hello ["0000",0,"ctrl"]\n', os.urandom(600)]
        try:
            for i in range(self.count):
                # Once refused, the channel has stopped listening (every task
                # attached): the rest are refused at once, and only counted.
                if self.stop.wait(self.pace) if self.pace and not self.outcomes["refused"] else self.stop.is_set():
                    break
                try:
                    sock = socket.create_connection(self.address, timeout=2)
                except ConnectionRefusedError:
                    self.outcomes["refused"] += 1
                    continue
                except OSError:
                    self.outcomes["failed"] += 1
                    continue
                self.outcomes["connected"] += 1
                data = b"" if self.silent_only else junk[i % len(junk)]
                try:
                    if data:
                        sock.sendall(data)
                except OSError:
                    pass
                held.append(sock)
                while len(held) > self.hold:
                    held.popleft().close()
        finally:
            for sock in held:
                sock.close()


class SlowClient(threading.Thread):
    """Sends a Hello one byte a second; notes when the server cut it off."""

    def __init__(self, address: tuple[str, int]):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(address, timeout=2)
        self.connected_at = time.monotonic()
        self.cut_after: float | None = None

    def run(self) -> None:
        line = b'hello ["' + b"f" * 32 + b'",0,"ctrl"]\n'
        try:
            for byte in line:
                self.sock.sendall(bytes([byte]))
                self.sock.settimeout(1.0)
                try:
                    if self.sock.recv(1) == b"":
                        break
                except TimeoutError:
                    continue
        except OSError:
            pass
        finally:
            self.cut_after = time.monotonic() - self.connected_at
            self.sock.close()


def closed_by_server(address: tuple[str, int], data: bytes, within: float = 3.0) -> bool:
    """Send ``data`` and see the server close the connection within ``within`` s."""
    with socket.create_connection(address, timeout=within) as sock:
        sock.sendall(data)
        try:
            return sock.recv(64) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def refused(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


# -- the tests ---------------------------------------------------------------------
@pytest.mark.timeout(150)
def test_channel_survives_flood_slow_client_and_non_ascii_headers(slurm_cluster, start_job, tmp_path):
    """The task agents start HEADER_TIMEOUT + 4 s late: the slow client meets
    the header deadline while no task has attached, and the flood, spread
    over that time, is still going when the tasks connect."""
    logs = tmp_path / "logs"
    script = write(tmp_path / "gated.py", GATED_PROBE.format(probe=str(BYTES_PROBE)))
    job = start_job(*SLURM, "-n", 2, "--log-dir", logs, "--python", slow_python(tmp_path, HEADER_TIMEOUT + 4),
                    script, "{process_id}", BYTES, tmp_path)
    address, told = channel_of(job)
    # The one address the tasks were told, never a wildcard.
    assert address[0] not in ("0.0.0.0", "::"), address
    assert told == contract.join_address(*address), (told, address)

    # Not ASCII, not UTF-8, a lone surrogate escape: each is closed, none crashes anything.
    for header in ('hello ["s\u00e9cr\u00e8t",0,"ctrl"]\n'.encode(), b"hello [\"\xff\xfe\",0,\"stdout\"]\n",
                   b'hello ["\\ud800",0,"stderr"]\n', "\u65e5\u672c\n".encode("utf-16")):
        assert closed_by_server(address, header), header
    slow = SlowClient(address)
    slow.start()
    flood = Flood(address, FLOOD, pace=(HEADER_TIMEOUT + 4) / FLOOD)
    flood.start()

    # One deadline for the whole header: cut off after HEADER_TIMEOUT, though
    # a byte came every second, and before any task attached.
    slow.join(HEADER_TIMEOUT + 5)
    assert slow.cut_after is not None and slow.cut_after < HEADER_TIMEOUT + 2, slow.cut_after
    assert not any((tmp_path / f"started-{r}").exists() for r in range(2))
    assert job.proc.poll() is None

    started = wait_for(lambda: all((tmp_path / f"started-{r}").exists() for r in range(2)), within=60)
    assert started, "the tasks never started"
    # Every rank attached: the channel stops listening.
    assert wait_for(lambda: refused(address), within=3, step=0.1), "the channel still listens after every rank attached"
    flood.join(60)
    assert not flood.is_alive()
    assert sum(flood.outcomes.values()) == FLOOD, flood.outcomes
    assert flood.outcomes["connected"] >= FLOOD // 2, flood.outcomes  # most of it met an open channel

    (tmp_path / "go").touch()
    code = job.wait(timeout=60)
    assert code == 0, job.stderr[-3000:]
    check_bytes(logs, 2)
    assert "Traceback" not in job.stderr, job.stderr[-3000:]
    print(f"flood outcomes: {dict(flood.outcomes)}; slow client cut after {slow.cut_after:.1f} s")


@pytest.mark.timeout(150)
def test_channel_survives_running_out_of_file_descriptors(slurm_cluster, start_job, tmp_path):
    """jaxrun's descriptor limit is lowered after srun started, and a silent
    flood fills what is left: accepting must go on (the stranger that waited
    longest makes room), and the tasks must still get in."""
    logs = tmp_path / "logs"
    script = write(tmp_path / "gated.py", GATED_PROBE.format(probe=str(BYTES_PROBE)))
    job = start_job(*SLURM, "-n", 2, "--log-dir", logs, "--python", slow_python(tmp_path, 3),
                    script, "{process_id}", BYTES, tmp_path)
    address, _ = channel_of(job)
    launcher = psutil.Process(job.proc.pid)
    # srun runs before the launcher has opened its logs (each rank's two and
    # engine.log): on a loaded machine a count taken here left them no room.
    holds = {str(logs / "engine.log"), *(path for r in range(2) for path in log_paths(str(logs), r)[:2])}
    assert wait_for(lambda: holds <= {f.path for f in launcher.open_files()}, within=20), launcher.open_files()
    in_use = launcher.num_fds()
    _, hard = launcher.rlimit(psutil.RLIMIT_NOFILE)
    launcher.rlimit(psutil.RLIMIT_NOFILE, (in_use + 12, hard))  # room for the 6 task connections, and a few more
    flood = Flood(address, 600, hold=600, silent_only=True)
    flood.start()
    started = wait_for(lambda: all((tmp_path / f"started-{r}").exists() for r in range(2)), within=60)
    flood.stop.set()
    flood.join(30)
    assert started, "the tasks never got in"
    assert flood.outcomes["connected"] > 12, flood.outcomes  # more strangers than descriptors: EMFILE was hit
    launcher.rlimit(psutil.RLIMIT_NOFILE, (max(in_use + 256, 1024), hard))  # the end of the run opens files again
    (tmp_path / "go").touch()
    code = job.wait(timeout=60)
    assert code == 0, job.stderr[-3000:]
    check_bytes(logs, 2)
    assert "Traceback" not in job.stderr, job.stderr[-3000:]


@pytest.mark.timeout(60)
def test_sigterm_withdraws_a_step_slurm_still_queues(slurm_cluster, start_job, tmp_path):
    """The throwaway cluster has one node: a step that asks for two waits in
    the queue.  SIGTERM ends jaxrun within seconds (not after --grace), 143,
    and the queued job is gone."""
    script = write(tmp_path / "never.py", "raise SystemExit('this step should never run')\n")
    job = start_job(*SLURM, "-n", 2, "--nodes", 2, "--log-dir", tmp_path / "logs", script)
    queued = wait_for(lambda: [line for line in squeue_jobs(slurm_cluster) if "PENDING" in line], within=20)
    assert queued, f"the step did not queue: {squeue_jobs(slurm_cluster)}"
    job.proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    code = job.wait(timeout=30)
    elapsed = time.monotonic() - start
    assert code == 143, job.stderr[-3000:]
    assert elapsed < 5, f"jaxrun took {elapsed:.1f} s to end after SIGTERM"
    assert wait_for(lambda: not squeue_jobs(slurm_cluster), within=5), squeue_jobs(slurm_cluster)
    assert "Traceback" not in job.stderr, job.stderr[-3000:]


@pytest.mark.timeout(60)
def test_timeout_withdraws_a_queued_step(slurm_cluster, start_job, tmp_path):
    """--timeout on a queued step: jaxrun's SIGKILL of ranks that never
    started goes through the same withdrawal; exit 124, nothing queued."""
    script = write(tmp_path / "never.py", "raise SystemExit('this step should never run')\n")
    job = start_job(*SLURM, "-n", 2, "--nodes", 2, "--timeout", 2, "--log-dir", tmp_path / "logs", script)
    code = job.wait(timeout=30)
    assert code == 124, job.stderr[-3000:]
    assert wait_for(lambda: not squeue_jobs(slurm_cluster), within=5), squeue_jobs(slurm_cluster)


# What an injected fault raises (core.backend.start_thread).
INJECTED = f"fault injected by {contract.INJECT_THREAD_FAULT}"
# Every thread the scheduler backend starts, by the name the fault injection matches.
SCHEDULER_THREADS = ["task-channel", "step-watcher", f"rank-0-{tasks.CONTROL}", f"rank-1-{tasks.STDOUT}",
                     f"rank-0-{tasks.STDERR}"]


# The Slurm test cluster's 8 CPUs: four 2-process jobs at once, the fifth
# when one has ended (a queued step would count its wait against the bound).
SIDE_BY_SIDE = 4


@pytest.mark.timeout(90)
@pytest.mark.parametrize("scheduler", ["slurm", "mpirun"])
def test_a_dead_backend_thread_ends_the_run_and_is_named(request, scheduler, start_job, tmp_path, monkeypatch):
    """One job per thread of the backend, each with that thread's fault
    injected, side by side (each its own jaxrun with its own folder, and
    each timed from its own start): most of a job is waiting."""
    if scheduler == "slurm":
        env = request.getfixturevalue("slurm_cluster")
        assert env
    elif not shutil.which("mpirun"):
        pytest.skip("Open MPI is not installed (apt-get install openmpi-bin)")
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")
    script = write(tmp_path / "sleepy.py", "import time\nprint('up', flush=True)\ntime.sleep(30)\n")

    def run(thread: str) -> tuple[int, float, str]:
        job = start_job("--launcher", scheduler, "-n", 2, "--log-dir", tmp_path / f"logs-{thread}", script,
                        env={contract.INJECT_THREAD_FAULT: thread})
        start = time.monotonic()
        code = job.wait(timeout=40)
        return code, time.monotonic() - start, job.stderr

    with concurrent.futures.ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        ended = dict(zip(SCHEDULER_THREADS, pool.map(run, SCHEDULER_THREADS)))
    for thread, (code, elapsed, stderr) in ended.items():
        print(f"{scheduler} {thread}: exit {code} after {elapsed:.1f} s")
        assert code == 70, (thread, stderr[-3000:])  # EX_SOFTWARE: jaxrun failed, not the job
        assert elapsed < 30, f"{thread}: took {elapsed:.1f} s"
        died = f"jaxrun: internal error: thread {thread} died: RuntimeError: {INJECTED}"
        assert died in stderr.splitlines(), (thread, stderr[-3000:])
    if scheduler == "slurm":  # no job outlives the run (its tasks would sleep on into the next test)
        assert wait_for(lambda: not squeue_jobs(env), within=10), squeue_jobs(env)


@pytest.mark.timeout(60)
def test_step_kill_and_close_leave_nothing_queued(slurm_cluster, tmp_path):
    """The backend's own ends, driven directly: close() on a queued step and
    abort() both withdraw the job.  abort() is the watchdog's, which SIGKILLs
    every process left right after it: it must return within about a second,
    and the job must be gone even so."""
    probe = tmp_path / "drive.py"
    probe.write_text(DRIVE_STEP)
    for how in ("close", "abort"):
        proc = subprocess.run([sys.executable, str(probe), how, str(tmp_path / how)], capture_output=True,
                              text=True, timeout=40)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["queued"], result
        if how == "abort":
            assert result["seconds"] < 1.5, result
        assert wait_for(lambda: not squeue_jobs(slurm_cluster), within=5), (how, squeue_jobs(slurm_cluster))


# From srun's first milliseconds (its allocation, its step's launch) to a step
# that runs.  SIGKILLed at once, as jaxrun's srun was once a task had reached
# it, srun left its job RUNNING at nearly every one of these moments; on
# SIGTERM it hung at about one in 19 (see jaxrun.backends.scheduler.slurm).
STOP_MOMENTS = [i / 1000 for i in range(3, 42, 3)]


@pytest.mark.timeout(120)
def test_srun_stopped_at_any_moment_of_its_start_leaves_no_job(slurm_cluster):
    """``SrunProcess.stop`` with a task already reached, as when the first
    task has reached jaxrun and the second is still being launched, then the
    step watcher's reap and cleanup."""
    left = {}
    for moment in STOP_MOMENTS:
        srun = SrunProcess(SlurmOptions(), 2, ["sleep", "30"], None, slurm_cluster, sys.stderr,
                           job_name=f"jaxrun-test-{os.getpid()}")
        srun.start(slurm_cluster, RunHooks())
        try:
            time.sleep(moment)
            srun.stop(True, RunHooks())
            srun.popen.communicate(timeout=15)
        finally:
            srun.signal(signal.SIGKILL)
            srun.popen.wait()
        srun.cleanup()
        if not wait_for(lambda: not squeue_jobs(slurm_cluster), within=5):
            jobs = [line.split()[0] for line in squeue_jobs(slurm_cluster) if line.strip()]
            left[moment] = jobs
            subprocess.run(["scancel", *jobs], env=slurm_cluster, check=False)
            wait_for(lambda: not squeue_jobs(slurm_cluster), within=10)
    assert not left, f"jobs left behind, by the moment srun was stopped: {left}"


DRIVE_STEP = f"""\
import json, os, signal, subprocess, sys, time
sys.path.insert(0, {str(ROOT)!r})
from jaxrun.backends.scheduler.slurm import SlurmBackend
from jaxrun.launcher.setup import plan
from jaxrun.backends.scheduler.options import SlurmOptions
from jaxrun.core.backend import NO_NEWS

how, log_dir = sys.argv[1], sys.argv[2]
options = SlurmOptions(nodes=2)
launch = plan.LaunchOptions(target=plan.Target("never.py"), num_processes=2, coordinator="", run_id="t", scheduled=True)
backend = SlurmBackend(options, launch, sys.stderr)
backend.choose_coordinator(None)
specs = plan.plan(launch)
backend.begin_attempt(specs, log_dir)
for spec in specs:
    backend.spawn(spec, -1, {{}}, None, NO_NEWS)
step = backend.step.process
deadline = time.monotonic() + 20
while step.queued_job is None and time.monotonic() < deadline:
    time.sleep(0.05)
queued = step.queued_job
start = time.monotonic()
if how == "close":
    backend.end_attempt()
else:
    backend.abort()
seconds = time.monotonic() - start
if how == "abort":
    try:
        os.killpg(step.popen.pid, signal.SIGKILL)  # what the watchdog does next
    except ProcessLookupError:
        pass
    step.popen.wait(10)
print(json.dumps({{"queued": queued, "seconds": seconds}}))
"""


DAEMON = """\
import glob, os, subprocess, sys, time
# A daemon: its own session, its parent gone at once (a double fork).  The
# task ends only once its daemon has said its pid: a task that ended first
# could see its daemon ended before it wrote (a loaded machine, 1 suite run).
subprocess.Popen([sys.executable, "-c", "import os, sys, time\\nif os.fork(): os._exit(0)\\n"
                  "open(os.environ['PIDS'] + '/' + sys.argv[1] + '-' + str(os.getpid()), 'w').close()\\n"
                  "time.sleep(120)", str(os.getpid())],
                 start_new_session=True).wait()
while not glob.glob(os.path.join(os.environ["PIDS"], f"{os.getpid()}-*")):
    time.sleep(0.02)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheduler", ["slurm", "mpirun"])
def test_daemons_a_task_starts_end_with_it(request, scheduler, start_job, tmp_path, monkeypatch):
    if scheduler == "slurm":
        request.getfixturevalue("slurm_cluster")
    elif not shutil.which("mpirun"):
        pytest.skip("Open MPI is not installed (apt-get install openmpi-bin)")
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")
    pids = tmp_path / "pids"
    pids.mkdir()
    script = write(tmp_path / "daemon.py", DAEMON)
    job = start_job("--launcher", scheduler, "-n", 2, "--log-dir", tmp_path / "logs", script, env={"PIDS": str(pids)})
    assert job.wait(timeout=40) == 0, job.stderr[-3000:]
    started = [int(p.name.split("-")[1]) for p in pids.iterdir()]
    assert len(started) == 2, started
    assert wait_for(lambda: not still_running(started), within=5), still_running(started)
