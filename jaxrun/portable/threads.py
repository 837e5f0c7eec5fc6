"""Threads and what this process does: whether a thread's native id names
it to the kernel, a thread's own priority, and the I/O counters, each
thread's CPU time and each thread's wait for a CPU that the stall
watchdog's sampler reads (``child.watch.activity``)."""

from __future__ import annotations

import os
import sys
import threading

try:
    import resource
except ImportError:  # not on Windows
    resource = None

from jaxrun.portable.probe import forced


def main_native_id() -> int | None:
    """The main thread's native id, right in a process forked from another
    (the preload server's children): there Python 3.11's
    ``threading.main_thread().native_id`` still holds the id of the parent's
    thread that forked.  Asked from the main thread, its own id; on Linux
    from another thread, the process id (the main thread leads the thread
    group, and after a fork the forking thread does and is the main one)."""
    main = threading.main_thread()
    if threading.current_thread() is main:
        return threading.get_native_id()
    if sys.platform.startswith("linux") and not forced():
        return os.getpid()
    return main.native_id


def thread_ids_are_pids() -> bool:
    """Whether a thread's native id names that thread to ``setpriority``, as
    where the main thread's id is the process id (elsewhere it may be a pid)."""
    try:
        return not forced() and main_native_id() == os.getpid()
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
    sockets alike), less the calling thread's own; None where the system
    does not count them, or not per thread.

    The calling thread is the stall watchdog's sampler: its reads of
    ``/proc/self/task/*/stat`` and ``schedstat`` (about 330 bytes a thread
    at each look, and this file itself) are counted in the process's
    ``rchar`` like any other read, and with 300 threads they passed for
    progress at every look (issue 61).  The kernel keeps the counts per
    thread too (``/proc/self/task/TID/io``), so the sampler's own are left
    out exactly.  The process's count is read first: the thread's read
    after it includes that one read, a near-constant that two looks cancel."""
    if forced():
        return None
    everyone, own = _io_counts("/proc/self/io"), _io_counts(f"/proc/self/task/{threading.get_native_id()}/io")
    if everyone is None or own is None:
        return None
    return everyone - own


def _io_counts(path: str) -> int | None:
    """rchar + wchar of one of the kernel's io files."""
    try:
        with open(path, "rb") as f:
            text = f.read(4096)
    except OSError:
        return None
    fields = (line.partition(b":") for line in text.splitlines())
    try:
        return sum(int(value) for key, _, value in fields if key in (b"rchar", b"wchar"))
    except ValueError:
        return None


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


def _each_thread(name: str, size: int, value) -> dict[int, float] | None:
    """``value(text)`` of each thread's ``/proc/self/task/TID/NAME``, by its
    native id; None where the system has no such file."""
    if forced():
        return None
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    said = {}
    for tid in tids:
        try:
            fd = os.open(f"/proc/self/task/{tid}/{name}", os.O_RDONLY)
        except OSError:
            continue  # it ended between the two looks, or the kernel keeps no such file
        try:
            text = os.read(fd, size)
        except OSError:
            continue
        finally:
            os.close(fd)
        try:
            said[int(tid)] = value(text)
        except (IndexError, ValueError):
            continue
    return said or None


def _stat_cpu(text: bytes) -> float:
    # After the name in parentheses (which may hold anything): the state,
    # then fields 4 to 13, then utime and stime (proc(5)'s fields 14, 15).
    fields = text[text.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_cpu() -> dict[int, float] | None:
    """CPU seconds (user and system) each thread of this process has used so
    far, by its native id; None where the system does not say per thread."""
    return _each_thread("stat", 1024, _stat_cpu)


def thread_waits() -> dict[int, float] | None:
    """Seconds each thread of this process has spent ready to run but
    waiting for a CPU (the run queue's delay, ``/proc/self/task/TID/schedstat``'s
    second field), by its native id; None where the system does not say.
    On a loaded machine a thread that works or spins gets a small share of a
    core and waits for the rest; a parked thread does neither."""
    return _each_thread("schedstat", 256, lambda text: int(text.split()[1]) / 1e9)


def preempted() -> int | None:
    """How many times the kernel has taken a CPU from a thread of this
    process that still wanted it (involuntary context switches), the
    calling thread's left out; None where the system does not say.  Two
    system calls (``getrusage``), whatever the number of threads: a thread
    that spins gets preempted again and again, even where the load leaves
    it almost no CPU, and a parked one never is."""
    if forced() or resource is None or not hasattr(resource, "RUSAGE_THREAD"):
        return None
    try:
        return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
    except OSError:
        return None


def thread_switches(tids) -> dict[int, tuple[int, int]]:
    """(voluntary, involuntary) context switches so far of each of these
    threads of this process (``/proc/self/task/TID/status``), by native id;
    a thread the system says nothing of is left out.  A thread that never
    switched voluntarily between two looks never slept, parked or waited
    on anything in between: it was always ready to run."""
    if forced():
        return {}
    said = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/status", "rb") as f:
                text = f.read(4096)
        except OSError:
            continue
        counts = {}
        for line in text.splitlines():
            key, _, value = line.partition(b":")
            if key in (b"voluntary_ctxt_switches", b"nonvoluntary_ctxt_switches"):
                counts[key] = int(value)
        if len(counts) == 2:
            said[tid] = (counts[b"voluntary_ctxt_switches"], counts[b"nonvoluntary_ctxt_switches"])
    return said


def _task_file(tid: int | None, name: str) -> int | None:
    """A descriptor of ``/proc/self/task/TID/NAME``, kept open to be read again
    (``os.pread``); None where the system does not say."""
    if tid is None or forced():
        return None
    try:
        return os.open(f"/proc/self/task/{tid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class RunDelay:
    """Seconds one thread of this process has spent ready to run but without
    a CPU (its run queue's delay) so far, its ``schedstat`` kept open and
    read again at each call (0.4 us, against 3.5 us to open it each time);
    0.0 where the system does not say."""

    def __init__(self, tid: int | None) -> None:
        self.fd = _task_file(tid, "schedstat")

    def __call__(self) -> float:
        found = self.both()
        return 0.0 if found is None else found[1]

    def both(self) -> tuple[float, float] | None:
        """(its CPU seconds, its seconds ready to run without a CPU) so far,
        from one read; None where the system does not say."""
        if self.fd is None:
            return None
        try:
            fields = os.pread(self.fd, 256, 0).split()
            return int(fields[0]) / 1e9, int(fields[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return None


class ThreadRunning:
    """Whether one thread of this process is on a CPU or ready to run now
    (its state ``R``), not asleep (``S``, ``D``: a sleep, a lock, a read),
    from its ``stat`` kept open and read again at each call; None where the
    system does not say."""

    def __init__(self, tid: int | None) -> None:
        self.fd = _task_file(tid, "stat")

    def __call__(self) -> bool | None:
        if self.fd is None:
            return None
        try:
            text = os.pread(self.fd, 512, 0)
        except OSError:
            return None
        at = text.rfind(b")")
        return None if at < 0 or len(text) < at + 3 else text[at + 2:at + 3] == b"R"


class Throttling:
    """Seconds this process's CPU group has been held back by its CPU quota
    so far (a container's CPU limit, a cgroup's ``cpu.cfs_quota_us``): its
    threads wanted the CPU and the quota said no.  Read from the group's
    ``cpu.stat`` (cgroup v1's ``throttled_time`` in ns, v2's
    ``throttled_usec``); the group is looked up again every ``LOOK_AGAIN``
    reads, as a process may be moved.  0.0 where the system does not say."""

    LOOK_AGAIN = 50

    def __init__(self) -> None:
        self.path: str | None = None
        self.fd: int | None = None  # the group's cpu.stat, kept open
        self.reads = 0

    def _find(self) -> str | None:
        try:
            with open("/proc/self/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, group = line.split(":", 2)
            if "cpu" in controllers.split(","):  # v1
                for mount in (controllers, "cpu", "cpu,cpuacct"):
                    path = os.path.join("/sys/fs/cgroup", mount, group.lstrip("/"), "cpu.stat")
                    if os.path.exists(path):
                        return path
        unified = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
        for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            if unified:
                path = os.path.join(base, unified[0].lstrip("/"), "cpu.stat")
                if os.path.exists(path):
                    return path
        return None

    def __call__(self) -> float:
        if forced():
            return 0.0
        if self.reads % self.LOOK_AGAIN == 0:
            self._reopen(self._find())
        self.reads += 1
        if self.fd is None:
            return 0.0
        try:
            for line in os.pread(self.fd, 512, 0).splitlines():
                name, _, value = line.partition(b" ")
                if name == b"throttled_time":
                    return int(value) / 1e9
                if name == b"throttled_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return 0.0

    def _reopen(self, path: str | None) -> None:
        if path == self.path and self.fd is not None:
            return
        self.close()
        self.path = path
        if path is not None:
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.fd = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
