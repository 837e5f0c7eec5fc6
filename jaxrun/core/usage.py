"""Resource figures of a controller, taken where it ran, as it ends.

Whoever reaps a controller (the launcher for a local one, the fork server
for a preloaded one, the host or task agent for a remote one) reaps it with
``wait4`` and keeps what the kernel says it used: the peak resident set and
the CPU seconds, its own and those of the children it waited for.  Sampling
with psutil would miss a short peak; the kernel's count does not.

A SIGKILL that nobody in jaxrun sent is usually the kernel's OOM killer.  The
cgroup's ``oom_kill`` counter says so where it is readable: if it rose while
the process ran, that is the verdict.  Elsewhere a peak within
``NEAR_LIMIT`` of the memory limit (the cgroup's, or the machine's memory)
is reported as a likely cause.
"""

from __future__ import annotations

import os
import signal
import subprocess

from jaxrun import contract, portable

NEAR_LIMIT = 0.9  # a SIGKILLed process that peaked above this share of the limit


def measure(rusage) -> contract.Resources:
    return contract.Resources(portable.maxrss_bytes(rusage.ru_maxrss),
                              round(rusage.ru_utime + rusage.ru_stime, 3))


def wait4(pid: int, flags: int = 0) -> tuple[int, int, contract.Resources | None]:
    """``os.wait4``: (pid, Popen-style returncode, resources); pid 0 when
    ``WNOHANG`` found it still running."""
    done, status, rusage = os.wait4(pid, flags)
    if done == 0:
        return 0, 0, None
    return done, os.waitstatus_to_exitcode(status), measure(rusage)


class OomWatch:
    """Started before a process, asked once it has ended: did the kernel's
    OOM killer end it?"""

    def __init__(self) -> None:
        self.group = portable.memory_group()
        self.before = self.group.oom_kills()
        self.killed = False  # jaxrun sent the SIGKILL itself: not the kernel's doing

    def saw(self, signum: int) -> None:
        """A signal jaxrun sends the process (or its group)."""
        if signum == signal.SIGKILL:
            self.killed = True

    def explain(self, returncode: int, used: contract.Resources | None) -> str | None:
        if returncode != -signal.SIGKILL or self.killed:
            return None
        after = self.group.oom_kills()
        if self.before is not None and after is not None and after > self.before:
            return (f"the kernel's OOM killer ended it (oom_kill in {self.group.events_file} "
                    f"rose from {self.before} to {after})")
        if used is None:
            return None
        limit, what = self.group.limit(), "its memory cgroup's limit"
        if limit is None:
            import psutil

            limit, what = psutil.virtual_memory().total, "this machine's memory"
        if used.peak_rss_bytes >= NEAR_LIMIT * limit:
            peak, cap = contract.format_bytes(used.peak_rss_bytes), contract.format_bytes(limit)
            return f"probably the kernel's OOM killer: it peaked at {peak} of {what} ({cap})"
        return None

    def with_verdict(self, returncode: int, used: contract.Resources | None) -> contract.Resources | None:
        oom = self.explain(returncode, used)
        if used is None or oom is None:
            return used
        return contract.Resources(used.peak_rss_bytes, used.cpu_seconds, oom)


def wait_popen(popen: subprocess.Popen, watch: OomWatch | None = None) -> tuple[int, contract.Resources | None]:
    """Wait for a Popen child with ``wait4``; Popen learns the return code as
    if it had waited itself."""
    try:
        _, code, used = wait4(popen.pid)
    except ChildProcessError:  # reaped elsewhere (Popen's own poll): no figures
        return popen.wait(), None
    popen.returncode = code
    return code, (watch.with_verdict(code, used) if watch else used)
