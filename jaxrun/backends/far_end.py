"""Run one controller at the far end: the steps every agent takes, written once.

Each controller on a remote host or a scheduler's node is run by :func:`run`:
an SSH host agent (:mod:`jaxrun.backends.ssh.host_agent`) runs each of its host's
controllers here, a session agent (:mod:`jaxrun.backends.ssh.session_agent`) its one,
and so does a task agent (:mod:`jaxrun.backends.scheduler.task_agent`).  The steps:

1. a private folder (mode 0700) for the controller's error record, joined
   file and activity file (``contract.ERROR_FILE``, ``contract.JOINED_FILE``,
   ``contract.ACTIVITY_FILE``);
2. a lifeline pipe: the shim holds its read end, so when this process dies,
   the controller's whole group dies too;
3. an OOM watch (``usage.OomWatch``), started before the controller;
4. the controller in a session of its own, so that its pid is its group's
   id; or, where the host runs a preloading server, forked by that server
   (:func:`fork_by_server`), which makes it a group leader the same way;
5. the launcher's signals, relayed to the group; a launcher that is gone
   means SIGKILL;
6. the wait, with ``wait4`` (the resources it used).  What is left in the
   group is killed while the dead leader still holds the group's id, and the
   door closes as the leader is reaped (``reaper.ProcessGroup``): from then
   on its id may be a stranger's, and no signal goes to it;
7. the descendants sweep: what left the group (``reaper.kill_descendants``),
   or, in a host agent that runs other controllers too, what holds this
   one's stdout or stderr (``reaper.kill_holders``);
8. the report home: the error record, the resources, and the end's facts
   (:class:`Reaped`: the controller's own pid, and when this machine's
   clock saw it end, for the launcher's choice of the root cause; what it
   spent on compiles and checkpoint saves, ``contract.MARKS_FILE``, for the
   run's goodput).

Only what crosses to the launcher differs between agents: a :class:`Home`
says how the launcher's signals arrive and how the join, the changes
between busy and idle (``--stall-timeout``) and the report travel back
(the SSH stream, or the task agent's control connection).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Protocol

import psutil

from jaxrun import contract, portable
from jaxrun.core import causes, reaper, usage
from jaxrun.core.joinwatch import JoinWatch
from jaxrun.wire import encoding, forkserver

SERVER_WAIT = 3.0  # for the host's server to listen: it started with the preflight, long before us
CANNOT_START = 127  # the shell's status for a command that could not run


class Controller:
    """A running controller, as its far end signals it."""

    def __init__(self, pid: int, watch: usage.OomWatch, group: reaper.ProcessGroup):
        self.pid, self.watch, self.group = pid, watch, group

    def signal(self, signum: int) -> bool:
        """Relay a signal jaxrun sends to the controller's group; False once
        the controller has been reaped (or the group is gone)."""
        self.watch.saw(signum)
        return self.group.send(signum)

    def lost(self) -> None:
        """The launcher is gone: nothing may outlive it."""
        self.signal(signal.SIGKILL)


@dataclasses.dataclass(frozen=True)
class Reaped:
    """The facts of a controller's end that its far end alone knows."""

    pid: int  # the controller's own, on this machine
    at: float | None  # wall clock as its reaper saw it end (None: its server did not say)
    clock: str  # this machine (causes.clock_id): whose clock ``at`` reads
    marks: contract.Marks | None = None  # what the controller spent on compiles and saves (contract.MARKS_FILE)


class Home(Protocol):
    """How one kind of agent talks with the launcher about its controller."""

    def listen(self, controller: Controller) -> None:
        """Relay the launcher's signals (``controller.signal``) until it is
        done with this controller; ``controller.lost()`` when it is gone.
        Runs in a daemon thread of its own, from the controller's start."""

    def joined(self, recoverable: bool) -> None:
        """The controller has arrived at the job's rendezvous (once at most);
        ``recoverable``: it enabled JAX's fault tolerance."""

    def activity(self, state: str) -> None:
        """The controller's sampler says it is now ``contract.BUSY``, ``contract.IDLE``,
        ``contract.FINISHED`` or spinning (a SPIN line, ``contract.Spinning``): the line it wrote."""

    def cannot_start(self, command: list[str], error: OSError) -> None:
        """The controller never started: say so."""

    def report(self, code: int, record: contract.ErrorRecord | None, used: contract.Resources | None,
               reaped: Reaped) -> None:
        """The report home: the controller and all it started have ended."""


def run(command: list[str], env: dict, home: Home, *, cwd: str | None = None, fds: tuple[int, int] = (1, 2),
        server: str | None = None, alone: bool = True, give_fds: bool = False,
        on_start: Callable[[Controller], None] | None = None,
        group: Callable[[int], reaper.ProcessGroup] = reaper.ProcessGroup) -> int:
    """Run one controller with ``fds`` as its stdout and stderr, and tell
    ``home``; its Popen-style returncode.  ``server``: the host's preloading
    server, to ask first.  ``alone``: this process runs no other controller,
    so every descendant left at the end is this one's.  ``give_fds``: the
    descriptors are the controller's alone once it has them (closed here, so
    the launcher sees them end with it).  ``on_start``: told the controller."""
    folder = tempfile.mkdtemp(prefix="jaxrun-agent-")
    record_path, joined_path = os.path.join(folder, "error.json"), os.path.join(folder, "joined")
    activity_path, marks_path = os.path.join(folder, "activity"), os.path.join(folder, "marks")
    lifeline_r, lifeline_w = os.pipe()
    env = {**env, contract.LIFELINE_FD: str(lifeline_r), contract.ERROR_FILE: record_path,
           contract.JOINED_FILE: joined_path, contract.ACTIVITY_FILE: activity_path, contract.MARKS_FILE: marks_path}
    watch = usage.OomWatch()
    try:
        child = start(command, env, lifeline_r, fds, cwd, server)
    except OSError as e:
        os.close(lifeline_w)
        os.rmdir(folder)
        home.cannot_start(command, e)
        return CANNOT_START
    finally:
        os.close(lifeline_r)
        if give_fds:
            encoding.close_all(fds)
    controller = Controller(child.pid, watch, group(child.pid))
    if on_start is not None:
        on_start(controller)
    threading.Thread(target=home.listen, args=(controller,), name="far-end-listen", daemon=True).start()
    joins = JoinWatch(joined_path, home.joined, activity_path=activity_path, activity=home.activity).start()
    code, used, reaped_at = wait(child, controller)
    controller.group.reaped()  # from here on, its id may be a stranger's
    joins.stop()  # before the report: nothing may follow it, and the folder goes with the record
    sweep(child, fds, alone, give_fds)
    os.close(lifeline_w)
    marks = contract.Marks.read(marks_path)
    contract.remove_private(marks_path)
    home.report(code, contract.ErrorRecord.take(record_path), used,
                Reaped(child.pid, reaped_at, causes.clock_id(), marks))
    return code


def start(command: list[str], env: dict, lifeline_r: int, fds: tuple[int, int], cwd: str | None,
          server: str | None) -> subprocess.Popen | ServedChild:
    child = fork_by_server(server, command, env, lifeline_r, fds, cwd) if server else None
    return child or subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=fds[0],
                                     stderr=fds[1], pass_fds=(lifeline_r,), start_new_session=True)


def wait(child: subprocess.Popen | ServedChild,
         controller: Controller) -> tuple[int, contract.Resources | None, float | None]:
    """The controller's end: its returncode, resources, and the wall clock
    as it was seen (None if unknown).  What is left in its group dies first,
    while the dead leader still holds the group's id."""
    group, watch = controller.group, controller.watch
    if isinstance(child, ServedChild):  # its server sweeps the group, reaps it, then tells
        code = child.wait()
        if code is None:  # the server is gone, and the controller's end with it
            group.send(signal.SIGKILL)
            code = -signal.SIGKILL
        return code, watch.with_verdict(code, child.resources), child.reaped_at
    unreaped = portable.ended_unreaped(child.pid, block=True)
    seen_at = time.time()  # the end, before the sweep of its group
    if unreaped:
        group.send(signal.SIGKILL)  # grandchildren left in its group
    code, used = usage.wait_popen(child, watch)
    if unreaped is None:
        seen_at = time.time()  # ended_unreaped could not wait: the reap is the first sight
        # The system cannot wait without reaping: the sweep follows the reap
        # at once (a moment in which the id could be reused), as there the
        # group kill is the portable path's main tool against leftovers.
        group.send(signal.SIGKILL)
    return code, used, seen_at


def sweep(child: subprocess.Popen | ServedChild, fds: tuple[int, int], alone: bool, give_fds: bool) -> None:
    """Kill what the controller left outside its group: every descendant if
    this process runs it alone; else those that hold its stdout or stderr."""
    if alone:
        reaper.kill_descendants()
    # A served controller's orphans are its server's: those that hold this
    # controller's stdout or stderr die now, the rest with the server.
    within = child.server_pid if isinstance(child, ServedChild) else None if alone else os.getpid()
    if within is not None and not give_fds:
        reaper.kill_holders(list(fds), within=within)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# -- a host's preloading server (see forkserver.server.listen) -------------------------
class ServedChild:
    """A controller forked by this host's preloading server: a pid and its
    end.  ``server_pid`` is the server's, from the socket where the system
    says (``portable.peer_pid``), else the controller's parent; None if
    neither is known any more."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid = conn, pid
        self.resources: contract.Resources | None = None
        self.reaped_at: float | None = None  # the server's wall clock as it reaped it
        self.server_pid = portable.peer_pid(conn)
        if self.server_pid is None:
            try:
                self.server_pid = psutil.Process(pid).ppid()
            except psutil.Error:
                pass  # it has ended already

    def wait(self) -> int | None:
        """Its Popen-style returncode, once the server has reaped it; None
        if the server is gone."""
        while True:
            try:
                frame = encoding.recv_frame(self.conn)
            except (OSError, encoding.WireError):
                frame = None
            if frame is None:
                return None
            msg = encoding.decode(frame[0])
            if isinstance(msg, forkserver.ChildExited) and msg.pid == self.pid:
                self.resources = contract.Resources.from_dict(msg.resources)
                self.reaped_at = msg.reaped_at
                return msg.returncode


def fork_by_server(name: str, command: list[str], env: dict, lifeline_r: int, fds: tuple[int, int] = (1, 2),
                   cwd: str | None = None) -> ServedChild | None:
    """Ask the host's server for the controller, with ``fds`` for its stdout
    and stderr; None: start it ourselves (no server, or it could not import,
    or the command is not the shim)."""
    address = portable.server_address(name)
    if command[1:3] != ["-m", contract.SHIM_MODULE] or address is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + SERVER_WAIT
    while True:
        try:
            conn.connect(address)
            break
        except (ConnectionRefusedError, FileNotFoundError):
            if time.monotonic() > deadline:  # it never started listening
                conn.close()
                return None
            time.sleep(0.02)
    owner = portable.peer_uid(conn)
    if portable.is_abstract(address) and owner != os.getuid():
        # Another user's process bound the name first: not one byte, no
        # environment and no descriptor, goes to it.  (A socket file's
        # folder is this user's alone.)
        conn.close()
        write_all(fds[1], f"jaxrun: the preloading server's name on this host is taken by uid {owner}, not "
                          "jaxrun's: this process starts without it\n".encode())
        return None
    request = forkserver.ForkRequest(command[3:], env, cwd or os.getcwd()).encode()
    try:
        encoding.send_frame(conn, request, [*fds, lifeline_r])
        frame = encoding.recv_frame(conn)  # waits out the server's imports
    except (OSError, encoding.WireError):
        frame = None
    msg = encoding.decode(frame[0]) if frame else None
    if not isinstance(msg, forkserver.Started):
        conn.close()
        return None
    return ServedChild(conn, msg.pid)
