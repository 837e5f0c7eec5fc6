"""The fault x backend matrix: one supervision semantics in every backend (issue #29).

jaxrun promises, whatever starts the processes: the process that failed first
is named and its status is jaxrun's; a SIGTERM gives every process ``--grace``
seconds before SIGKILL; nothing outlives the run.  ``FAULTS`` below is one
table of faults with the outcome each must have, and ``BACKENDS`` one table of
the ways to launch; every pair is a test.  Each cell runs a real 3-process JAX
job (``tests/data/matrix_job.py``: a collective, then a SIGTERM handler that
saves for 1 s) and checks:

- jaxrun's exit status;
- the root cause, in the ``--report`` JSON and in the summary;
- the seconds from the fault to the attempt's end, on jaxrun's own record
  (the report's last ``ended_at``, where jaxrun lived to write one): the job
  writes when it faulted, or the test notes when it sent the signal, to a
  folder every host sees, and every host is this machine, on one clock.
  jaxrun's own exit after that (the report, the backend's close) is bounded
  apart (``WRAP_UP``), where a close that hangs would show;
- the processes left afterwards, the far ends included: the cell's own
  token (``JAXRUN_TEST_TOKEN``, as the leak guard's) finds what inherited
  jaxrun's environment, the cell's folder and jaxrun's pid (in the names of
  the hosts' preloading servers) the SSH far ends that did not;
- what each process saved: the marker its SIGTERM handler writes.

The crash faults run again under CPU overload (a burner per core) on the
default local mode and over SSH, where a wrong root cause showed up 1 run in
5 (issue #29): once each here, the six side by side;
``bench/matrix.py`` runs that held-out version many times (it holds the
second run each cell made here before).

A backend's cells overlap (``cells``): the hang cell runs beside the others,
and the next cells start while a test checks its own.

A new backend is one line in ``BACKENDS``; where an engine cannot keep a
promise and the docs say what happens instead, its ``differs`` holds that
expectation (Slurm's ``srun`` under a whole-tree SIGTERM).  Everything a cell
does is in plain functions (``run_cell``, ``problems``), so that the bench
runs the very same cells without pytest's fixtures.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from fixtures import spinner
from fixtures.jobs import DATA, JAXRUN, ROOT, TOKEN, overload

JOB = DATA / "matrix_job.py"
PROCESSES = 3  # the faulty one and two others; four cost the suite a quarter more of each cell's CPU
ALL = frozenset(range(PROCESSES))
GRACE = 5.0
# --timeout counts from jaxrun's start: it must find three JAX processes hung
# in their collective, not still importing jax.  TIMEOUT is bench/matrix.py's,
# whose cells run one at a time; the tests run their hang cells beside the
# others (BESIDE_TIMEOUT).  Its grace is short: the sigterm cells check what a
# grace gives.
TIMEOUT, HANG_GRACE = 12.0, 1.0
STALL = 3.0  # the stuck cell's --stall-timeout
# Seconds a cell may take to start its job, and to end after its fault, before
# it counts as stuck: far beyond any bound below, even on a loaded machine.
START = 90.0
STUCK = 45.0
# Under CPU overload every bound is this many times looser.
LOADED = 2.0
# From the attempt's end on jaxrun's record to jaxrun's exit: the report, the
# summary and the backend's close (Ray's driver and actors, an SSH master, a
# scheduler step).  0.1-1.3 s here, whatever the backend; the rest is for a
# loaded 2-core machine, where every part is CPU work that may run at a tenth
# of its speed.  A close that hangs shows here, long before STUCK.
WRAP_UP = 15.0


# -- the faults ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Seen:
    """What one cell observed."""

    status: int
    err: str  # jaxrun's stderr: the live lines and the summary
    report: dict | None  # --report, where jaxrun lived to write it
    markers: dict[str, frozenset]  # marker name -> the processes that wrote it
    fault_at: float | None  # time.time() of the fault
    ended_at: float  # when jaxrun exited (after a SIGKILL: when nothing was left)
    far_ends: frozenset  # the kinds of far end seen while the job ran
    left: tuple  # what was still running once the run was over
    logs: Path
    stuck: str | None = None  # what was still running when jaxrun did not end

    @property
    def attempt_end(self) -> float | None:
        """When jaxrun saw the attempt's last process end (the report's
        ``ended_at``, by this machine's wall clock), where it wrote a report."""
        ends = [p["ended_at"] for p in (self.report or {}).get("processes", []) if p.get("ended_at")]
        return max(ends) if ends else None

    @property
    def took(self) -> float | None:
        """From the fault to the attempt's end on jaxrun's record; without a
        report (a SIGKILLed jaxrun), to when the test saw nothing left."""
        if self.fault_at is None:
            return None
        return (self.attempt_end or self.ended_at) - self.fault_at

    @property
    def wrap_up(self) -> float | None:
        """From the attempt's end on jaxrun's record to jaxrun's exit."""
        return None if self.attempt_end is None else self.ended_at - self.attempt_end


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str
    job: str  # matrix_job.py's FAULT
    how: str  # who faults: "job", or the test with "sigterm", "tree", "sigkill", "timeout"
    status: int  # jaxrun's exit status (-9: jaxrun itself was SIGKILLed)
    within: float  # seconds from the fault to the end, at most
    root: int | None = None  # the process named as the root cause; None: no process is
    says: str | None = None  # a pattern the console must show
    saved: frozenset | None = None  # who saved; None: timing decides, not pinned
    flags: tuple = ()
    extra: Callable[[Seen], list[str]] = lambda seen: []

    @property
    def crash(self) -> bool:
        return self.how == "job"

    @property
    def stalls(self) -> bool:
        """The job hangs until the stall watchdog stops it (stuck, spin, parked, queue)."""
        return "--stall-timeout" in self.flags


def failed_first(rank: int, how: str) -> str:
    return rf"jaxrun: process {rank}( on \S+)? failed first: {how} \(pid \d+\)"


def exception_named(seen: Seen) -> list[str]:
    found = []
    if "RuntimeError: matrix fault in process 2" not in seen.err:
        found.append("the summary does not name the exception")
    exception = ((seen.report or {}).get("root_cause") or {}).get("exception") or {}
    if (exception.get("type"), exception.get("message")) != ("RuntimeError", "matrix fault in process 2"):
        found.append(f"the report's root cause holds the exception {exception or None}")
    return found


def stopped_on_sigterm(seen: Seen) -> list[str]:
    """The report's attempt says it was stopped by a SIGTERM."""
    attempt = ((seen.report or {}).get("attempts") or [{}])[-1]
    if (attempt.get("stop_reason"), attempt.get("signal")) != ("signal", "SIGTERM"):
        return [f"the report's attempt stopped for {attempt.get('stop_reason')}, {attempt.get('signal')}"]
    return []


def clean_stop(seen: Seen) -> list[str]:
    """A stop every process took in its stride: the report holds each one's
    real exit code, the resources its reaper measured and the compiles its
    shim heard (``marks``), and the summary blames no process."""
    found = stopped_on_sigterm(seen)
    if "jaxrun: stopped on SIGTERM; every process exited 0 within" not in seen.err:
        found.append("the summary does not say that jaxrun stopped on SIGTERM and every process exited 0")
    if "failed first" in seen.err:
        found.append("the summary blames a process for a clean stop")
    for p in (seen.report or {}).get("processes", []):
        if (p["exit_code"], p["signal"]) != (0, None) or not (p["resources"] or {}).get("cpu_seconds"):
            found.append(f"process {p['process_id']}: exit code {p['exit_code']}, signal {p['signal']}, "
                         f"resources {p['resources']} in the report")
        if not (p.get("marks") or {}).get("compile"):  # the run's goodput: its compiles came home with its end
            found.append(f"process {p['process_id']}: marks {p.get('marks')} in the report, no compile")
    return found


def killed_at_once(seen: Seen) -> list[str]:
    """srun cannot be shielded (docs/backends.md, "Stopping a job"): a SIGTERM
    of its own makes it SIGKILL every task at once, and jaxrun still exits 143."""
    found = stopped_on_sigterm(seen)
    if "srun: forcing job termination" not in seen.err:
        found.append("srun does not say that it forced the job's termination")
    if not re.search(r"^jaxrun: .*SIGTERM", seen.err, re.M) or "failed first" in seen.err:
        found.append("the summary does not say that jaxrun stopped on SIGTERM, blaming no process")
    signals = [p["signal"] for p in (seen.report or {}).get("processes", [])]
    if signals != ["SIGKILL"] * PROCESSES:
        found.append(f"the report's signals are {signals}, not SIGKILL for every process")
    return found


def stacks_dumped(seen: Seen) -> list[str]:
    return [f"no stack dump in process {r}'s log" for r in range(PROCESSES)
            if "most recent call first" not in read(seen.logs / f"process-{r}.stderr")]


# ``within`` is timed on jaxrun's record (Seen.took).  What it holds: the waits
# jaxrun promises (a crash: none; a signal: the 1 s save; a hang: the 1.5 s
# for the stack dumps, then HANG_GRACE; a stall: STALL, a tenth of it to
# notice, the dumps and the save, 5.8 s) and some CPU work (the news of an
# exit coming home, the signals, the processes' own exits).  Unloaded, a
# crash cell takes 0.1-0.3 s on that record, a signal 1.1 s, a hang 2.6 s, a
# stall 5.7 s: every bound is at least three times that, for a 2-core machine
# that also runs the other worker's jobs and burners; the overload tests'
# LOADED doubles it again.
FAULTS = [
    Fault("exit", "exit", "job", 7, within=10, root=2, says=failed_first(2, "exit code 7")),
    Fault("exception", "exception", "job", 1, within=10, root=2, says=failed_first(2, "exit code 1"),
          extra=exception_named),
    Fault("segv", "segv", "job", 139, within=10, root=1, says=failed_first(1, "killed by SIGSEGV")),
    Fault("sigterm", "idle", "sigterm", 143, within=GRACE + 5, saved=ALL, extra=clean_stop),
    Fault("tree_sigterm", "idle", "tree", 143, within=GRACE + 5, saved=ALL, extra=clean_stop),
    # The lifeline ends every process at once: a SIGKILLed jaxrun cannot grant a grace.
    Fault("sigkill", "idle", "sigkill", -9, within=10, saved=frozenset()),
    Fault("hang", "hang", "timeout", 124, within=HANG_GRACE + 7, says=r"^jaxrun: --timeout expired",
          flags=("--timeout", TIMEOUT, "--grace", HANG_GRACE), extra=stacks_dumped),
    # Alive but stuck: found by the stall watchdog, with the process that stands out named.
    # 5.7-6.3 s here, under 2 or 8 burners too; CI once took 14.4 s.  A look
    # whose dumps come late is not taken for a stall: the watch looks again
    # one STALL later (4.8 s more), so the bound holds two looks, and slack.
    Fault("stuck", "stuck", "job", 125, within=STALL + 15, root=2,
          says=r"^jaxrun:   process 2( on \S+)? stands out, at \S+matrix_job.py:\d+ in <module>: time.sleep\(600\); "
               r"processes 0, 1 wait at \S+matrix_job.py:\d+ in collective",
          flags=("--stall-timeout", STALL), extra=stacks_dumped),
    # A hang as GPU jobs show it (NCCL's): the culprit's native threads spin
    # while its main thread is parked at another line.  Timed as stuck is.
    Fault("spin", "spin", "job", 125, within=STALL + 15, root=2,
          says=r"^jaxrun:   process 2( on \S+)? stands out, at \S+matrix_job.py:\d+ in <module>: "
               r"threading.Event\(\).wait\(\)  # parked, while its threads spin \(its Python stood still while [12] "
               r"of its own threads spun, [\d.]+ cores of CPU\); processes 0, 1 wait at \S+matrix_job.py:\d+ in "
               r"collective", flags=("--stall-timeout", STALL), extra=stacks_dumped),
    # Every process stands at one line, outside JAX, with no CPU and no I/O
    # (issue 71): stuck however many stand there, one group named at its
    # line.  Before, a warning every STALL ("not a stall") until STUCK.
    Fault("parked", "parked", "job", 125, within=STALL + 15, root=0,
          says=r"^jaxrun:   processes 0, 1, 2 stand still at \S+matrix_job.py:\d+ in <module>: time.sleep\(1\)  "
               r"# every process parked here, parked outside JAX with no CPU and no I/O$",
          flags=("--stall-timeout", STALL), extra=stacks_dumped),
    Fault("queue", "queue", "job", 125, within=STALL + 15, root=0,
          says=r"^jaxrun:   processes 0, 1, 2 stand still at \S+matrix_job.py:\d+ in <module>: batch = "
               r"batches.get\(\)  # every process waits here for a batch, parked outside JAX",
          flags=("--stall-timeout", STALL), extra=stacks_dumped),
]
CRASHES = [f for f in FAULTS if f.crash and not f.stalls]


# -- the backends ----------------------------------------------------------------

def ssh_flags(hosts) -> list:
    """sshd starts each session afresh: this checkout and the leak guard's token go explicitly."""
    return ["-H", "hostA:2,hostB:1", "--ssh-config", hosts.config, "--env", f"PYTHONPATH={ROOT}", "-x", TOKEN]


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    flags: Callable[[object], list]  # the engine (what ``engine`` gave) -> jaxrun's flags
    engine: str | None = None  # the fixture that provides it
    program: str | None = None  # a program it needs on PATH
    env: tuple = ()  # (name, value) pairs the run needs
    far_ends: frozenset = frozenset()  # kinds of far end a run must show (module names)
    # Where an engine cannot keep a promise, the documented behaviour instead:
    # (fault name, {Fault field: value}).
    differs: tuple = ()
    # Cells of this backend that ``cells`` runs at once, the hang cell's
    # included: 3, as many as ran at once before the queue (the hang, the
    # cell under test, the next), so that the tests beside the matrix in the
    # other xdist worker see no more load than before (with 4, a probe test's
    # healthy task slowed to within 3x of one held to a tenth of a core).
    jobs: int = 3

    def expects(self, fault: Fault) -> Fault:
        return dataclasses.replace(fault, **dict(self.differs).get(fault.name, {}))


BACKENDS = [
    Backend("local", lambda _: ["-n", PROCESSES, "--no-preload"]),
    Backend("preload", lambda _: ["-n", PROCESSES, "--preload"], far_ends=frozenset({"forkserver.server"})),
    Backend("ssh", ssh_flags, engine="sshd_hosts", far_ends=frozenset({"ssh.host_agent", "forkserver.server"})),
    Backend("slurm", lambda _: ["--launcher", "slurm", "-n", PROCESSES], engine="slurm_cluster", program="srun",
            far_ends=frozenset({"scheduler.task_agent"}),
            differs=(("tree_sigterm", {"saved": frozenset(), "extra": killed_at_once}),)),
    # 3 processes on 2 cores: a site would set this in openmpi-mca-params.conf.
    Backend("mpirun", lambda _: ["--launcher", "mpirun", "-n", PROCESSES], program="mpirun",
            env=(("OMPI_MCA_rmaps_base_oversubscribe", "1"),), far_ends=frozenset({"scheduler.task_agent"})),
    Backend("ray", lambda cluster: ["--launcher", "ray", "--ray-address", cluster.address, "-n", PROCESSES],
            engine="ray_cluster", env=(("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0"),),
            far_ends=frozenset({"ray.driver", "ray.actor"})),
]
BY_NAME = {b.name: b for b in BACKENDS}


# -- one cell ----------------------------------------------------------------------

def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def markers(state: Path) -> dict[str, frozenset]:
    found: dict[str, set] = {}
    for path in state.iterdir():
        name, _, rank = path.name.partition("-")
        if rank.isdigit():
            found.setdefault(name, set()).add(int(rank))
    return {name: frozenset(ranks) for name, ranks in found.items()}


def job_processes(token: str, signs: tuple[str, ...]) -> list[psutil.Process]:
    """The run's processes still running, wherever they run on this machine:
    those with the token in their environment, and those whose command line
    carries one of ``signs`` (the SSH far ends start from sshd's environment)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            words = " ".join(proc.cmdline())
            ours = any(s in words for s in signs) or proc.environ().get(TOKEN) == token
            if ours and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def far_end_kinds(procs: list[psutil.Process]) -> set[str]:
    """The jaxrun far ends among ``procs``, by module (``forkserver.server``,
    ``ssh.host_agent``, ...); a process title is one long word, so split it."""
    kinds = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for word in " ".join(proc.cmdline()).split():
                if word.startswith("jaxrun.backends."):
                    kinds.add(word.removeprefix("jaxrun.backends."))
    return kinds


def describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:160]}"
    except psutil.Error:
        return f"{proc.pid} (gone)"


def wait_until(check: Callable[[], bool], within: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def signal_tree(root: int, signum: int) -> None:
    """``signum`` to jaxrun and every descendant, in one loop: how a systemd
    stop of a control group or a container runtime's stop reaches a job.  The
    SSH hosts' processes descend from their sshd, as on other machines, so
    they are not in this tree; Slurm's tasks descend from slurmstepd."""
    top = psutil.Process(root)
    for proc in [top, *top.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signum)


def run_cell(backend: Backend, engine, fault: Fault, folder: Path, token: str, *, loaded: bool = False,
             started_up: threading.Event | None = None) -> Seen:
    """Run ``fault`` on ``backend`` in ``folder`` (which every host sees) and
    say what happened.  Whatever the cell leaves is killed before it returns.
    ``started_up`` is set once every process is ready (or jaxrun ended)."""
    script = folder / JOB.name  # its own copy: the SSH far ends name it on their command lines
    shutil.copy(JOB, script)
    if fault.job == "spin":
        spinner.build(folder)  # libspin.so beside the script
    state, logs, report = folder / "state", folder / "logs", folder / "report.json"
    state.mkdir()
    argv = [*JAXRUN, *map(str, backend.flags(engine)), "--cpu-devices", "1", "--grace", str(GRACE),
            "--log-dir", str(logs), "--report", str(report), *map(str, fault.flags), str(script), fault.job, str(state)]
    env = {**os.environ, TOKEN: token, **dict(backend.env)}
    with open(folder / "jaxrun.out", "wb") as out, open(folder / "jaxrun.err", "wb") as err:
        started = time.time()
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=out, stderr=err, start_new_session=True)
    signs = (str(folder), f"jaxrun-{proc.pid}-")
    far_ends: set[str] = set()
    looked = [0.0]  # when the far ends were last looked for
    stuck = None
    try:
        def ready() -> bool:
            everyone = markers(state).get("ready", frozenset()) == ALL
            # The far ends live from the start-up on: they are looked for
            # twice a second until the backend's are seen, as well as once
            # everyone is ready.  A look only then could come after the job's
            # end, when a loaded machine starved this thread for the second
            # between the ready markers and a crash's end.
            late = time.monotonic() - looked[0] > 0.5 and not backend.far_ends <= far_ends
            if late or (everyone and not far_ends):
                looked[0] = time.monotonic()
                far_ends.update(far_end_kinds(job_processes(token, signs)))
            return everyone or proc.poll() is not None

        wait_until(ready, START * (LOADED if loaded else 1), step=0.05)
        if started_up is not None:
            started_up.set()
        fault_at = send_fault(fault, proc, started)
        try:
            proc.wait(timeout=STUCK)
        except subprocess.TimeoutExpired:
            stuck = stuck_state(proc, token, signs, logs)
        if fault.how == "sigkill":  # the end is when nothing is left
            wait_until(lambda: not job_processes(token, signs), within=STUCK)
        ended_at = time.time()
        # Far ends get a few seconds to notice that the run is over.
        wait_until(lambda: not job_processes(token, signs), within=5)
        left = tuple(describe(p) for p in job_processes(token, signs))
    finally:
        if started_up is not None:
            started_up.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for leftover in job_processes(token, signs):
            with contextlib.suppress(psutil.Error):
                leftover.kill()
    seen_markers = markers(state)
    written = json.loads(report.read_text()) if report.exists() else None
    if fault.how == "timeout" and written:  # jaxrun's deadline, on its own record
        fault_at = written["attempts"][-1]["began_at"] + float(fault.flags[1])
    if fault.crash:
        fault_at = max((float(read(state / f"fault-{r}")) for r in seen_markers.get("fault", ())), default=None)
    return Seen(proc.returncode, read(folder / "jaxrun.err"), written, seen_markers, fault_at, ended_at,
                frozenset(far_ends), left, logs, stuck)


def stuck_state(proc: subprocess.Popen, token: str, signs: tuple[str, ...], logs: Path) -> str:
    """What a run that never ended was doing: who was still there, and the
    stacks jaxrun's SIGUSR1 dumps into each process's log."""
    alive = [describe(p) for p in job_processes(token, signs)]
    proc.send_signal(signal.SIGUSR1)
    time.sleep(2)
    tails = [f"process {r}: ...{read(logs / f'process-{r}.stderr')[-1500:]}" for r in range(PROCESSES)]
    return "\n".join([f"jaxrun did not end within {STUCK:.0f} s of the fault; still running:", *alive, *tails])


def send_fault(fault: Fault, proc: subprocess.Popen, started: float) -> float | None:
    """The test's part of the fault, if any; when it happened."""
    if proc.poll() is not None or fault.crash:
        return None
    if fault.how == "timeout":
        # The latest it can pass: the attempt began after jaxrun started.  The
        # report's ``began_at`` (read once jaxrun is done) says when it did.
        return started + float(fault.flags[1])
    at = time.time()
    if fault.how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif fault.how == "tree":
        signal_tree(proc.pid, signal.SIGTERM)
    elif fault.how == "sigkill":
        proc.kill()
    else:
        raise ValueError(f"unknown fault {fault.how!r}")
    return at


def problems(backend: Backend, fault: Fault, seen: Seen, *, loaded: bool = False) -> list[str]:
    """Everything that differs from the fault's promise; empty when the cell is right."""
    found = [seen.stuck] if seen.stuck else []
    if seen.markers.get("ready") != ALL:
        found.append(f"only processes {sorted(seen.markers.get('ready', ()))} finished the first collective")
    if seen.status != fault.status:
        found.append(f"exit status {seen.status}, not {fault.status}")
    cause = (seen.report or {}).get("root_cause")
    if fault.status != -9:
        named = None if cause is None else cause["process_id"]
        if seen.report is None:
            found.append("no report")
        elif named != fault.root:
            found.append(f"root cause {named}, not {fault.root}")
    if fault.says and not re.search(fault.says, seen.err, re.M):
        found.append(f"the console lacks {fault.says!r}")
    if fault.crash and not fault.stalls:
        wrong = re.findall(r"process \d+(?: on \S+)? failed first: [^\n]*", seen.err)
        if any(not re.match(fault.says, "jaxrun: " + w) for w in wrong):
            found.append(f"the summary says {wrong}")
    within = fault.within * (LOADED if loaded else 1)
    if seen.took is None:
        found.append("the fault never happened")
    elif seen.took > within:
        found.append(f"{seen.took:.1f} s from the fault to the attempt's end, more than {within:.0f} s")
    if seen.wrap_up is not None and seen.wrap_up > WRAP_UP * (LOADED if loaded else 1):
        found.append(f"{seen.wrap_up:.1f} s from the attempt's end to jaxrun's exit, more than {WRAP_UP:.0f} s")
    if seen.left:
        found.append(f"left running: {list(seen.left)}")
    if not backend.far_ends <= seen.far_ends:
        found.append(f"far ends seen while it ran: {sorted(seen.far_ends)}, expected {sorted(backend.far_ends)}")
    saved = seen.markers.get("saved", frozenset())
    if fault.saved is not None and saved != fault.saved:
        found.append(f"saved: {sorted(saved)} of {PROCESSES}, expected {sorted(fault.saved)}")
    found += fault.extra(seen)
    return found


def summary(backend: Backend, fault: Fault, seen: Seen) -> str:
    """One line for a cell: the figures a note quotes."""
    cause = ((seen.report or {}).get("root_cause") or {}).get("process_id")
    took = "?" if seen.took is None else f"{seen.took:.1f}"
    wrap_up = "?" if seen.wrap_up is None else f"{seen.wrap_up:.1f}"
    return (f"{backend.name:8} {fault.name:13} status {seen.status:4}  root cause {cause!s:4}  "
            f"{took:>5} s to the end, {wrap_up:>4} s to exit  saved {len(seen.markers.get('saved', ()))}/{PROCESSES}"
            f"  left {len(seen.left)}")


# -- the tests ---------------------------------------------------------------------

def engine_of(request, backend: Backend):
    if backend.program and not shutil.which(backend.program):
        pytest.skip(f"{backend.program} is not installed")
    return request.getfixturevalue(backend.engine) if backend.engine else None


@pytest.fixture
def engine(request, backend):
    return engine_of(request, backend)


def check_seen(backend, fault, seen, loaded=False) -> None:
    print(summary(backend, fault, seen))
    found = problems(backend, fault, seen, loaded=loaded)
    assert not found, "\n".join([summary(backend, fault, seen), *found, "jaxrun's stderr:", seen.err[-4000:],
                                  *log_tails(seen.logs)])


def log_tails(logs: Path, lines: int = 15) -> list[str]:
    """Each process's stderr log, its last lines: the test's folder is gone
    after a failure, and a process that died on its own (a SIGSEGV inside
    `import jax`, once, in a suite run) said why only there."""
    tails = []
    for log in sorted(Path(logs).rglob("process-*.stderr")) if logs else ():
        try:
            text = log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        tails += [f"{log.name}'s last lines:", *(f"  {line}" for line in text)]
    return tails


HANG = next(f for f in FAULTS if f.how == "timeout")
# The hang cell mostly waits for its --timeout, so it runs beside its
# backend's other cells: started before the first of them, which waits until
# the hang's processes are ready, and checked by its own test.  Its timeout,
# counted from jaxrun's start, must outlast the job's start-up: 3-8 s alone;
# 12 s did not, once, for Ray under load, with a cell starting beside it.
# The other cells take about as long in all, so it costs the suite little.
BESIDE_TIMEOUT = 24.0


@pytest.fixture(scope="module")
def cells(request, shared_root):
    """backend, engine, fault -> (the fault as run, the future of its Seen).

    Most of a cell is waiting (a start-up, a save, a grace, a stall), so a
    backend's cells overlap: its first test starts the backend's hang cell,
    alone, and once the hang's processes are ready queues every other cell
    of the backend that this run checks, in the tests' order, to run the
    backend's ``jobs`` at a time (the hang's included): a cell starts as
    soon as one ends, whichever test is at hand.  Each runs in a folder of
    its own with a token of its own, not the test's: run_cell finds and
    kills whatever its job leaves, and says so (``left``).  Every cell has
    ended when the module does."""
    # By name, not node id: under ``-n 2`` xdist's loadgroup appends the
    # group to every node id (``...[ssh-hang]@tests/e2e/test_matrix.py``),
    # and no cell would start ahead of its test.
    selected = {item.name for item in request.session.items if item.path == request.path}
    pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
    started: dict[tuple[str, str], tuple[Fault, concurrent.futures.Future]] = {}

    def wanted(backend: Backend, fault: Fault) -> bool:
        return f"test_matrix[{backend.name}-{fault.name}]" in selected

    def start(backend: Backend, engine, fault: Fault) -> threading.Event:
        ran = backend.expects(fault)
        if fault is HANG:
            ran = dataclasses.replace(ran, flags=("--timeout", BESIDE_TIMEOUT, *ran.flags[2:]))
        folder = Path(tempfile.mkdtemp(prefix=f"{backend.name}-{fault.name}-", dir=shared_root))
        event = threading.Event()
        started[backend.name, fault.name] = ran, pools[backend.name].submit(
            run_cell, backend, engine, ran, folder, uuid.uuid4().hex, started_up=event)
        return event

    def cell(backend: Backend, engine, fault: Fault) -> tuple[Fault, concurrent.futures.Future]:
        if backend.name not in pools:
            pools[backend.name] = concurrent.futures.ThreadPoolExecutor(max_workers=backend.jobs)
            if wanted(backend, HANG):
                start(backend, engine, HANG).wait(START)
            for later in FAULTS:
                if later is not HANG and wanted(backend, later):
                    start(backend, engine, later)
        if (backend.name, fault.name) not in started:  # a test not in the run's list (a rerun)
            start(backend, engine, fault)
        return started[backend.name, fault.name]

    yield cell
    for pool in pools.values():
        pool.shutdown(wait=True)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_matrix(backend, engine, fault, cells):
    ran, seen = cells(backend, engine, fault)
    check_seen(backend, ran, seen.result(timeout=BESIDE_TIMEOUT + START + STUCK))


OVERLOADED = [BY_NAME["preload"], BY_NAME["ssh"]]


@pytest.fixture(scope="module")
def overloaded(request, shared_root):
    """backend, its engine -> (the crash faults as run, what each cell saw)
    under CPU overload.  The crashes of every backend this run checks here
    run side by side under one set of burners, started by the first test
    that asks: more load than one cell alone, for the time of one.  Each is
    its own job with its own folder and token (run_cell kills whatever each
    leaves)."""
    selected = {item.name for item in request.session.items if item.path == request.path}
    base = Path(tempfile.mkdtemp(prefix="overload-", dir=shared_root))
    seen: dict[str, list[Seen]] = {}

    def cell(backend: Backend, engine, fault: Fault) -> Seen:
        folder = Path(tempfile.mkdtemp(prefix=f"{backend.name}-{fault.name}-", dir=base))
        return run_cell(backend, engine, fault, folder, uuid.uuid4().hex, loaded=True)

    def run(backend: Backend, engine) -> tuple[list[Fault], list[Seen]]:
        faults = [backend.expects(f) for f in CRASHES]
        if backend.name not in seen:
            engines = {backend.name: engine}
            for other in OVERLOADED:
                if other is not backend and f"test_crash_under_overload[{other.name}]" in selected:
                    with contextlib.suppress(pytest.skip.Exception):  # its own test says why
                        engines[other.name] = engine_of(request, other)
            jobs = [(b, engines[b.name], b.expects(f)) for b in OVERLOADED if b.name in engines for f in CRASHES]
            with overload(), concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
                done = list(pool.map(lambda job: cell(*job), jobs))
            for b in OVERLOADED:
                seen[b.name] = [one for (ran, _, _), one in zip(jobs, done) if ran is b]
        return faults, seen[backend.name]

    yield run
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", OVERLOADED, ids=lambda b: b.name)
def test_crash_under_overload(backend, engine, overloaded):
    """The root cause comes from evidence, not from the order in which a
    loaded machine happened to report the exits.  The crashes run side by
    side under one set of burners (``overloaded``), one run per cell: the
    repeats are bench/matrix.py's (``--runs``)."""
    faults, seen = overloaded(backend, engine)
    for fault, one in zip(faults, seen):
        print(summary(backend, fault, one))
    wrong = [f"{summary(backend, fault, one)}\n  " + "\n  ".join(found) + f"\njaxrun's stderr:\n{one.err[-3000:]}"
             for fault, one in zip(faults, seen) if (found := problems(backend, fault, one, loaded=True))]
    assert len(seen) == len(faults), f"{len(seen)} cells ran of {len(faults)}"
    assert not wrong, "\n".join(wrong)
