"""The small rules every side applies the same way: a child's environment,
the shim's command line, placeholders, exit statuses, the joined file, and
how a listener picks its address."""

from __future__ import annotations

import _signal  # the signal module's C half: see STOP_SIGNALS
import os
from collections.abc import Mapping, Sequence

from jaxrun.contract.names import (  # the names these rules fill in
    COORDINATOR_ADDRESS,
    COORDINATOR_BIND_ADDRESS,
    JAX_COMPILATION_CACHE_DIR,
    JAX_COORDINATOR_ADDRESS,
    JAX_COORDINATOR_BIND_ADDRESS,
    JAX_ENABLE_COMPILATION_CACHE,
    JAX_NUM_CPU_DEVICES,
    JAX_PLATFORMS,
    LAUNCHER_RANK_NAMES,
    LOCAL_PROCESS_COUNT,
    LOCAL_PROCESS_ID,
    NUM_PROCESSES,
    PROCESS_ID,
    RANK_SOURCE,
    RANK_SOURCES,
    RECOVERABLE,
    RESTART_COUNT,
    RUN_ID,
    SHIM_MODULE,
)


def process_env(*, coordinator: str, num_processes: int, process_id: int | str, local_process_id: int | str,
                local_process_count: int | str, run_id: str, restart_count: int | str = 0) -> dict[str, str]:
    """The variables that tell a child who it is and where to join.  Values
    may be strings, so that a manifest can put references in them."""
    return {
        COORDINATOR_ADDRESS: coordinator,
        JAX_COORDINATOR_ADDRESS: coordinator,
        NUM_PROCESSES: str(num_processes),
        PROCESS_ID: str(process_id),
        LOCAL_PROCESS_ID: str(local_process_id),
        LOCAL_PROCESS_COUNT: str(local_process_count),
        RUN_ID: run_id,
        RESTART_COUNT: str(restart_count),
        "PYTHONUNBUFFERED": "1",
    }


def bind_env(address: str) -> dict[str, str]:
    """For process 0: listen exactly there (JAX's default is every interface)."""
    return {COORDINATOR_BIND_ADDRESS: address, JAX_COORDINATOR_BIND_ADDRESS: address}


def bracketed(address: str) -> str:
    """HOST:PORT with an IPv6 HOST in brackets, as gRPC reads it: a bind
    address put together where the host's family is not known yet (a pod's
    ``$(JAXRUN_POD_ADDRESS):PORT``).  A Unix socket's address is left alone."""
    if unix_socket_path(address) is not None:
        return address
    host, sep, port = address.rpartition(":")
    return f"[{host}]:{port}" if sep and ":" in host and not host.startswith("[") else address


def cpu_env(devices: int) -> dict[str, str]:
    return {JAX_PLATFORMS: "cpu", JAX_NUM_CPU_DEVICES: str(devices)}


def own_compile_cache(environ: Mapping[str, str]) -> bool:
    """True when ``environ`` already says where JAX keeps its persistent
    compile cache, or turns JAX's cache off: the cache jaxrun shares between
    attempts (COMPILE_CACHE) then stays out of the way."""
    if JAX_COMPILATION_CACHE_DIR in environ:
        return True
    enabled = environ.get(JAX_ENABLE_COMPILATION_CACHE)
    return enabled is not None and enabled.strip().lower() in ("0", "n", "no", "f", "false", "off")


def target_args(name: str, args: Sequence[str], is_module: bool) -> tuple[str, ...]:
    """What follows ``python -m jaxrun.shim``: ``-- SCRIPT ARGS`` or ``-m MODULE ARGS``."""
    return ("-m" if is_module else "--", name, *args)


def shim_argv(python: str, shim_args: Sequence[str]) -> tuple[str, ...]:
    return (python, "-m", SHIM_MODULE, *shim_args)


# -- placeholders ------------------------------------------------------------------
PLACEHOLDERS = ("process_id", "num_processes", "local_process_id", "coordinator")
_PLACEHOLDER = r"\{(" + "|".join(PLACEHOLDERS) + r")\}"  # compiled at its first use (re's cache)


def placeholder_values(process_id: object, num_processes: object, local_process_id: object,
                       coordinator: object) -> dict[str, object]:
    return {"process_id": process_id, "num_processes": num_processes,
            "local_process_id": local_process_id, "coordinator": coordinator}


def substitute(arg: str, values: Mapping[str, object]) -> str:
    """Replace {process_id}-style placeholders; other braces are left alone."""
    import re  # here, as every pattern of this module: a controller's start-up needs none

    return re.sub(_PLACEHOLDER, lambda m: str(values[m.group(1)]), arg)


# -- exit statuses -------------------------------------------------------------------
# The signals that ask a job to stop: jaxrun forwards them to every process
# with a grace period, its helpers start with them blocked, and a controller
# gets them back unblocked.  One tuple for every side.
#
# Plain numbers from ``_signal``, the module that ``signal`` wraps: ``signal``'s
# import turns its constants into enums, 3 ms of every process's start-up
# (256 processes on 2 cores: 0.4 s of ``bench/startup.py --part many``).  The
# shim and what it imports before the script use ``_signal``; a number
# compares equal to its enum everywhere else.
STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)


def exit_status(returncode: int) -> int:
    """Popen's returncode (negative: killed by that signal) as a shell status, 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def returncode_from_status(status: int) -> int:
    """The inverse, for an agent that reported its child's death by signal N as
    128+N.  255 is ssh's own failure and stays as it is."""
    if 128 < status < 128 + _signal.NSIG:
        return -(status - 128)
    return status


def signal_name(signum: int) -> str:
    import signal  # its names: only where one is said

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def mark_joined(path: str | None, recoverable: bool = False) -> bool:
    """Create the file that says "this process has joined" (see
    JOINED_FILE): new, 0600, never a symlink followed, whole when it
    appears (RECOVERABLE, or empty).  False when it could not be made (it is
    a hint and a flag; nothing waits on it)."""
    if not path:
        return False
    new = f"{path}.{os.getpid()}.new"
    try:
        fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if recoverable:
                os.write(fd, RECOVERABLE.encode())
        finally:
            os.close(fd)
        try:
            os.link(new, path)  # never replaces: an earlier join of this process stays as it was
        finally:
            os.unlink(new)
    except FileExistsError:
        return True  # an earlier join of this process (a checked no-op initialize)
    except OSError:
        return False
    return True


# -- addresses -------------------------------------------------------------------------
def is_loopback(address: str | None) -> bool:
    """True for a loopback IP address, or a name that resolves to one."""
    if not address:
        return False
    import ipaddress  # here: every controller imports the contract, few ask this
    import socket

    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        pass
    try:
        return ipaddress.ip_address(socket.gethostbyname(address)).is_loopback
    except (OSError, ValueError):
        return False


def loopback_refused() -> str | None:
    """Why a TCP connection over loopback fails here, or None where it works:
    a sandbox that refuses internet sockets (errno 97, the TPU host of issue
    71), a network namespace whose loopback is down (unreachable).  The
    launcher asks before it starts several local processes; a process of a
    one-process job asks before its script's own initialize() gives it JAX's
    CPU collectives (``child.join.bootstrap``)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            socket.create_connection(server.getsockname(), timeout=2).close()
    except OSError as e:
        return e.strerror or str(e)
    return None


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# gRPC's form of a Unix socket's address, which JAX passes through as it is:
# the coordination service of a job on one machine listens on a socket file
# in a 0700 folder, out of reach of the machine's other users.
UNIX_SCHEME = "unix:"


def unix_address(path: str) -> str:
    return UNIX_SCHEME + path


def unix_socket_path(address: str) -> str | None:
    """The socket file of a ``unix:PATH`` address; None for HOST:PORT."""
    return address[len(UNIX_SCHEME):] if address.startswith(UNIX_SCHEME) else None


def address_host(address: str) -> str:
    """The host part of HOST:PORT or [HOST]:PORT; for a Unix socket's
    address, the network address its name carries after ``@`` (over SSH, the
    first host's, where the socket is forwarded: see ``route_socket_name``),
    else loopback, which only this machine can reach."""
    path = unix_socket_path(address)
    if path is not None:
        name = path.rsplit("/", 1)[-1]
        if "@" in name and name.endswith(".sock"):
            return name.split("@", 1)[1][:-len(".sock")].replace("-", ":")
        return "127.0.0.1"
    return address.rsplit(":", 1)[0].strip("[]")


def route_socket_name(stem: str, host: str) -> str:
    """A socket file's name that carries ``host``, the network address its
    processes route their own listeners towards (``address_host`` reads it
    back): over SSH the coordinator is a socket forwarded to every host,
    which says nothing of the network the collectives use.  An IPv6
    address's colons become dashes, as ssh's forward specs split on colons."""
    return f"{stem}@{host.replace(':', '-')}.sock"


# -- KEY=VALUE ---------------------------------------------------------------------------
# Portable variable names: what POSIX shells, env(1) and Kubernetes all accept.
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"

def parse_env_pair(text: str) -> tuple[str, str]:
    """``--env KEY=VALUE``: ValueError unless KEY is a plain variable name."""
    import re

    key, sep, value = text.partition("=")
    if not sep or not re.fullmatch(_ENV_NAME, key):
        raise ValueError(f"{text!r} is not KEY=VALUE")
    return key, value


# -- tables -------------------------------------------------------------------------------
def align_columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as text lines, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


# -- who a process is -------------------------------------------------------------------
def identity_from_env(environ: Mapping[str, str] = os.environ) -> tuple[int, int, int]:
    """(process id, process count, local process id), from jaxrun's variables
    or from the scheduler named in RANK_SOURCE; ValueError naming what is
    missing or malformed."""
    source = environ.get(RANK_SOURCE, "jaxrun")
    names = RANK_SOURCES.get(source, LAUNCHER_RANK_NAMES)
    try:
        rank, count, local = (int(environ[n]) for n in names)
    except KeyError as e:
        raise ValueError(f"{e.args[0]} is not set; start this process with jaxrun") from None
    except ValueError as e:
        raise ValueError(f"bad rank variable: {e}") from None
    return rank, count, local
