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


def private_socket_folder() -> str | None:
    """This user's folder for socket files, made 0700 if new; None if what
    is there is not a folder that only this user can enter (someone else's,
    a symlink, too open), since a socket file's own mode is no defence."""
    name = SOCKET_FOLDER.format(uid=os.getuid())
    # A long $TMPDIR: under it, the socket's name would not fit.
    folder = os.path.join(temp_base_for_sockets(len(name) + 27), name)
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
