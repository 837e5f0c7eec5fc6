"""Leave no process behind, daemons included.

Killing a controller's process group misses a grandchild that called
``setsid()`` (a daemon, a double fork): it leaves the group, and its parent's
death hands it to init, out of reach.  On Linux a process can claim such
orphans instead: as a "child subreaper" (``PR_SET_CHILD_SUBREAPER``) it
becomes their parent, so every process its children start stays among its
descendants, and one walk over them (psutil) finds what is left at the end.
jaxrun and its far-end agents each claim this for their own tree.

Where no process can (macOS, or ``JAXRUN_PORTABLE=1``: see
:mod:`jaxrun.portable`), a daemon's orphan goes to init, out of the tree.  So
the process marks its environment instead (``JAXRUN_ORPHAN_MARK``, a value of
its own), and every process it starts afterwards inherits the mark, however
far it wanders: the walk at the end covers this user's processes that carry
it, besides the tree.  That is why a process claims before it starts
anything.  What the mark misses: a daemon that replaces its environment, and
one forked (without an exec) from a controller that a host's preloading
server forked, whose environment block is the server's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Sequence

import psutil

from jaxrun import contract, portable

REAP_WAIT = 2.0  # for the processes just SIGKILLed to be gone

_mark: list[str] = []  # this process's orphan mark, once it has one


def kill_group(pgid: int, signum: int) -> bool:
    """Signal a whole process group; False when it is gone (or not ours)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# The launcher's asks of a controller (a stack dump, a trace) are for the
# controller alone.  Its group also holds what the script started (a data
# loader's workers, a tool it runs), and SIGUSR1's or SIGUSR2's default
# action ends a process that has no handler for it: a probe of a healthy job
# killed its loader's workers.
ASKS = frozenset({signal.SIGUSR1, contract.PROFILE_SIGNAL})


class ProcessGroup:
    """A controller's process group, signalled only while its leader is unreaped.
    The asks (``ASKS``) go to the leader alone.

    Once the leader has been reaped, its pid, and so the group's id, may be
    given to an unrelated process: a signal sent after that could hit a
    stranger's group.  ``reaped()`` closes the door, under the same lock
    that every ``send`` takes, so a signal races no reap."""

    def __init__(self, pgid: int):
        self.pgid = pgid
        self._lock = threading.Lock()
        self._reaped = False

    def send(self, signum: int) -> bool:
        with self._lock:
            if self._reaped:
                return False
            if signum not in ASKS:
                return kill_group(self.pgid, signum)
            try:
                os.kill(self.pgid, signum)
            except (ProcessLookupError, PermissionError):
                return False
            return True

    def reaped(self) -> None:
        with self._lock:
            self._reaped = True

    @property
    def is_reaped(self) -> bool:
        return self._reaped


def become_subreaper() -> bool:
    """Claim this process's orphaned descendants; where the kernel cannot,
    mark the environment that this process's children will inherit, and
    return False."""
    if portable.claim_orphans():
        return True
    if not _mark:
        _mark.append(f"{os.getpid()}-{uuid.uuid4().hex}")
    os.environ[contract.ORPHAN_MARK] = _mark[0]
    return False


def descendants() -> set[tuple[int, float]]:
    """(pid, start time) of every living descendant, and of every process
    that carries this process's orphan mark: a pid alone may be reused."""
    found = set()
    try:
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                found.add((proc.pid, proc.create_time()))
    except psutil.Error:
        pass
    return found | marked()


def marked() -> set[tuple[int, float]]:
    """(pid, start time) of every other process whose environment carries
    this process's orphan mark (none where it has no mark)."""
    if not _mark:
        return set()
    found, me = set(), os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if proc.environ().get(contract.ORPHAN_MARK) == _mark[0]:
                found.add((proc.pid, proc.create_time()))
    return found


def ended(proc: psutil.Process) -> bool:
    """Gone, or dead and waiting for its parent (init, for an orphan)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def kill_descendants(spare: set[tuple[int, float]] = frozenset()) -> list[int]:
    """SIGKILL every descendant not in ``spare`` and collect those that were
    our orphans (no Popen waits for them).  Returns the pids killed."""
    targets = []
    for proc_id in descendants() - set(spare):
        try:
            proc = psutil.Process(proc_id[0])
            if proc.status() == psutil.STATUS_ZOMBIE:
                targets.append(proc)  # dead already; only to be collected
                continue
            proc.send_signal(signal.SIGKILL)
            targets.append(proc)
        except psutil.Error:
            pass
    own = os.getpid()
    end = time.monotonic() + REAP_WAIT
    for proc in targets:
        try:
            if proc.ppid() != own:  # a deeper one, or a marked orphan: its parent collects it
                while not ended(proc) and time.monotonic() < end:
                    time.sleep(0.01)
                continue
            while time.monotonic() < end:  # ours: collect it, or it stays a zombie
                pid, _ = os.waitpid(proc.pid, os.WNOHANG)
                if pid:
                    break
                time.sleep(0.01)
        except (psutil.Error, ChildProcessError, OSError):
            pass
    return [p.pid for p in targets]


def kill_holders(fds: Sequence[int], within: int | None) -> list[int]:
    """SIGKILL every descendant of process ``within`` that holds one of the
    pipes or sockets ``fds`` are open on.  For a controller forked by a host's
    preloading server: its daemons are the server's orphans, not ours, but
    they hold the session's stdout and stderr, and the session (so the job)
    would not end while they live.  Nothing where ``within`` is unknown, or
    where the system does not list another process's descriptors (then the
    server has no orphans either: they went to init)."""
    if within is None:
        return []
    targets = set()
    for fd in fds:
        try:
            st = os.fstat(fd)
            targets.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    killed = []
    try:
        candidates = psutil.Process(within).children(recursive=True)
    except psutil.Error:
        return killed
    for proc in candidates:
        held = portable.open_file_ids(proc.pid)
        if held is None:
            break
        if held & targets:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
                killed.append(proc.pid)
    return killed
