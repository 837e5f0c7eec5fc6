"""Traces of every process of a job, as one multi-host session XProf reads.

Every process is started with a trace folder of its own
(``contract.PROFILE_DIR``: ``profiling/process-R`` in its attempt's log
folder; a far end that keeps it elsewhere says so in its environment).  A
trace is asked for the same way on every backend: the profile signal
(``contract.PROFILE_SIGNAL``) to every running process through the
supervisor (a ``Forward`` event, which each backend's ``send`` carries),
once to start and once to stop; the child takes the trace itself
(``child.watch.profiling``).  Then each process's files come home
(``Backend.bring_home``: nothing to do for those written here) and are moved
into one session of the run's log folder::

    LOG_DIR/profile/plugins/profile/SESSION/HOST-pRANK.xplane.pb

a host name per process, even where several share a machine, which is how
XProf shows one multi-host session.  The launcher moves and renames files;
it never reads what jax wrote.

One ``Profiler`` serves the whole run: each attempt's supervisor attaches
it at its start and detaches it at its end; ``--profile START:SECONDS``
takes its trace START seconds after every process of an attempt joined
(the first attempt that runs that long; a job of one process: after its
start), and ``jaxrun profile`` asks through the control channel
(``trace``).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import shlex
import shutil
import stat
import threading
import time
from collections.abc import Callable, Sequence

from jaxrun import contract
from jaxrun.core.backend import Backend, Interrupted, RunHooks, start_thread, wait_until
from jaxrun.core.events import Forward
from jaxrun.core.spec import ProcessSpec
from jaxrun.wire.inspect import TRACE_SETTLE_WAIT

GATHERED = "profile"  # the run's log folder's: what XProf opens (its --logdir)
WORK = "profiling"  # an attempt's log folder's: where each process writes its own
# After the stop, how long the processes get to write their traces (a
# large trace takes seconds to serialize) and to bring them home.
SETTLE_WAIT = TRACE_SETTLE_WAIT
MAX_SECONDS = contract.PROFILE_MAX_SECONDS / 2  # the longest trace asked for: well within the child's own limit
LONGEST_START = 1e9  # --profile's START at most: longer waits overflow


class NotNow(Exception):
    """No trace can be taken now: why, in one line."""


def work_folder(log_dir: str, rank: int) -> str:
    """Where process ``rank`` of the attempt whose log folder is ``log_dir``
    writes its traces: in its ``profiling``, which the process makes at its
    first trace; where another user made that first (a team's log folder),
    in a private folder of a random name beside it, made here."""
    return contract.process_trace_folder(contract.folder_to_use(log_dir, WORK), rank)


def parse_window(text: str) -> tuple[float, float]:
    """``--profile START:SECONDS``: (start, seconds); ValueError says what is wrong."""
    start, colon, seconds = text.partition(":")
    if not colon:
        raise ValueError(f"{text!r} is not START:SECONDS (e.g. 30:5: a 5 s trace, 30 s after every process joined)")
    values = []
    for name, word in (("START", start), ("SECONDS", seconds)):
        try:
            value = float(word)
        except ValueError:
            raise ValueError(f"{name} {word.strip()!r} is not a number of seconds") from None
        if not 0 <= value <= LONGEST_START:  # nan too
            raise ValueError(f"{name} must be a number of seconds from 0 to {LONGEST_START:.0f} (got {word.strip()})")
        values.append(value)
    check_seconds(values[1])
    return values[0], values[1]


def check_seconds(seconds: float) -> None:
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"a trace lasts more than 0 and at most {MAX_SECONDS:g} seconds (got {seconds:g})")


def host_label(host: str | None, rank: int) -> str:
    """The host name XProf shows for process ``rank``: its machine's, and its rank."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in (host or "")) or "host"
    return f"{safe}-p{rank}"


def renamed(file_name: str, host: str | None, rank: int) -> str:
    """What a file jax named after its host (``HOST.xplane.pb``) is called in
    the gathered session: ``HOST-pRANK.xplane.pb``; a file of another name
    keeps it, after the label."""
    kind = file_name[len(host) + 1:] if host and file_name.startswith(host + ".") else file_name
    return f"{host_label(host, rank)}.{kind}"


def session_name(now: float) -> str:
    """A session's folder, named as jax names its own (its start, local time)."""
    return time.strftime("%Y_%m_%d_%H_%M_%S", time.localtime(now))


def new_session(sessions: int, now: float) -> str:
    """A new session folder (0700) in the held folder ``sessions``, that no
    earlier trace has: named by ``now``, with a count after it where a
    trace of the same second has it.  Made here, never one that was there."""
    base = session_name(now)
    name, count = base, 1
    while True:
        try:
            os.mkdir(name, 0o700, dir_fd=sessions)
            return name
        except FileExistsError:
            count += 1
            name = f"{base}-{count}"


def open_command(root: str) -> str:
    return f"xprof --logdir={shlex.quote(root)} --port=6006"


@dataclasses.dataclass(frozen=True)
class Gathered:
    """One process's part of a session: the files it gave, or why none."""

    rank: int
    files: tuple[str, ...] = ()
    problem: str | None = None


def gather(work: str, rank: int, into: int) -> Gathered:
    """Move the newest finished trace in ``work`` into the held session
    folder ``into``, each file renamed for its process; older ones are
    dropped (a trace nobody gathered: the process missed an ask).  Only a
    folder of this user's alone is read (``contract.owned``), held by
    descriptor: only this user's regular files move, and no link is followed."""
    try:  # the attempt's ``profiling`` and the process's folder in it
        held = contract.open_chain(work, 2, make=False)
    except contract.NotOurs as e:
        return Gathered(rank, problem=f"its trace folder {work} or its parent is not yours alone ({e}): nothing "
                                      "in it was read")
    except OSError:
        held = -1
    try:
        return _gather(held, rank, into)
    finally:
        if held >= 0:
            os.close(held)


def _gather(work: int, rank: int, into: int) -> Gathered:
    over, taking = contract.trace_sessions(work) if work >= 0 else ([], [])
    if not over:
        return Gathered(rank, problem=f"its trace was not written within {SETTLE_WAIT:g} s of the stop (a large "
                                      "trace still being written?)" if taking
                        else "no trace came (it had ended, or its script handles SIGUSR2 itself?)")
    for stale in over[:-1]:
        shutil.rmtree(stale, ignore_errors=True, dir_fd=work)
    try:
        session = contract.open_folder(over[-1], work, inside_private=True)
    except OSError as e:
        return Gathered(rank, problem=f"its trace {over[-1]} cannot be read ({e.strerror or e})")
    try:
        said = contract.trace_marker(session)
        moved = []
        for _, _, names, folder in os.fwalk(os.path.join("plugins", "profile"), dir_fd=session):
            for name in sorted(names):
                st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                    target = renamed(name, said["host"], rank)
                    os.replace(name, target, src_dir_fd=folder, dst_dir_fd=into)
                    moved.append(target)
    finally:
        os.close(session)
    shutil.rmtree(over[-1], ignore_errors=True, dir_fd=work)
    if said["error"] and not moved:
        return Gathered(rank, problem=said["error"])
    return Gathered(rank, tuple(moved), None if moved else "its trace held no file")


@dataclasses.dataclass(frozen=True)
class Traced:
    """A gathered session: where it is, and each process's part."""

    root: str  # what XProf opens
    folder: str  # the session's own folder
    parts: tuple[Gathered, ...]

    def lines(self) -> list[str]:
        return contract.session_lines("jaxrun: profile:", "", self.parts, self.folder, open_command(self.root))


@dataclasses.dataclass
class _Attempt:
    specs: Sequence[ProcessSpec]
    log_dir: str
    events: queue.SimpleQueue
    backend: Backend
    hooks: RunHooks
    note: Callable[[str], None]
    ranks: set[int]  # those not yet joined
    joined: bool = False
    over: threading.Event = dataclasses.field(default_factory=threading.Event)


class Profiler:
    """The run's traces, one at a time: ``window`` is --profile's (start, seconds)."""

    def __init__(self, log_dir: str, window: tuple[float, float] | None = None):
        self.root = os.path.join(log_dir, GATHERED)
        self.window = window
        self.lock = threading.Lock()  # one trace at a time
        self.attempt: _Attempt | None = None
        self.timed = False  # --profile's trace has begun (in some attempt)

    # -- the supervisor's calls, from its thread ------------------------------------------
    def attach(self, specs: Sequence[ProcessSpec], log_dir: str, events: queue.SimpleQueue, backend: Backend,
               hooks: RunHooks, note: Callable[[str], None]) -> None:
        self.attempt = _Attempt(list(specs), log_dir, events, backend, hooks, note,
                                {spec.rank for spec in specs} if len(specs) > 1 else {-1})
        if len(specs) == 1:
            self.joined(-1)

    def joined(self, rank: int) -> None:
        """Process ``rank`` has joined.  Once every process of the attempt has
        (at once for a job of one, which has nobody to wait for), traces may
        be taken, and --profile's timer starts."""
        attempt = self.attempt
        if attempt is None or attempt.joined:
            return
        attempt.ranks.discard(rank)
        if attempt.ranks:
            return
        attempt.joined = True
        if self.window is not None and not self.timed:
            self.timed = True
            start_thread("profile-timer", self._timed, attempt, hooks=attempt.hooks)

    def detach(self) -> None:
        if self.attempt is not None:
            self.attempt.over.set()
        self.attempt = None

    # -- a trace ---------------------------------------------------------------------------
    def _timed(self, attempt: _Attempt) -> None:
        start, seconds = self.window
        if attempt.over.wait(start):  # the next attempt whose processes all join takes it
            self.timed = False
            return
        try:
            self.trace(seconds)
        except (NotNow, Interrupted, OSError) as e:  # a trace that cannot be taken stops nothing
            attempt.note(f"jaxrun: profile: no trace: {e or 'the run is stopping'}")

    def trace(self, seconds: float) -> Traced:
        """Trace every running process for ``seconds``, bring every trace
        home into one session and say where; NotNow when no attempt has
        every process joined, or another trace is being taken.  The job's
        console says where it is too."""
        check_seconds(seconds)
        if not self.lock.acquire(blocking=False):
            raise NotNow("another trace is being taken")
        try:
            attempt = self.attempt
            if attempt is None or not attempt.joined:
                raise NotNow("the job's processes have not all joined yet")
            root, sessions = self._sessions(attempt)
            try:
                name = new_session(sessions, time.time())
                into = contract.open_folder(name, sessions)
            finally:
                os.close(sessions)
            try:
                folder = os.path.join(root, "plugins", "profile", name)
                attempt.events.put(Forward(contract.PROFILE_SIGNAL))
                if not attempt.over.wait(seconds):
                    attempt.events.put(Forward(contract.PROFILE_SIGNAL))
                traced = Traced(root, folder, self._bring_home(attempt, into))
            finally:
                os.close(into)
            for line in traced.lines():
                attempt.note(line)
            return traced
        finally:
            self.lock.release()

    def _sessions(self, attempt: _Attempt) -> tuple[str, int]:
        """What XProf opens (the run's ``profile``, or a private folder of a
        random name beside it where another user made that first), and its
        folder of sessions, held open."""
        root, problem = contract.private_folder_in(*os.path.split(self.root))
        if problem is not None:
            attempt.note(f"jaxrun: profile: {self.root} is not yours alone ({problem}): the traces are in {root}, "
                         "a private folder of a random name")
        return root, contract.open_chain(os.path.join(root, "plugins", "profile"), 3)

    def _bring_home(self, attempt: _Attempt, into: int) -> tuple[Gathered, ...]:
        """Every process's trace, once written, moved into the held session folder ``into``."""
        end = time.monotonic() + SETTLE_WAIT
        works = {spec.rank: work_folder(attempt.log_dir, spec.rank) for spec in attempt.specs}
        problems: dict[int, str] = {}
        for spec in attempt.specs:
            try:
                problem = attempt.backend.bring_home(spec, works[spec.rank], max(0.0, end - time.monotonic()))
            except OSError as e:
                problem = f"cannot bring its trace home: {e}"
            if problem:
                problems[spec.rank] = problem

        def settled() -> bool:
            return not any(contract.trace_sessions(work)[1] for work in works.values())

        wait_until(settled, attempt.hooks, timeout=max(0.0, end - time.monotonic()))
        parts = []
        for rank, work in sorted(works.items()):
            part = gather(work, rank, into)
            if part.problem and rank in problems:
                part = dataclasses.replace(part, problem=problems[rank])
            parts.append(part)
        return tuple(parts)
