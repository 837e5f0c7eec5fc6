"""Threads and what this process does: whether a thread's native id names
it to the kernel, a thread's own priority, and the I/O counters and each
thread's CPU time that the stall watchdog's sampler reads (``child.activity``)."""

from __future__ import annotations

import os
import threading

from jaxrun.portable.probe import forced


def thread_ids_are_pids() -> bool:
    """Whether a thread's native id names that thread to ``setpriority``, as
    where the main thread's id is the process id (elsewhere it may be a pid)."""
    try:
        return not forced() and threading.main_thread().native_id == os.getpid()
    except AttributeError:
        return False


def lower_thread_priority(niceness: int) -> bool:
    """Give the calling thread, not its whole process, this niceness."""
    if not thread_ids_are_pids():
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
        return True
    except OSError:
        return False


def io_bytes() -> int | None:
    """Bytes this process has read and written so far (files, pipes and
    sockets alike); None where the system does not count them."""
    if forced():
        return None
    try:
        with open("/proc/self/io", "rb") as f:
            text = f.read(4096)
    except OSError:
        return None
    fields = (line.partition(b":") for line in text.splitlines())
    return sum(int(value) for key, _, value in fields if key in (b"rchar", b"wchar"))


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return 100


TICKS = _clock_ticks()


def thread_times(tid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds one thread of this process has used so
    far; None where the system does not say per thread."""
    if forced():
        return None
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            text = f.read(1024)
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()
    try:
        return int(fields[11]) / TICKS, int(fields[12]) / TICKS
    except (IndexError, ValueError):
        return None


def thread_cpu() -> dict[int, float] | None:
    """CPU seconds (user and system) each thread of this process has used so
    far, by its native id; None where the system does not say per thread."""
    if forced():
        return None
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    used = {}
    for tid in tids:
        try:
            fd = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)
        except OSError:
            continue  # it ended between the two looks
        try:
            text = os.read(fd, 1024)
        except OSError:
            continue
        finally:
            os.close(fd)
        # After the name in parentheses (which may hold anything): the state,
        # then fields 4 to 13, then utime and stime (proc(5)'s fields 14, 15).
        fields = text[text.rfind(b")") + 2:].split()
        try:
            used[int(tid)] = (int(fields[11]) + int(fields[12])) / TICKS
        except (IndexError, ValueError):
            continue
    return used or None
