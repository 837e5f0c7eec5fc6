"""The one place that knows which operating-system facilities exist.

jaxrun grew up on Linux and leans on a few facilities only Linux has.  Each of
them is optional: the function here that stands for it finds out whether
this system has it (by trying it, or by looking for the name it needs, never
by the platform's name) and says no where it does not, and its caller then
takes the portable path.  No other module of jaxrun touches one of these
facilities or asks which system it runs on (``tests/unit/test_portable_layer.py``
checks that).

=====================================  ====================================================
facility (Linux)                       portable path (macOS and the rest)
=====================================  ====================================================
child subreaper (``prctl``)            process-group kills, then a walk of the process
                                       tree and of the processes that carry this
                                       process's ``JAXRUN_ORPHAN_MARK`` (``core.reaper``)
inotify                                the output pump's tick (``launcher.output.filewatch``)
``F_SETPIPE_SZ``                       the system's default pipe size
``setpriority`` on a thread id         the console thread keeps the default priority
abstract Unix socket ``"\\0name"``      a socket file in a private 0700 folder
``SO_PEERCRED``                        ``LOCAL_PEERCRED`` where Python has it, else the
                                       folder's permissions alone
``/proc/PID/fd``                       none: a served controller's fork-only daemons are
                                       found by their mark or not at all
``waitid(WNOWAIT)``                    a far end kills its controller's group right after
                                       the reap, not before it (``backends.far_end``)
``/proc/self/io``                      the stall watchdog's sampler counts no I/O, only
                                       CPU time and the stack (``child.activity``)
``ip_local_port_range``                free ports are chosen below 32768 (``free_port``)
=====================================  ====================================================

(The fork server's messages need none of these: they are framed over a
stream socket, see ``wire.send_frame``.)

``JAXRUN_PORTABLE=1`` in the environment makes every answer here "no", on
Linux too: that is how the tests prove the portable paths without a Mac.  It
is read here and nowhere else.  Nothing here imports jax.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import random
import socket
import struct
import sys
import tempfile
import threading
import uuid

from jaxrun import contract

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SOCKET_FOLDER = "jaxrun-sockets-{uid}"  # under the temporary folder, one per user
LONGEST_SOCKET_PATH = 100  # sun_path holds 104 bytes on macOS, 108 on Linux

_claimed: list[bool] = []  # the answer of claim_orphans(), once asked


def forced() -> bool:
    """Whether ``JAXRUN_PORTABLE`` turns every Linux-only facility off."""
    return os.environ.get(contract.PORTABLE, "") not in ("", "0")


def _libc():
    """The C library's functions, or None where ctypes cannot load it."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None


# -- processes -------------------------------------------------------------------
def claim_orphans() -> bool:
    """Become a child subreaper: orphaned descendants (a daemon's grandchild
    after ``setsid()`` and a double fork) are reparented to this process
    instead of init, so they stay within reach.  False where the kernel has
    no such thing."""
    claimed = False
    if not forced():
        libc = _libc()
        prctl = getattr(libc, "prctl", None)
        claimed = prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    _claimed[:] = [claimed]
    return claimed


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
    return _first_number("/proc/sys/kernel/pid_max", 32768)


def _first_number(path: str, default: int) -> int:
    """The first number in a file of /proc/sys, or ``default``."""
    try:
        with open(path) as f:
            return default if forced() else int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


# -- ports -----------------------------------------------------------------------
def free_port(host: str = "127.0.0.1", low: int = 10000) -> int:
    """A port free on ``host`` (one address, never a wildcard), at random below
    the ephemeral range: bind(0)'s can become an outgoing connection's source
    port before its listener binds it (jax then fails to "add port to server")."""
    high = ephemeral_low()
    choices = [random.randrange(low, high) for _ in range(64)] if high - low >= 1024 else []
    for port in [*choices, 0]:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            with contextlib.suppress(OSError):
                s.bind((host, port))
                return s.getsockname()[1]
    raise OSError(f"no free port on {host}")


def ephemeral_low() -> int:
    """Where the source ports of outgoing connections begin (32768 where
    unknown: Linux's default, below macOS's 49152)."""
    return _first_number("/proc/sys/net/ipv4/ip_local_port_range", 32768)


# -- the output pump -------------------------------------------------------------
def inotify():
    """(inotify_init1, inotify_add_watch) from the C library, or None where
    there is no inotify (the pump then keeps ticking)."""
    if forced():
        return None
    libc = _libc()
    init, add_watch = getattr(libc, "inotify_init1", None), getattr(libc, "inotify_add_watch", None)
    if init is None or add_watch is None:
        return None
    return init, add_watch


def set_pipe_size(fd: int, size: int) -> bool:
    """Make a pipe hold ``size`` bytes.  False where pipes have a fixed size,
    or ``size`` is over the system's limit: the pipe keeps its default."""
    import fcntl

    command = getattr(fcntl, "F_SETPIPE_SZ", None)
    if forced() or command is None:
        return False
    try:
        fcntl.fcntl(fd, command, size)
        return True
    except OSError:
        return False


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


# -- the preloading server of an SSH host --------------------------------------------
@functools.lru_cache(maxsize=1)
def _abstract_sockets() -> bool:
    """Whether Unix sockets may have abstract names: bind one and see."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.bind(f"\0jaxrun-probe-{os.getpid()}-{uuid.uuid4().hex}")
        return True
    except (OSError, ValueError):  # ValueError: an embedded NUL where names are paths
        return False
    finally:
        probe.close()


def peer_uid(conn: socket.socket) -> int | None:
    """The user id of the process at the other end of a Unix socket; None
    where the system does not say (then only the socket's folder keeps
    other users out)."""
    if forced():
        return None
    if hasattr(socket, "SO_PEERCRED"):  # struct ucred: pid, uid, gid
        try:
            return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        except OSError:
            return None
    if hasattr(socket, "LOCAL_PEERCRED"):  # struct xucred: version, uid, ...; level SOL_LOCAL (0)
        try:
            version, uid = struct.unpack("2I", conn.getsockopt(0, socket.LOCAL_PEERCRED, 76)[:8])
            return uid if version == 0 else None
        except (OSError, struct.error):
            return None
    return None


def peer_pid(conn: socket.socket) -> int | None:
    """The process id at the other end of a Unix socket, or None."""
    if forced():
        return None
    if hasattr(socket, "SO_PEERCRED"):
        try:
            return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        except OSError:
            return None
    if hasattr(socket, "LOCAL_PEERPID"):
        try:
            return struct.unpack("i", conn.getsockopt(0, socket.LOCAL_PEERPID, 4))[0]
        except OSError:
            return None
    return None


def private_socket_folder() -> str | None:
    """This user's folder for socket files, made 0700 if new; None if what
    is there is not a folder that only this user can enter (someone else's,
    a symlink, too open), since a socket file's own mode is no defence."""
    base = tempfile.gettempdir()
    folder = os.path.join(base, SOCKET_FOLDER.format(uid=os.getuid()))
    if len(folder) + 26 > LONGEST_SOCKET_PATH:  # a long $TMPDIR: the socket's name would not fit
        folder = os.path.join("/tmp", SOCKET_FOLDER.format(uid=os.getuid()))
    try:
        return None if contract.private_folder(folder) else folder
    except OSError:
        return None


def server_address(name: str) -> str | None:
    """Where the host's server called ``name`` listens, and its agents
    connect: the abstract name where there are abstract sockets and peer
    credentials to check who connects, else a socket file in this user's
    private folder.  None: nowhere safe (the agents start their controllers
    themselves)."""
    if _abstract_sockets() and not forced() and hasattr(socket, "SO_PEERCRED"):
        return "\0" + name
    folder = private_socket_folder()
    if folder is None:
        return None
    return os.path.join(folder, hashlib.sha256(name.encode()).hexdigest()[:20] + ".sock")


def is_abstract(address: str) -> bool:
    return address.startswith("\0")


# -- resource figures ------------------------------------------------------------------
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


# -- what -v says ----------------------------------------------------------------------
def notes() -> list[str]:
    """One line for each facility this launcher goes without, for ``-v``."""
    lines = []
    if forced():
        lines.append(f"jaxrun: {contract.PORTABLE} is set: every Linux-only facility is off")
    if _claimed == [False]:
        lines.append("jaxrun: no subreaper on this system: daemons that leave the process group are found "
                     f"by a process-tree walk and by the {contract.ORPHAN_MARK} in their environment")
    if inotify() is None:
        lines.append("jaxrun: no inotify on this system: quiet log files are polled ten times a second")
    if not thread_ids_are_pids():
        lines.append("jaxrun: no per-thread priority on this system: the console thread competes with "
                     "the job for the CPU")
    import fcntl

    if forced() or not hasattr(fcntl, "F_SETPIPE_SZ"):
        lines.append("jaxrun: pipes cannot be enlarged on this system: remote output is read in "
                     "smaller pieces")
    return lines


def jupyter_data_dir(environ=os.environ) -> str:
    """Jupyter's per-user data folder, where jupyter_core looks on this system."""
    if environ.get("JUPYTER_DATA_DIR"):
        return environ["JUPYTER_DATA_DIR"]
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Jupyter")
    return os.path.join(environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share"), "jupyter")
