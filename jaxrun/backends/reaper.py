"""Leave no process behind, daemons included.

Killing a controller's process group misses a grandchild that called
``setsid()`` (a daemon, a double fork): it leaves the group, and its parent's
death hands it to init, out of reach.  On Linux a process can claim such
orphans instead: as a "child subreaper" (``PR_SET_CHILD_SUBREAPER``) it
becomes their parent, so every process its children start stays among its
descendants, and one walk over them (psutil) finds what is left at the end.
jaxrun and its far-end agents each claim this for their own tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from typing import Sequence

import psutil

PR_SET_CHILD_SUBREAPER = 36
REAP_WAIT = 2.0  # for the processes just SIGKILLed to be gone


def become_subreaper() -> bool:
    """Claim this process's orphaned descendants; False where the kernel cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants() -> set[tuple[int, float]]:
    """(pid, start time) of every living descendant: a pid alone may be reused."""
    found = set()
    try:
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                found.add((proc.pid, proc.create_time()))
    except psutil.Error:
        pass
    return found


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
            if proc.ppid() != own:
                proc.wait(max(0.0, end - time.monotonic()))  # a deeper one: its parent collects it
                continue
            while time.monotonic() < end:  # ours: collect it, or it stays a zombie
                pid, _ = os.waitpid(proc.pid, os.WNOHANG)
                if pid:
                    break
                time.sleep(0.01)
        except (psutil.Error, ChildProcessError, OSError):
            pass
    return [p.pid for p in targets]


def kill_holders(fds: Sequence[int], within: int) -> list[int]:
    """SIGKILL every descendant of process ``within`` that holds one of the
    pipes or sockets ``fds`` are open on.  For a controller forked by a host's
    preloading server: its daemons are the server's orphans, not ours, but
    they hold the session's stdout and stderr, and the session (so the job)
    would not end while they live."""
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
        folder = f"/proc/{proc.pid}/fd"
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in targets:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signal.SIGKILL)
                    killed.append(proc.pid)
                break
    return killed
