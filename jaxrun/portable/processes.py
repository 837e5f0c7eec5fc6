"""Processes: the child subreaper, another process's open files, a child
that has ended but is not reaped yet, and how many process ids there are."""

from __future__ import annotations

import os

from jaxrun.portable.probe import first_number, forced, libc

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


def pid_max() -> int:
    """The largest process id plus one: how many processes and threads the
    system can number (where unknown, Linux's default; macOS has more)."""
    return first_number("/proc/sys/kernel/pid_max", 32768)
