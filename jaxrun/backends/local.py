"""Local controllers, one fresh interpreter each (``--no-preload``).

Every local child starts in a process group of its own, so one ``killpg``
reaches the grandchildren it starts too.  (A group, not a session: the
children stay in the user's session, so that the kernel's per-session CPU
shares, "autogroups", weigh jaxrun and its processes together, as they do for
a shell's background jobs.  A terminal's Ctrl-C reaches only the foreground
group, jaxrun's, either way.)  The child's stdout and stderr are the log
writer's pipes it is given.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping

from jaxrun import contract, portable
from jaxrun.core import causes, stale, usage
from jaxrun.core.backend import Backend, ChildExit, News
from jaxrun.core.config import LaunchError
from jaxrun.core.events import Stream
from jaxrun.core.reaper import ProcessGroup
from jaxrun.core.spec import ProcessSpec


def check_port_free(host: str, port: int) -> None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise LaunchError(f"--coordinator {host}:{port}: cannot listen there ({e.strerror})") from None


# In the user's private socket folder; one a SIGKILLed run left there is removed by the next (core.stale).
COORDINATOR_SOCKET = f"{stale.COORDINATOR_PREFIX}{{token}}{stale.SUFFIX}"


def local_coordinator(fixed: str | None, folder: str | None = None) -> tuple[str, str]:
    """(address to connect to, address to bind) for a run on this machine
    only: a Unix socket in this user's 0700 socket folder, which no other
    user can open (a loopback port is open to every user of the machine),
    or --coordinator's address (which must be free) where the user chose
    one.  Never a port the user did not ask for: where the usual folder is
    taken, the socket folder is one of a random name (portable.sockets)."""
    if fixed:
        host, port = fixed.rsplit(":", 1)
        check_port_free(host, int(port))
        return fixed, fixed
    folder = folder or portable.sockets.private_socket_folder()
    if folder is None:
        raise LaunchError("no private folder for the coordination service's socket can be made (set TMPDIR to "
                          "a folder of yours), or pass --coordinator HOST:PORT to serve it on a port")
    stale.remove_stale(folder)  # a killed run's
    path = coordinator_socket(folder)
    return contract.unix_address(path), contract.unix_address(path)


def coordinator_socket(folder: str) -> str:
    """A new socket file's path in ``folder`` for one attempt's coordination
    service.  The folder leaves the name room (portable.sockets.SOCKET_NAME_ROOM)."""
    import secrets

    while True:
        path = os.path.join(folder, COORDINATOR_SOCKET.format(token=secrets.token_hex(4)))
        if not os.path.lexists(path):  # never a name a killed run left behind
            return path


def remove_socket(address: str | None) -> None:
    """The attempt's coordinator socket file, once its process 0 is gone (a
    killed process leaves it behind)."""
    path = contract.unix_socket_path(address or "")
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def child_env(
    base: Mapping[str, str], spec: ProcessSpec, extra_env: Mapping[str, str], lifeline_fd: int
) -> dict[str, str]:
    env = dict(base)
    env.update(spec.env)
    env.update(extra_env)
    env[contract.LIFELINE_FD] = str(lifeline_fd)
    return env


class LocalChild:
    """A local controller: the leader of its own process group."""

    stdout = stderr = None  # it writes into the log writer's pipes
    reports_joins = False  # it marks its join in its joined file

    def __init__(self, popen: subprocess.Popen, watch: usage.OomWatch | None = None):
        self.popen = popen
        self.pid = popen.pid
        self.watch = watch
        self.group = ProcessGroup(popen.pid)

    def send(self, signum: int) -> None:
        if self.watch is not None:
            self.watch.saw(signum)
        self.group.send(signum)

    def wait(self) -> ChildExit:
        code, used = usage.wait_popen(self.popen, self.watch)
        reaped_at = time.time()
        self.group.reaped()
        return ChildExit(code, used, reaped_at, causes.clock_id())

    def stream_filter(self, stream: Stream) -> None:
        return None  # its bytes are its own


class LocalBackend(Backend):
    name = "local"
    writes_log_files = True
    starts_one_again = True  # a child like any other (the fork server forks it)

    def __init__(self, base_env: Mapping[str, str] | None = None):
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.started: list = []  # every child of the run, for abort()
        self.coordinator: str | None = None  # the attempt's address: its socket file is removed at its end

    def choose_coordinator(self, fixed: str | None) -> tuple[str, str]:
        remove_socket(self.coordinator)  # the last attempt's, if it ended without end_attempt
        self.coordinator = local_coordinator(fixed)[0]
        return self.coordinator, self.coordinator

    def dry_run_coordinator(self, fixed: str | None) -> tuple[str, str]:
        return local_coordinator(fixed)  # a path only: no socket is made, nothing to remove

    def end_attempt(self) -> None:
        remove_socket(self.coordinator)
        self.coordinator = None

    def close(self) -> None:
        remove_socket(self.coordinator)
        self.coordinator = None

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None, news: News) -> LocalChild:
        del news  # the child writes its joined and activity files, which the supervisor watches
        watch = usage.OomWatch()
        popen = subprocess.Popen(
            list(spec.argv),
            env=child_env(self.base_env, spec, extra_env, lifeline_fd),
            stdin=subprocess.DEVNULL,
            stdout=log_fds[0],
            stderr=log_fds[1],
            pass_fds=(lifeline_fd,),
            process_group=0,
        )
        child = LocalChild(popen, watch)
        self.started.append(child)
        return child

    def abort(self) -> None:
        for child in self.started:
            child.send(signal.SIGKILL)
