"""Processes: the child subreaper, another process's open files, a child
that has ended but is not reaped yet, how many process ids there are, the
CPU time of this process's descendants, and how long ago this process started."""

from __future__ import annotations

import os
import time

from jaxrun.portable.probe import first_number, forced, libc
from jaxrun.portable.threads import TICKS

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>

_claimed: list[bool] = []  # the answer of claim_orphans(), once asked


def claim_orphans() -> bool:
    """Become a child subreaper: orphaned descendants (a daemon's grandchild
    after ``setsid()`` and a double fork) are reparented to this process
    instead of init, so they stay within reach.  False where the kernel has
    no such thing."""
    claimed = False
    if not forced():
        prctl = getattr(libc(), "prctl", None)
        claimed = prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    _claimed[:] = [claimed]
    return claimed


def refused_orphans() -> bool:
    """Whether this process asked to be a subreaper and was refused."""
    return _claimed == [False]


def open_file_ids(pid: int) -> set[tuple[int, int]] | None:
    """(device, inode) of every file, pipe and socket process ``pid`` holds
    open; None where this system cannot list another process's descriptors
    (psutil lists regular files only, and no pipes, on macOS)."""
    folder = f"/proc/{pid}/fd"
    if forced() or not os.path.isdir("/proc/self/fd"):
        return None
    found = set()
    try:
        names = os.listdir(folder)
    except OSError:
        return found  # gone, or not ours to look at
    for name in names:
        try:
            st = os.stat(os.path.join(folder, name))
        except OSError:
            continue
        found.add((st.st_dev, st.st_ino))
    return found


def ended_unreaped(pid: int, block: bool) -> bool | None:
    """Whether child ``pid`` has ended, leaving it unreaped: a zombie holds
    its pid, so its group's id cannot be reused meanwhile.  With ``block``,
    once it has.  False also when it is not ours to wait for (reaped
    already); None where the system cannot leave it unreaped (Python has no
    ``os.waitid`` on macOS)."""
    waitid = None if forced() else getattr(os, "waitid", None)
    if waitid is None:
        return None
    try:
        return waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)) is not None
    except ChildProcessError:
        return False


def own_age() -> float | None:
    """Seconds since this process started, to the clock tick: its start in
    ``/proc/self/stat`` (proc(5)'s field 22, in ticks since boot) against
    the time since boot.  None where the system does not say."""
    if forced() or not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    try:
        with open("/proc/self/stat", "rb") as f:
            text = f.read()
        started = int(text[text.rfind(b")") + 2:].split()[19]) / TICKS
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError):
        return None


def pid_max() -> int:
    """The largest process id plus one: how many processes and threads the
    system can number (where unknown, Linux's default; macOS has more)."""
    return first_number("/proc/sys/kernel/pid_max", 32768)


def descendants_cpu(states: bool = False) -> dict | None:
    """CPU seconds (user and system) used so far by each process this one
    started, and theirs in turn, that still runs (or is not reaped yet), by
    pid; None where the system cannot say (the caller then asks psutil).
    With ``states``, each value is (CPU seconds, whether it is running or
    ready to run now: proc(5)'s state R, read from the same file; a disk
    wait, D, is not: a hung mount must not look like work).  A tool that the load starves gets almost no CPU (at
    nice 19 beside two busy loops, none to the clock tick in a second), and
    its wait for a CPU is counted only once it gets one; but it is ready to
    run at every look, and a parked one never is.

    Cheap where it can be, since the stall watchdog asks at every look in
    every process: a process without children is found so by one system
    call; where the kernel lists each thread's children
    (``/proc/PID/task/TID/children``) only this process's own tree is read;
    elsewhere each process of the host once (``/proc/PID/stat`` holds its
    parent and its CPU), but only while this one has a child."""
    if forced():
        return None
    waitid = getattr(os, "waitid", None)
    if waitid is None or not os.path.isdir("/proc/self/task"):
        return None
    try:
        waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # leaves an ended child unreaped
    except ChildProcessError:
        return {}  # no child at all: no descendant either
    except OSError:
        return None
    me = os.getpid()
    used = _tree_cpu(me) if _lists_children() else _scan_cpu(me)
    return used if states else {pid: cpu for pid, (cpu, _) in used.items()}


_listing: list[bool] = []  # whether the kernel lists a thread's children, once asked


def _lists_children() -> bool:
    if not _listing:
        _listing.append(os.path.exists(f"/proc/self/task/{os.getpid()}/children"))
    return _listing[0]


def _stat(pid: int | str) -> tuple[int, float, bool] | None:
    """A process's parent, its CPU seconds and whether it runs or is ready
    to (its state R), from its ``/proc/PID/stat``."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None  # it ended, or it is no process
    try:
        text = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    # After the name in parentheses (which may hold anything): the state, the
    # parent (proc(5)'s field 4), ..., utime and stime (its fields 14 and 15).
    fields = text[text.rfind(b")") + 2:].split()
    try:
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, fields[0] == b"R"
    except (IndexError, ValueError):
        return None


def _children(pid: int) -> list[int]:
    """The processes each thread of ``pid`` started, as the kernel lists them."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found += [int(kid) for kid in f.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _tree_cpu(root: int) -> dict[int, tuple[float, bool]]:
    used: dict[int, tuple[float, bool]] = {}
    todo = _children(root)
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat is not None and pid not in used:
            used[pid] = stat[1:]
            todo += _children(pid)
    return used


def _scan_cpu(root: int) -> dict[int, tuple[float, bool]]:
    kids: dict[int, list[tuple[int, tuple[float, bool]]]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if name.isdigit():
            stat = _stat(name)
            if stat is not None:
                kids.setdefault(stat[0], []).append((int(name), stat[1:]))
    used: dict[int, tuple[float, bool]] = {}
    todo = [root]
    while todo:
        for pid, cpu in kids.get(todo.pop(), ()):
            if pid not in used:
                used[pid] = cpu
                todo.append(pid)
    return used
