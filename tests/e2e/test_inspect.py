"""Looking into a running job from another terminal (docs/inspect.md):
``jaxrun stacks`` and ``jaxrun top`` reach real jobs through their control
channel.

One 3-process JAX job (``stuck``) serves the tests in order: process 1
sleeps in user code while processes 0 and 2 wait for it in a collective.
``jaxrun stacks`` prints process 1's group first and the other two's
identical stacks once; ``jaxrun top --once`` shows every process waiting;
the live view is driven in a pseudo-terminal; and last the job is released
and finishes on its own, which proves that the dumps stopped nothing, and
its channel's socket is gone.  Each test passes alone or in another order:
the job's run id comes from the job itself (its process 0 prints it), and a
test that comes after the release gets a new job.  The job carries a token
of its own, and a temporary folder of its own, where its channel listens, so
that another test's job is never the newest one.

A plain-Python recoverable job (``lives``) passes through finished, failed
and restarting: ``jaxrun top --once`` shows each state on its process's row.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pexpect
import pytest
from fixtures.jobs import JAXRUN, ROOT, TOKEN, wait_gone

STUCK = '''
import os, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

release = sys.argv[1]
if jax.process_index() == 0:
    print("run", os.environ["JAXRUN_RUN_ID"], flush=True)
mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("i")))
float(jnp.sum(x))  # a first collective: Gloo's context is made (its making times out after 30 s)
print("ready", jax.process_index(), flush=True)
if jax.process_index() == 1:
    while not os.path.exists(release):
        time.sleep(0.5)  # stuck
total = float(jnp.sum(x))  # the same program again (compiled): the others wait here for process 1
print("done", total, flush=True)
'''

LIVES = '''
import os, sys, time

rank, life = int(os.environ["JAXRUN_PROCESS_ID"]), int(os.environ.get("JAXRUN_PROCESS_RESTARTS", "0"))
print(f"process {rank} life {life}", flush=True)
if rank == 1:
    sys.exit(0)  # finished
if rank == 2 and life == 0:
    sys.exit(3)  # started again alone: the one restart --max-restarts allows
if rank == 3:
    time.sleep(1.0)
    sys.exit(4)  # failed, the others go on: no restart left
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
'''


def line_of(text: str) -> int:
    """The line number in the stuck script of the line that holds ``text``."""
    return next(n for n, line in enumerate(STUCK.splitlines(), 1) if text in line)


def command(env, *args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([*JAXRUN, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def rows_of(out: str) -> dict[int, list[str]]:
    """``jaxrun top --once``'s rows by rank: rank, host, pid, state, last line."""
    lines = out.splitlines()
    assert lines[1].split()[:7] == ["RANK", "HOST", "PID", "STATE", "CPU", "MEM", "IDLE"], out
    state_at, last_at = lines[1].index("STATE"), lines[1].index("LAST LINE")
    found = {}
    for line in lines[2:]:
        if not line[:1].isdigit():
            continue  # the straggler's line under the table (the stuck process is the one the others wait for)
        cells = line.split()
        found[int(cells[0])] = [*cells[:3], line[state_at:].split("  ")[0].strip(), line[last_at:].strip()]
    return found


def top_until(env, run_id: str, wanted, within: float) -> str:
    """``jaxrun top --once`` again until its rows are as ``wanted`` says."""
    deadline = time.monotonic() + within
    while True:
        done = command(env, "top", "--once", "--run", run_id)
        assert done.returncode == 0, done.stderr
        if wanted(rows_of(done.stdout)) or time.monotonic() > deadline:
            return done.stdout
        time.sleep(0.3)


class Job:
    def __init__(self, proc, env, release, logs, token, base):
        self.proc, self.env, self.release, self.logs = proc, env, release, logs
        self.token, self.base = token, base  # its processes' token, its own temporary folder
        self.run_id = ""


# A job's start, up to its three processes' "ready": a test that must start
# the job (alone, or after the release) spends it on top of its own seconds.
STUCK_START = 90


def stuck_job(tmp_path_factory, started: list) -> Job:
    """A job stuck as the module's docstring says, once all three processes are ready."""
    token = uuid.uuid4().hex
    # Short: the channel's folder goes under it (tmp_path_factory's run past a socket's room under xdist).
    base = Path(tempfile.mkdtemp(prefix="jr-inspect-", dir="/tmp"))
    env = {**os.environ, TOKEN: token, "TMPDIR": str(base), "TERM": "xterm"}
    env.pop("JAXRUN_NO_PRELOAD", None)
    script, release, logs = base / "stuck.py", base / "release", base / "logs"
    script.write_text(STUCK)
    # The default --stall-timeout (600 s): the job is a stall, and must outlive the tests.
    with open(base / "console", "wb") as console:  # jaxrun's own stdout and stderr, never a full pipe
        proc = subprocess.Popen([*JAXRUN, "-n", "3", "--cpu-devices", "1", "--log-dir", str(logs), str(script),
                                 str(release)], env=env, cwd=ROOT, stdout=console, stderr=subprocess.STDOUT,
                                start_new_session=True)
    job = Job(proc, env, release, logs, token, base)
    started.append(job)
    deadline = time.monotonic() + STUCK_START
    while not all((logs / f"process-{r}.stdout").exists() and "ready" in (logs / f"process-{r}.stdout")
                  .read_text() for r in range(3)):
        assert proc.poll() is None and time.monotonic() < deadline, (base / "console").read_text()
        time.sleep(0.2)
    job.run_id = (logs / "process-0.stdout").read_text().split()[1]  # "run ID", printed before "ready"
    return job


@pytest.fixture(scope="module")
def stuck_jobs(tmp_path_factory):
    """The module's stuck job: started by the first test that asks, and again
    only for a test that comes after its release."""
    started: list[Job] = []

    def current() -> Job:
        if not started or started[-1].release.exists():  # released: it finishes on its own
            stuck_job(tmp_path_factory, started)
        return started[-1]

    try:
        yield current
    finally:
        for job in started:
            if job.proc.poll() is None:
                os.killpg(job.proc.pid, 9)
            job.proc.wait()
        leftover = [p for job in started for p in wait_gone(job.token, within=5.0)]
        for p in leftover:
            p.kill()
        for job in started:
            shutil.rmtree(job.base, ignore_errors=True)
        assert not leftover, f"processes outlived the job: {leftover}"


@pytest.fixture
def stuck(stuck_jobs) -> Job:
    return stuck_jobs()


@pytest.mark.timeout(STUCK_START + 60)
def test_stacks_print_the_process_that_stands_apart_first_and_the_others_once(stuck):
    deadline = time.monotonic() + 20  # processes 0 and 2 may still be on their way into the collective
    while True:
        done = command(stuck.env, "stacks")  # the newest job of this user's: this one, alone in its folder
        assert done.returncode == 0, done.stderr
        out = done.stdout
        if " in 2 groups " in out.splitlines()[0] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    head = re.match(r"jaxrun: run (\S+): 3 processes in 2 groups by the main thread's stack", out)
    assert head and head[1] == stuck.run_id, out  # without --run: the newest job, this one
    lines = out.splitlines()
    one = lines.index(next(line for line in lines if line.startswith("process 1 on localhost (pid ")))
    others = lines.index("processes 0,2 on localhost: 2 of 3")
    assert one < others, out
    assert lines[one].endswith(": 1 of 3")
    script = stuck.logs.parent / "stuck.py"
    sleeping = line_of("time.sleep(0.5)  # stuck")
    assert lines[one + 1] == f'  File "{script}", line {sleeping} in <module>', out  # innermost: time.sleep is C
    collective = line_of("total = float(jnp.sum(x))")
    assert f'  File "{script}", line {collective} in <module>' in lines[others + 1:], out
    assert out.count(f"line {collective} in <module>") == 1  # the two identical stacks once
    assert "shim.py" not in out and "runpy" not in out  # from the script's outermost frame in
    assert stuck.proc.poll() is None  # the processes go on
    again = command(stuck.env, "stacks", "--run", stuck.run_id)
    assert again.returncode == 0 and again.stdout.splitlines()[2:] == lines[2:], again.stdout


@pytest.mark.timeout(STUCK_START + 60)
def test_top_once_shows_every_process_waiting_with_its_pid_cpu_and_memory(stuck):
    out = top_until(stuck.env, stuck.run_id, lambda rows: all(r[3] == "waiting" for r in rows.values()), 30)
    lines = out.splitlines()
    assert lines[0] == f"jaxrun: run {stuck.run_id}  attempt 0  restarts 0 of 0  processes 3", out
    rows = rows_of(out)
    assert sorted(rows) == [0, 1, 2] and all(r[3] == "waiting" for r in rows.values()), out
    for rank in range(3):
        cells = lines[2 + rank].split()
        assert cells[1] == "localhost" and cells[2].isdigit(), out
        assert re.fullmatch(r"\d+%", cells[4]) and re.fullmatch(r"[\d.]+[KMG]", cells[5]), out
        assert re.fullmatch(r"\d+s|\d+m\d\ds", cells[6]), out
        assert lines[2 + rank].endswith(f"ready {rank}"), out  # its last line


@pytest.mark.timeout(STUCK_START + 60)
def test_top_live_draws_the_table_in_a_terminal_until_ctrl_c(stuck):
    pytest.importorskip("rich", reason="jaxrun top's live view needs rich, a dependency of jaxrun")
    # An 80-column terminal, the common default (pytest-xdist's workers also
    # have COLUMNS=80 and LINES=24 in their environment, which rich obeys):
    # with the WAIT column and its straggler mark, boxes cut the header to
    # "RA…" and the pids to "115…" there.  Every cell but the last line whole.
    env = {**{k: str(v) for k, v in stuck.env.items()}, "COLUMNS": "80", "LINES": "24"}
    child = pexpect.spawn(sys.executable, ["-m", "jaxrun", "top", "--run", stuck.run_id, "--interval", "0.3"],
                          env=env, cwd=str(ROOT), encoding="utf-8", timeout=30, dimensions=(24, 80),
                          codec_errors="replace")  # the tty echoes ^C where it lands
    try:
        child.expect_exact(f"run {stuck.run_id}")
        child.expect(r"RANK.*HOST.*PID.*STATE.*CPU.*MEM.*IDLE.*WAIT")
        pid = rows_of(command(stuck.env, "top", "--once", "--run", stuck.run_id).stdout)[0][2]
        child.expect(rf"\b0 +localhost +{pid} ")  # process 0's row, its pid whole
        child.expect("waiting")
        time.sleep(1.0)  # a few redraws
        child.sendintr()
        child.expect(pexpect.EOF, timeout=10)
        child.close()
        assert child.exitstatus == 0, child.before
    finally:
        if child.isalive():
            child.terminate(force=True)
    assert stuck.proc.poll() is None


@pytest.mark.timeout(STUCK_START + 90)
def test_the_job_released_finishes_on_its_own_and_its_channel_goes_away(stuck):
    dumped = command(stuck.env, "stacks", "--run", stuck.run_id)  # the dumps, which must stop nothing
    assert dumped.returncode == 0, dumped.stderr
    stuck.release.write_text("")
    stuck.proc.wait(timeout=60)
    out = (stuck.logs.parent / "console").read_text()
    assert stuck.proc.returncode == 0, out
    assert out.count("done 12.0") == 3, out  # 3 processes' ones, 4 each
    assert "most recent call first" not in out and "File \"" not in out, out  # the dumps stayed in the logs
    assert "Current thread 0x" in (stuck.logs / "process-1.stderr").read_text()
    gone = command(stuck.env, "top", "--once", "--run", stuck.run_id)
    assert gone.returncode == 1 and gone.stderr == f"jaxrun: no running job {stuck.run_id} (it has ended, or " \
                                                   "was started by another user)\n", gone.stderr
    assert not [name for name in os.listdir(stuck.logs.parent / f"jaxrun-sockets-{os.getuid()}")
                if name.startswith("run-")]


@pytest.mark.timeout(90)
def test_top_once_shows_finished_failed_and_restarting_on_their_rows(start_job, tmp_path):
    script, release = tmp_path / "lives.py", tmp_path / "release"
    script.write_text(LIVES)
    env = {**os.environ, "JAXRUN_NO_PRELOAD": "1"}
    # --stall-timeout 0: no activity sampler, so a process that never joins (plain Python) stays
    # "starting", and process 2's second life "restarting", as long as they run.
    job = start_job("-n", 4, "--recoverable", "--max-restarts", 1, "--stall-timeout", 0, "--log-dir",
                    tmp_path / "logs", script, release, env={"JAXRUN_NO_PRELOAD": "1"})
    listed = None
    deadline = time.monotonic() + 60
    while listed is None:
        assert job.proc.poll() is None and time.monotonic() < deadline, job.proc.communicate()
        done = command(env, "top", "--once")
        if done.returncode == 0:
            listed = done.stdout
        time.sleep(0.2)
    run_id = listed.split()[2]
    wanted = {0: "starting", 1: "finished", 2: "restarting (life 1)", 3: "failed"}
    last = {0: "process 0 life 0", 2: "process 2 life 1"}  # a row shows its process's last line
    # Process 2's second life shows as restarting from its start, before its
    # first line (CI at 30233c2 read the row between the two): wait for both.
    out = top_until(env, run_id, lambda rows: {r: c[3] for r, c in rows.items()} == wanted
                    and all(rows[r][4] == text for r, text in last.items()), 40)
    rows = rows_of(out)
    assert {rank: cells[3] for rank, cells in rows.items()} == wanted, out
    assert out.splitlines()[0] == f"jaxrun: run {run_id}  attempt 0  restarts 1 of 1  processes 4", out
    assert {rank: rows[rank][4] for rank in last} == last, out
    release.write_text("")
    assert job.wait(timeout=30) == 4, job.stderr  # process 3's failure is the job's


@pytest.mark.timeout(180)
def test_over_ssh_the_dumps_come_home_and_the_rows_name_the_hosts(sshd_hosts, shared_dir, start_job, tmp_path):
    """Process 0 on hostA, 1 and 2 on hostB: the SIGUSR1 reaches each through
    its host's agent, the dumps come home in the logs; the rows name the hosts,
    and the pid, CPU and memory, known here only of a local job's running
    processes, show as "-"."""
    script, release = shared_dir / "stuck.py", shared_dir / "release"
    script.write_text(STUCK)
    env = dict(os.environ)
    job = start_job("-H", "hostA:1,hostB:2", "--ssh-config", sshd_hosts.config, "-x", f"PYTHONPATH={ROOT}",
                    "-x", TOKEN, "--cpu-devices", 1, "--log-dir", tmp_path / "logs", script, release)
    deadline = time.monotonic() + 120
    while not all("ready" in read(tmp_path / "logs" / f"process-{r}.stdout") for r in range(3)):
        assert job.proc.poll() is None and time.monotonic() < deadline, job.proc.communicate()
        time.sleep(0.3)
    done = command(env, "stacks")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2] == "process 1 on hostB: 1 of 3", done.stdout  # no pid: jaxrun holds an ssh client's
    assert lines[3] == f'  File "{script}", line {line_of("time.sleep(0.5)  # stuck")} in <module>', done.stdout
    assert "processes 0,2 on hostA (0), hostB (2): 2 of 3" in lines, done.stdout
    out = command(env, "top", "--once").stdout
    rows = {int(line.split()[0]): line.split() for line in out.splitlines()[2:] if line[:1].isdigit()}
    assert [rows[r][1] for r in range(3)] == ["hostA", "hostB", "hostB"], out
    assert all(rows[r][2] == "-" and rows[r][4:6] == ["-", "-"] for r in range(3)), out
    release.write_text("")
    assert job.wait(timeout=60) == 0, job.stderr


def read(path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


AGAIN = '''
import os, sys, time

if os.environ["JAXRUN_RESTART_COUNT"] == "0" and os.environ["JAXRUN_PROCESS_ID"] == "1":
    sys.exit(3)  # the first attempt fails: the whole job starts again
print("attempt", os.environ["JAXRUN_RESTART_COUNT"], flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
'''


@pytest.mark.timeout(60)
def test_top_once_shows_a_restarted_job_restarting_in_its_second_attempt(start_job, tmp_path):
    script, release = tmp_path / "again.py", tmp_path / "release"
    script.write_text(AGAIN)
    env = {**os.environ, "JAXRUN_NO_PRELOAD": "1"}
    job = start_job("-n", 2, "--max-restarts", 1, "--stall-timeout", 0, "--log-dir", tmp_path / "logs", script,
                    release, env={"JAXRUN_NO_PRELOAD": "1"})
    deadline = time.monotonic() + 40
    while True:
        assert job.proc.poll() is None and time.monotonic() < deadline, job.proc.communicate()
        done = command(env, "top", "--once")
        if done.returncode == 0 and " attempt 1 " in done.stdout.splitlines()[0] and all(
                line.endswith("attempt 1") for line in done.stdout.splitlines()[2:]):
            break
        time.sleep(0.2)
    lines = done.stdout.splitlines()
    assert lines[0].split("  ")[1:] == ["attempt 1", "restarts 1 of 1", "processes 2"], done.stdout
    assert [line.split()[3] for line in lines[2:]] == ["restarting", "restarting"], done.stdout  # not yet joined
    release.write_text("")
    assert job.wait(timeout=30) == 0, job.stderr
