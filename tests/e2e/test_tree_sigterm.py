"""A SIGTERM sent to jaxrun's whole tree at once keeps its grace, in every backend (#29).

Slurm's ``scancel``, a systemd stop of a control group and a container
runtime's stop signal every process of a job at the same moment: jaxrun, each
controller, and every helper jaxrun started (the fork server, the local ssh
clients, mpirun, the task agents).  The helpers must leave the signal to
jaxrun (``jaxrun.backends.shield``), so that each controller, whose SIGTERM
handler takes a second to save its work, gets its ``--grace``:

- every controller saved (4 of 4);
- jaxrun exits 143, an interrupted run;
- the report gives each process its own exit, 0, with the resources its
  reaper measured;
- nothing is left (the leak guard), and it all ends well within the grace.

srun cannot be shielded: it unblocks the signals and turns its own SIGTERM
into a SIGKILL of its tasks (docs/backends.md says what to set instead).

tests/e2e/test_matrix.py's ``tree_sigterm`` fault sends that whole-tree
SIGTERM on every backend of its table (local, preload, SSH, mpirun, Ray, and
Slurm, whose cell pins srun's documented SIGKILL) and checks all of the
above; the first test here sends it only where the matrix does not go: SSH
sessions started fresh by their session agents (hosts that forward nothing).

The second test sends SIGTERM to jaxrun alone, and then, while that stop is
under way, to every helper directly: each must survive it, and the stop
still ends as above.  The third kills the fork server during a stop: its
controllers keep their grace all the same.  The fourth checks that
whatever the helpers hold blocked, a controller starts with the stop
signals of a plain ``python SCRIPT``; the last, that under ``nohup`` a
hangup ends nothing and the controllers start with SIGHUP ignored, as
that launch would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from fixtures.jobs import DATA, ROOT, TOKEN

from jaxrun.contract import names

SAVER = DATA / "sigterm_saver.py"  # its SIGTERM handler takes 1 s to save
PROCESSES = 4
GRACE = 20
# From the signal to the attempt's end on jaxrun's record (the report's last
# ended_at): a save takes 1 s, and a controller may get the signal twice
# (directly and forwarded) and save twice, 2 s; the rest, five times that, is
# for the CPU work of a stop on a loaded 2-core machine, and it is still far
# below the grace.  jaxrun's own exit after that is bounded by GRACE + 30.
WITHIN = 12.0


@dataclasses.dataclass(frozen=True)
class Way:
    """One way of launching: jaxrun's flags, given the fixture's value."""

    name: str
    flags: Callable[[object], list]
    fixture: str | None = None
    program: str | None = None
    env: tuple = ()


def ssh_flags(hosts) -> list:
    return ["-H", "hostA:2,hostB:2", "--ssh-config", hosts.config, "--env", f"PYTHONPATH={ROOT}", "-x", TOKEN]


WAYS = [
    Way("local", lambda _: ["-n", PROCESSES, "--no-preload"]),
    Way("preload", lambda _: ["-n", PROCESSES, "--preload"]),
    Way("ssh", ssh_flags, "sshd_hosts"),
    # Each process in a session over the master (the ssh client that dies of
    # SIGTERM even when it inherits it ignored), started fresh by its session
    # agent, which holds the stop signals blocked: the shim unblocks them.
    Way("ssh-sessions", lambda hosts: ["-H", "hostC:2,hostD:2", *ssh_flags(hosts)[2:], "--no-preload"],
        "sshd_hosts_without_forwarding"),
    # srun cannot be shielded: the helpers test leaves it out.
    Way("slurm", lambda _: ["--launcher", "slurm", "-n", PROCESSES], "slurm_cluster", "srun"),
    # 4 processes on 2 cores: a site sets this in openmpi-mca-params.conf.
    Way("mpirun", lambda _: ["--launcher", "mpirun", "-n", PROCESSES], program="mpirun",
        env=(("OMPI_MCA_rmaps_base_oversubscribe", "1"),)),
]


BY_NAME = {w.name: w for w in WAYS}


@dataclasses.dataclass
class Run:
    job: object
    out: Path
    report: Path
    folder: Path


def flags(request, way: Way, monkeypatch) -> list:
    """jaxrun's flags for ``way``, once its engine runs (skips where it is missing)."""
    if way.program and not shutil.which(way.program):
        pytest.skip(f"{way.program} is not installed")
    engine = request.getfixturevalue(way.fixture) if way.fixture else None
    for name, value in way.env:
        monkeypatch.setenv(name, value)
    return way.flags(engine)


def start(request, start_job, shared_dir: Path, way: Way, monkeypatch) -> Run:
    args = flags(request, way, monkeypatch)
    out = shared_dir / "out"  # shared_dir: every SSH host sees it at this path
    out.mkdir()
    script = shared_dir / SAVER.name
    shutil.copy(SAVER, script)
    report = shared_dir / "report.json"
    job = start_job(*args, "--grace", GRACE, "--log-dir", shared_dir / "logs", "--report", report,
                    script, out, "{process_id}", cwd=shared_dir)
    run = Run(job, out, report, shared_dir)
    deadline = time.monotonic() + 90
    while len(list(out.glob("running-*"))) < PROCESSES:
        assert job.proc.poll() is None, (job.wait(), job.stderr)
        assert time.monotonic() < deadline, f"only {sorted(p.name for p in out.iterdir())} started"
        time.sleep(0.05)
    return run


def tree(pid: int) -> list[psutil.Process]:
    top = psutil.Process(pid)
    return [top, *top.children(recursive=True)]


def signal_all(procs: list[psutil.Process], signum: int = signal.SIGTERM) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signum)


def saved(run: Run) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in run.out.glob("saved-*"))


def check_clean_stop(run: Run, sent_at: float) -> None:
    """Every controller saved and exited 0; jaxrun said 143, in time.
    ``sent_at``: ``time.time()`` of the signal, the clock of the report."""
    code = run.job.wait(timeout=GRACE + 30)
    assert code == 143, run.job.stderr
    assert saved(run) == list(range(PROCESSES)), run.job.stderr
    report = json.loads(run.report.read_text())
    took = max(p["ended_at"] for p in report["processes"]) - sent_at
    assert took < WITHIN, f"took {took:.1f} s: {run.job.stderr}"
    attempt = report["attempts"][-1]
    assert (attempt["stop_reason"], attempt["signal"]) == ("signal", "SIGTERM"), attempt
    assert "jaxrun: stopped on SIGTERM; every process exited 0 within" in run.job.stderr
    for p in report["processes"]:
        assert (p["exit_code"], p["signal"]) == (0, None), (p, run.job.stderr)
        assert p["resources"] and p["resources"]["cpu_seconds"] > 0, p


@pytest.mark.timeout(240)
def test_a_sigterm_to_the_whole_tree_keeps_the_grace(request, start_job, shared_dir, monkeypatch):
    """Over SSH sessions; every other way is a cell of test_matrix.py."""
    run = start(request, start_job, shared_dir, BY_NAME["ssh-sessions"], monkeypatch)
    everyone = tree(run.job.proc.pid)
    sent_at = time.time()
    signal_all(everyone)
    check_clean_stop(run, sent_at)


def helpers(run: Run) -> list[psutil.Process]:
    """Every process of the run but jaxrun and the controllers: the fork
    server, the ssh clients, mpirun, and the far ends on this machine (the
    SSH hosts' agents and servers, the task agents), found by the test's
    folder or jaxrun's pid on their command lines, or the leak guard's token."""
    controllers = {int((run.out / f"running-{r}").read_text()) for r in range(PROCESSES)}
    token, jaxrun = os.environ[TOKEN], run.job.proc.pid
    signs = (str(run.folder), f"jaxrun-{jaxrun}-")
    found = {p.pid: p for p in tree(jaxrun)[1:]}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            words = " ".join(proc.cmdline())
            if any(s in words for s in signs) or proc.environ().get(TOKEN) == token:
                found.setdefault(proc.pid, proc)
    for pid in (*controllers, jaxrun, os.getpid()):
        found.pop(pid, None)
    return [p for p in found.values() if p.name() != "srun"]  # srun cannot be shielded


def describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:120]}"
    except psutil.Error:
        return f"{proc.pid} (gone)"


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.timeout(240)
@pytest.mark.parametrize("way", WAYS, ids=[w.name for w in WAYS])
def test_helpers_survive_a_sigterm_of_their_own_during_a_stop(request, start_job, shared_dir, monkeypatch, way):
    if way.name == "local":
        pytest.skip("no helper: jaxrun starts each controller itself")
    run = start(request, start_job, shared_dir, way, monkeypatch)
    sent_at = time.time()
    run.job.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the stop is under way: every controller is saving
    targets = {p: describe(p) for p in helpers(run)}
    assert targets, "no helper found"
    signal_all(list(targets))
    time.sleep(0.3)
    dead = [shown for p, shown in targets.items() if not alive(p) and run.job.proc.poll() is None]
    assert not dead, f"helpers died of SIGTERM: {dead}"
    check_clean_stop(run, sent_at)


@pytest.mark.timeout(120)
def test_the_fork_servers_death_during_a_stop_keeps_the_grace(request, start_job, shared_dir, monkeypatch):
    """The server is gone (SIGKILL, the OOM killer): its controllers are not
    killed for it.  They become jaxrun's, which sees each to its end, with
    its real exit code and resources."""
    run = start(request, start_job, shared_dir, WAYS[1], monkeypatch)
    server = [p for p in tree(run.job.proc.pid)[1:] if names.FORKSERVER_AGENT_MODULE in " ".join(p.cmdline())]
    assert len(server) == 1, server
    sent_at = time.time()
    run.job.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # every controller is saving
    server[0].kill()
    check_clean_stop(run, sent_at)


# What a controller starts with: the mask and the dispositions of the stop signals.
PROBE = """\
import json, signal, sys
stop = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
shown = {signal.Signals(s).name: (s in blocked, str(signal.getsignal(s))) for s in stop}
print("signals " + json.dumps(shown, sort_keys=True))
"""


def probe_line(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("signals ")]
    assert len(lines) == 1, text
    return json.loads(lines[0].removeprefix("signals "))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("way", WAYS, ids=[w.name for w in WAYS])
def test_a_controller_starts_with_the_stop_signals_of_a_plain_launch(request, start_job, shared_dir,
                                                                     monkeypatch, way):
    """Whatever its helpers hold blocked, a script can be stopped as under
    ``python SCRIPT``: nothing blocked, SIGTERM and SIGHUP at their default,
    Python's own SIGINT handler."""
    args = flags(request, way, monkeypatch)
    script = shared_dir / "probe.py"
    script.write_text(PROBE)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                           start_new_session=True)
    expected = probe_line(plain.stdout)
    assert not any(blocked for blocked, _ in expected.values()), expected
    logs = shared_dir / "logs"
    job = start_job(*args, "--log-dir", logs, script, cwd=shared_dir)
    assert job.wait(timeout=90) == 0, job.stderr
    for rank in range(PROCESSES):
        assert probe_line((logs / f"process-{rank}.stdout").read_text()) == expected, rank


# Wait for the file that the test creates, after the hangup.
HANGUP_PROBE = PROBE + """\
import os, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("went on", flush=True)
"""


def under_nohup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["--preload", "--no-preload"])
def test_under_nohup_a_hangup_ends_nothing_and_the_controllers_ignore_it_as_python_would(start_job, tmp_path, mode):
    """``nohup jaxrun ...``: SIGHUP is ignored from the start, as under
    ``nohup python SCRIPT``.  jaxrun keeps it so (a hangup that reaches
    it, or every process of the job, ends nothing), and each controller
    starts with it ignored, as a plain launch under nohup does."""
    script = tmp_path / "probe.py"
    script.write_text(HANGUP_PROBE)
    go = tmp_path / "go"
    go.touch()
    plain = subprocess.run([sys.executable, str(script), str(go)], capture_output=True, text=True, check=True,
                           start_new_session=True, preexec_fn=under_nohup)
    expected = probe_line(plain.stdout)
    assert expected["SIGHUP"] == [False, str(signal.SIG_IGN)], expected
    go.unlink()
    logs = tmp_path / "logs"
    job = start_job("-n", 2, mode, "--log-dir", logs, script, go, cwd=tmp_path, preexec_fn=under_nohup)
    outputs = [logs / f"process-{rank}.stdout" for rank in range(2)]
    deadline = time.monotonic() + 60
    while not all(out.exists() and "signals" in out.read_text() for out in outputs):  # both are waiting
        assert job.proc.poll() is None and time.monotonic() < deadline, job.wait()
        time.sleep(0.1)
    signal_all(tree(job.proc.pid), signal.SIGHUP)  # the hangup, to jaxrun and every process it started
    time.sleep(1.0)
    assert job.proc.poll() is None, job.wait()
    go.touch()
    assert job.wait(timeout=60) == 0, job.stderr
    for rank, out in enumerate(outputs):
        text = out.read_text()
        assert probe_line(text) == expected, rank
        assert "went on" in text, text
