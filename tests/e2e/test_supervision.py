"""Failure handling with real JAX processes: fail fast, signals, orphans, hangs, restarts."""

import hashlib
import json
import os
import re
import signal
import textwrap
import time

import psutil
import pytest
from fixtures.jobs import check_resources, is_running, wait_gone

pytestmark = pytest.mark.timeout(90)

# Every process builds a cross-process array; `collective()` then blocks until
# all processes take part.
PRELUDE = textwrap.dedent(
    """\
    import os, sys, time, signal, subprocess
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    RANK = jax.process_index()
    mesh = jax.make_mesh((jax.device_count(),), ("i",))
    x = jax.device_put(np.arange(jax.device_count() * 4.0), NamedSharding(mesh, P("i")))
    STATE = os.environ["STATE_DIR"]
    def mark(name, text=""):
        with open(os.path.join(STATE, f"{name}-{RANK}"), "w") as f:
            f.write(str(text))
    def collective():
        return float(jnp.sum(x))
    """
)


@pytest.fixture
def job_script(tmp_path):
    state = tmp_path / "state"
    state.mkdir()

    def make(body: str, name="job.py"):
        path = tmp_path / name
        path.write_text(PRELUDE + textwrap.dedent(body))
        return path

    make.state = state
    make.env = {"STATE_DIR": str(state)}
    return make


def wait_for_files(folder, prefix, count, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(p for p in os.listdir(folder) if p.startswith(prefix))
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"only {os.listdir(folder)} appeared in {folder}")


# One mode: how jaxrun hears an exit differs by launch path (its own waiter,
# the fork server's reports), and test_matrix.py's exit cells time fail-fast
# and name the root cause on both (local, preload), as its sigterm cells check
# each process's resources from either reaper; what this adds (verdicts,
# the memory line, the survivors' stack dumps) is the same in both.
def test_fail_fast_when_a_process_exits_after_the_mesh(jaxrun, job_script, tmp_path):
    script = job_script(
        """
        if RANK == 3:
            time.sleep(1.0)
            mark("exit", repr(time.time()))
            os._exit(7)
        collective()
        """
    )
    report = tmp_path / "report.json"
    code, out, err = jaxrun("-n", 4, "--cpu-devices", 2, "--report", report, script, env=job_script.env)
    died = float((job_script.state / "exit-3").read_text())
    assert code == 7, err
    data = json.loads(report.read_text())
    # Without fail-fast the others wait for JAX's heartbeat timeout (100 s).
    # Timed on jaxrun's record (the report's last ended_at), the stop takes
    # about 0.1 s (bench/failfast.py measures it); 15 s holds any loaded machine.
    ended = max(p["ended_at"] for p in data["processes"])
    assert ended - died < 15.0, f"the attempt ended {ended - died:.2f}s after the failure"
    assert "process 3 failed first: exit code 7" in err
    assert data["root_cause"]["process_id"] == 3 and data["exit_code"] == 7
    verdicts = {p["process_id"]: p["verdict"] for p in data["processes"]}
    assert verdicts == {0: "stopped by jaxrun", 1: "stopped by jaxrun", 2: "stopped by jaxrun", 3: "failed first"}
    for p in data["processes"]:
        assert p["pid"] and p["started_at"] <= p["ended_at"] and os.path.exists(p["stderr_log"])
    check_resources(report, 4)  # also of those that jaxrun killed
    assert re.search(r"jaxrun: peak memory \d+\.\d MiB in process \d \(lowest \d+\.\d MiB\); "
                     r"\d+\.\d CPU seconds in all\n", err), err
    # Survivors were asked for a stack dump before they were killed.
    logs = [open(p["stderr_log"]).read() for p in data["processes"][:3]]
    assert all("Current thread" in log for log in logs)


@pytest.mark.both_modes
def test_uncaught_exception_ends_the_job_quickly_with_a_clean_traceback(jaxrun, job_script):
    script = job_script(
        """
        def load():
            raise ValueError("boom")
        if RANK == 1:
            time.sleep(0.5)
            load()
        collective()
        """
    )
    start = time.monotonic()
    code, out, err = jaxrun("-n", 4, "--cpu-devices", 2, script, env=job_script.env)
    assert code == 1
    # From the start, 4 JAX processes' start-up included: 3-4 s here; a job
    # that did not fail fast would wait for JAX's heartbeat timeout (100 s).
    assert time.monotonic() - start < 30
    assert "process 1 failed first: exit code 1" in err
    assert "ValueError: boom" in err
    assert f'File "{script}"' in err and "in load" in err
    assert "jaxrun/shim.py" not in err and "runpy" not in err


@pytest.mark.both_modes
def test_system_exit_code_is_kept(jaxrun, job_script):
    script = job_script(
        """
        if RANK == 0:
            sys.exit(5)
        collective()
        """
    )
    code, _, err = jaxrun("-n", 2, "--cpu-devices", 1, script, env=job_script.env)
    assert code == 5 and "process 0 failed first: exit code 5" in err


def test_child_killed_from_outside_is_reported_as_sigkill(launch, job_script):
    script = job_script(
        """
        mark("pid", os.getpid())
        collective() if RANK != 2 else time.sleep(60)
        """
    )
    job = launch("-n", 4, "--cpu-devices", 2, script, env=job_script.env)
    wait_for_files(job_script.state, "pid-", 4)
    os.kill(int((job_script.state / "pid-2").read_text()), signal.SIGKILL)
    assert job.wait(timeout=30) == 128 + 9
    assert "process 2 failed first: killed by SIGKILL" in job.stderr


def test_signal_to_jaxrun_is_forwarded_then_killed(launch, job_script, tmp_path, no_leftover_processes):
    # Each process notes every signal it receives and carries on, as a process
    # stuck in a collective would.  A Python handler alone would never run
    # while the main thread is blocked in XLA, but the wakeup fd is written by
    # the C-level handler at once, and a thread reads it.  The script runs after
    # the shim's initialize(), so these handlers replace JAX's SIGTERM handler.
    # One job per signal, side by side (each with its own state folder): most
    # of a job is its start-up and the grace.
    script = job_script(
        """
        import threading
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, lambda *_: None)
        def note_signals():
            got = []
            while True:
                got += [signal.Signals(b).name for b in os.read(wake_r, 64)]
                mark("got", " ".join(got))
        threading.Thread(target=note_signals, daemon=True).start()
        mark("ready")
        collective() if RANK != 0 else time.sleep(60)
        """
    )
    jobs = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        state = tmp_path / f"state-{signum.name}"
        state.mkdir()
        jobs[signum] = state, launch("-n", 4, "--cpu-devices", 2, "--grace", "2", script, env={"STATE_DIR": str(state)})
    for signum, (state, job) in jobs.items():
        wait_for_files(state, "ready-", 4)
        time.sleep(0.3)
        job.proc.send_signal(signum)
    for signum, (state, job) in jobs.items():
        name = signum.name
        assert job.wait(timeout=30) == 128 + signum, (name, job.stderr)
        assert f"jaxrun: received {name}; stopped every process" in job.stderr, job.stderr
        assert "jaxrun: processes 0, 1, 2, 3 stopped by jaxrun" in job.stderr, job.stderr
        assert "jaxrun: logs in " in job.stderr, job.stderr
        # Every process got jaxrun's signal before the SIGKILL that ended it.
        got = {r: (state / f"got-{r}").read_text() if (state / f"got-{r}").exists() else None for r in range(4)}
        assert got == {r: name for r in range(4)}
    assert wait_gone(no_leftover_processes, within=1.0) == []


def test_second_ctrl_c_kills_at_once(launch, job_script):
    script = job_script(
        """
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        mark("ready")
        time.sleep(60)
        """
    )
    job = launch("-n", 2, "--cpu-devices", 1, "--grace", "60", script, env=job_script.env)
    wait_for_files(job_script.state, "ready-", 2)
    job.proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    start = time.monotonic()
    job.proc.send_signal(signal.SIGINT)
    assert job.wait(timeout=30) == 130
    # At once, not after the 60 s grace: the kill and jaxrun's exit are a
    # fraction of a second of CPU, which 5 s holds on a loaded machine.
    assert time.monotonic() - start < 5


def test_process_ignoring_sigterm_is_killed_after_grace(launch, job_script, tmp_path):
    script = job_script(
        """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        mark("ready")
        time.sleep(60)
        """
    )
    report = tmp_path / "r.json"
    job = launch("-n", 2, "--cpu-devices", 1, "--grace", "1.5", "--report", report, script, env=job_script.env)
    wait_for_files(job_script.state, "ready-", 2)
    sent = time.time()
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(timeout=30) == 143
    processes = json.loads(report.read_text())["processes"]
    assert [p["signal"] for p in processes] == ["SIGKILL", "SIGKILL"]
    # On jaxrun's record: killed once the 1.5 s grace had passed, not before;
    # and not long after (10 s: the grace, and the kill slowed many times).
    ends = [p["ended_at"] - sent for p in processes]
    assert 1.4 < min(ends) and max(ends) < 10, ends


@pytest.mark.both_modes
def test_sigkill_to_jaxrun_leaves_no_child_or_grandchild(launch, job_script, no_leftover_processes):
    script = job_script(
        """
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        mark("grandchild", child.pid)
        time.sleep(300)
        """
    )
    job = launch("-n", 2, "--cpu-devices", 1, script, env=job_script.env)
    wait_for_files(job_script.state, "grandchild-", 2)
    # A process, not a pid: on a busy machine a dead grandchild's pid may be
    # someone else's by the time it is checked.
    grandchildren = [psutil.Process(int((job_script.state / f"grandchild-{r}").read_text())) for r in range(2)]
    job.proc.kill()
    job.proc.wait()
    assert wait_gone(no_leftover_processes, within=5.0) == []
    # A process on its way out no longer shows its environment, so the token
    # search above may pass it over: the grandchildren are awaited by name.
    deadline = time.monotonic() + 5.0
    while [g for g in grandchildren if is_running(g)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [g.pid for g in grandchildren if is_running(g)]


def test_sigusr1_dumps_stacks_without_stopping(launch, job_script, tmp_path):
    script = job_script(
        """
        mark("ready")
        while not os.path.exists(os.path.join(STATE, "go")):
            time.sleep(0.05)
        print("finished", collective())
        """
    )
    logs = tmp_path / "logs"
    job = launch("-n", 2, "--cpu-devices", 1, "--log-dir", logs, script, env=job_script.env)
    wait_for_files(job_script.state, "ready-", 2)
    job.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(
        "Current thread" in (logs / f"process-{r}.stderr").read_text() for r in range(2)
    ):
        time.sleep(0.1)
    (job_script.state / "go").write_text("")
    assert job.wait(timeout=30) == 0, job.stderr
    assert "[0] finished" in job.stdout and "[1] finished" in job.stdout
    assert all("Current thread" in (logs / f"process-{r}.stderr").read_text() for r in range(2))


@pytest.mark.both_modes
def test_max_restarts_restarts_the_whole_group(jaxrun, job_script, tmp_path):
    script = job_script(
        """
        attempt = int(os.environ["JAXRUN_RESTART_COUNT"])
        print("attempt", attempt, "coordinator", os.environ["JAXRUN_COORDINATOR_ADDRESS"])
        if attempt == 0 and RANK == 1:
            sys.exit(4)
        print("sum", collective())
        """
    )
    logs = tmp_path / "logs"
    code, out, err = jaxrun("-n", 2, "--cpu-devices", 1, "--max-restarts", "1", "--log-dir", logs, script,
                            env=job_script.env)
    assert code == 0, err
    assert "restarting the whole job (restart 1 of 1)" in err
    first = (logs / "process-0.stdout").read_text()
    second = (logs / "restart-1" / "process-0.stdout").read_text()
    assert "attempt 0" in first and "attempt 1" in second and "sum" in second
    port = lambda text: text.split("coordinator ")[1].split()[0]  # noqa: E731
    assert port(first) != port(second)


# Plain Python, once: each process writes into a pipe of its own in either
# mode (test_console.py, both modes), which the launcher moves into the logs.
@pytest.mark.plain_python
def test_every_byte_of_large_output_reaches_the_logs(jaxrun, tmp_path):
    script = tmp_path / "flood.py"
    script.write_text(
        textwrap.dedent(
            """
            import hashlib, os
            def flood(fd, total):
                digest = hashlib.sha256()
                left = total
                while left:
                    block = os.urandom(min(left, 1 << 20))
                    digest.update(block)
                    view = memoryview(block)
                    while view:
                        view = view[os.write(fd, view):]
                    left -= len(block)
                return digest.hexdigest()
            out, err = flood(1, 20 << 20), flood(2, 5 << 20)
            with open(os.environ["DIGESTS"] + os.environ["JAXRUN_PROCESS_ID"], "w") as f:
                f.write(out + " " + err)
            """
        )
    )
    logs = tmp_path / "logs"
    code, _, err = jaxrun("-n", 4, "--log-dir", logs, script, env={"DIGESTS": str(tmp_path / "digest-")}, timeout=120)
    assert code == 0, err[-2000:]
    for rank in range(4):
        want_out, want_err = (tmp_path / f"digest-{rank}").read_text().split()
        assert hashlib.sha256((logs / f"process-{rank}.stdout").read_bytes()).hexdigest() == want_out
        assert hashlib.sha256((logs / f"process-{rank}.stderr").read_bytes()).hexdigest() == want_err
