"""Sockets and ports: free ports below the ephemeral range, who is at the
other end of a Unix socket, and where a host's preloading server listens
(an abstract name, or a socket file in a private folder).

Every controller imports this package (its stall sampler reads ``threads``
and ``processes``) and none of it asks for a port or a socket at start-up:
the modules only these functions need are imported inside them."""

from __future__ import annotations

import contextlib
import functools
import os
import struct
from typing import TYPE_CHECKING

from jaxrun import contract
from jaxrun.portable.probe import first_number, forced

if TYPE_CHECKING:
    import socket

SOCKET_FOLDER = "jaxrun-sockets-{uid}"  # under the temporary folder, one per user
LONGEST_SOCKET_PATH = 100  # sun_path holds 104 bytes on macOS, 108 on Linux


# -- routes ----------------------------------------------------------------------
def route_source(host: str) -> str | None:
    """This machine's IPv4 address on the route to ``host`` (a UDP socket's
    connect picks the route and sends nothing); None without a route."""
    import socket

    try:
        address = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return probe.getsockname()[0]
    except (OSError, IndexError, UnicodeError):
        return None


# -- ports -----------------------------------------------------------------------
def free_port(host: str = "127.0.0.1", low: int = 10000) -> int:
    """A port free on ``host`` (one address, never a wildcard), at random below
    the ephemeral range: bind(0)'s can become an outgoing connection's source
    port before its listener binds it (jax then fails to "add port to server")."""
    import random
    import socket

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
    return first_number("/proc/sys/net/ipv4/ip_local_port_range", 32768)


# -- the other end of a Unix socket --------------------------------------------------
def peer_uid(conn: socket.socket) -> int | None:
    """The user id of the process at the other end of a Unix socket; None
    where the system does not say (then only the socket's folder keeps
    other users out)."""
    import socket

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
    import socket

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


# -- the preloading server of an SSH host --------------------------------------------
@functools.lru_cache(maxsize=1)
def _abstract_sockets() -> bool:
    """Whether Unix sockets may have abstract names: bind one and see."""
    import socket
    import uuid

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.bind(f"\0jaxrun-probe-{os.getpid()}-{uuid.uuid4().hex}")
        return True
    except (OSError, ValueError):  # ValueError: an embedded NUL where names are paths
        return False
    finally:
        probe.close()


def temp_base_for_sockets(room: int) -> str:
    """The temporary folder, or /tmp where a socket path ``room`` bytes
    longer than it would not fit in a Unix socket's address."""
    import tempfile

    base = tempfile.gettempdir()
    return base if len(base) + room <= LONGEST_SOCKET_PATH else "/tmp"


# What a folder's path leaves a socket's name: "/coordinator-XXXXXXXX.sock".
SOCKET_NAME_ROOM = 27
RANDOM_ROOM = 9  # "-XXXXXXXX": the random name's part after SOCKET_FOLDER's
RUNTIME_FOLDER = "jaxrun"  # in $XDG_RUNTIME_DIR


def runtime_folder() -> str | None:
    """``$XDG_RUNTIME_DIR/jaxrun`` where the system gives this user a runtime
    folder (systemd's /run/user/UID: this user's alone, 0700) and a socket's
    path in it fits; None otherwise.  The folder is judged as it is, never
    through a link (lstat), and no folder above it may be another user's to
    change (``contract.trusted_path``): a link that another user controls
    would let them swap the folder after the check."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if not os.path.isabs(runtime):
        return None
    try:
        if contract.private_problem(os.lstat(runtime)) is not None:
            return None
        real, problem = contract.trusted_path(runtime)
    except OSError:
        return None
    if problem is not None or real != os.path.normpath(runtime):
        return None
    folder = os.path.join(runtime, RUNTIME_FOLDER)
    return folder if len(folder) + SOCKET_NAME_ROOM <= LONGEST_SOCKET_PATH else None


def socket_folder() -> tuple[str | None, str | None]:
    """This user's folder for socket files, and the one line that says why
    it is not the usual one (None where it is).  The runtime folder where
    there is one; else ``jaxrun-sockets-UID`` in the temporary folder (or in
    /tmp, where a long $TMPDIR leaves a socket's name no room); and where
    another user made that first (or it is a link, a file, a FIFO, open to
    others), a private folder of a random name beside it: never nothing, so
    that no other user can push a run onto a port.  (None, None): no folder
    can be made at all."""
    runtime = runtime_folder()
    if runtime is not None:
        try:
            if contract.private_folder(runtime) is None:
                return runtime, None
        except OSError:
            pass
    name = SOCKET_FOLDER.format(uid=os.getuid())
    base = temp_base_for_sockets(len(name) + RANDOM_ROOM + SOCKET_NAME_ROOM)
    try:
        folder, problem = contract.private_folder_in(base, name)
    except OSError:
        return None, None
    if problem is None:
        return folder, None
    return folder, (f"jaxrun: the socket folder {os.path.join(base, name)} is not yours alone ({problem}): "
                    f"this run's sockets are in {folder}, a private folder of a random name")


def private_socket_folder() -> str | None:
    """This user's folder for socket files (``socket_folder``); None only
    where none can be made."""
    return socket_folder()[0]


def socket_folders() -> list[str]:
    """Every folder of this user's sockets that exists and is this user's
    alone (lstat), where a running job of theirs may listen: the runtime
    folder's, then those in the temporary folder ``socket_folder`` picks.
    Nothing is made: ``jaxrun top`` and ``jaxrun stacks`` look in each."""
    name = SOCKET_FOLDER.format(uid=os.getuid())
    found = []
    runtime = runtime_folder()
    if runtime is not None:
        found += contract.private_folders(os.path.dirname(runtime), RUNTIME_FOLDER)[:1]
    found += contract.private_folders(temp_base_for_sockets(len(name) + RANDOM_ROOM + SOCKET_NAME_ROOM), name)
    return found


def server_address(name: str) -> str | None:
    """Where the host's server called ``name`` listens, and its agents
    connect: the abstract name where there are abstract sockets and peer
    credentials to check who connects, else a socket file in this user's
    private folder.  None: nowhere safe (the agents start their controllers
    themselves)."""
    import socket

    if _abstract_sockets() and not forced() and hasattr(socket, "SO_PEERCRED"):
        return "\0" + name
    folder = private_socket_folder()
    if folder is None:
        return None
    import hashlib

    return os.path.join(folder, hashlib.sha256(name.encode()).hexdigest()[:20] + ".sock")


def is_abstract(address: str) -> bool:
    return address.startswith("\0")
