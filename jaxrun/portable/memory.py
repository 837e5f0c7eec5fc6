"""Memory: a process's peak resident set in bytes (``ru_maxrss``'s unit
differs between systems), and the memory cgroup it runs in, which says how
many processes the OOM killer ended there."""

from __future__ import annotations

import functools
import os

from jaxrun.portable.probe import forced


@functools.cache
def _maxrss_unit() -> int:
    """Bytes per unit of ``ru_maxrss``: kilobytes on Linux and the BSDs, bytes
    on macOS.  Found by trying: this process's peak, in the right unit, is
    at least its resident set now, and in kilobytes a thousand times less."""
    import resource

    import psutil

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return 1 if peak >= psutil.Process().memory_info().rss else 1024


def maxrss_bytes(ru_maxrss: int) -> int:
    return ru_maxrss * _maxrss_unit()


class MemoryGroup:
    """The memory cgroup this process is in, where the system has cgroups
    (v2: ``memory.events`` and ``memory.max``; v1: ``memory.oom_control`` and
    ``memory.limit_in_bytes``).  Each answer is None where it cannot be read."""

    def __init__(self, folder: str | None, version: int):
        self.folder, self.version = folder, version

    @property
    def events_file(self) -> str | None:
        if self.folder is None:
            return None
        return os.path.join(self.folder, "memory.events" if self.version == 2 else "memory.oom_control")

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer has ended in this group."""
        path = self.events_file
        if path is None:
            return None
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return None

    def limit(self) -> int | None:
        """The group's memory limit in bytes; None where it has none."""
        if self.folder is None:
            return None
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        try:
            with open(os.path.join(self.folder, name)) as f:
                text = f.read().strip()
        except OSError:
            return None
        if not text.isdigit() or int(text) >= 1 << 62:  # "max", or v1's "unlimited"
            return None
        return int(text)


def memory_group() -> MemoryGroup:
    """This process's memory cgroup, from /proc/self/cgroup and the mounts
    (looked up once: every process a run starts asks)."""
    return MemoryGroup(None, 0) if forced() else MemoryGroup(*_memory_folder())


@functools.cache
def _memory_folder() -> tuple[str | None, int]:
    try:
        with open("/proc/self/cgroup") as f:
            groups = [line.rstrip("\n").split(":", 2) for line in f]
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None, 0
    for fields in mounts:
        if "-" not in fields:
            continue
        dash = fields.index("-")
        fstype, options = fields[dash + 1], fields[-1].split(",")
        root, point = fields[3], fields[4]
        for entry in groups:
            if len(entry) != 3:
                continue
            _, controllers, path = entry
            v1 = fstype == "cgroup" and "memory" in controllers.split(",") and "memory" in options
            v2 = fstype == "cgroup2" and controllers == ""
            if not (v1 or v2):
                continue
            inside = os.path.relpath(path, root) if path.startswith(root) else None
            if inside is None or inside.startswith(".."):
                continue
            folder = os.path.normpath(os.path.join(point, inside))
            marker = "memory.oom_control" if v1 else "memory.events"
            if os.path.exists(os.path.join(folder, marker)):
                return folder, 1 if v1 else 2
    return None, 0
