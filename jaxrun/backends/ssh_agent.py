"""The far end of the SSH backend: a tiny supervisor between ``ssh`` and the shim.

Its :func:`supervise` is what runs each process on a host: in the host's
agent (:mod:`jaxrun.backends.ssh_host`), whose channels stand in for the
session's stdin, stdout and stderr, and, where a server refuses channels, in
a session of the process's own, as described here.

Started by the launcher over SSH, once its environment has arrived on stdin
(see ``ssh_commands.RUN_MODULE``), as::

    python -m jaxrun.backends.ssh_agent [--chdir DIR] -- PYTHON -m jaxrun.shim ...

Killing the local ``ssh`` client does not signal anything on the remote host,
so this module gives the launcher a handle on the remote process:

- The shim runs in a process group of its own, with stdout and stderr passed
  straight through (the bytes are never touched here).
- Each line on stdin is a :class:`jaxrun.wire.Signal`, which is sent to the
  whole group.
- EOF on stdin means the launcher closed the channel, died, or the connection
  dropped: the group is SIGKILLed at once.
- The shim holds the read end of a lifeline pipe whose write end only this
  process holds, so if this process is killed, the shim kills its group too.

The agent is a child subreaper (see :mod:`jaxrun.core.reaper`): a
daemon the script starts with ``setsid()`` stays its descendant, and is killed
with whatever else is left once the shim ends.

The shim's error record goes to a private file on this host; once the shim
and everything it started are gone, the agent sends it home, with the
resources the shim used (``core.usage``), as the last bytes on stderr
(``wire.home_report``), which the launcher takes off the stream.

When the controller arrives at the job's rendezvous (its joined file appears
in the same private folder), the agent writes ``wire.JOINED_MARKER`` on stderr
once, which the launcher also takes off the stream.

The exit status is the shim's, or 128+N when it died of signal N, since SSH
has no way to pass a signal death back.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

import psutil

from jaxrun import contract, portable, wire
from jaxrun.core import reaper, usage
from jaxrun.core.joinwatch import JoinWatch

USAGE = f"usage: python -m {contract.SSH_AGENT_MODULE} [--chdir DIR] [--forkserver NAME] -- COMMAND..."
SERVER_WAIT = 3.0  # for the host's server to listen: it started with the preflight, long before us


def kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def relay_signals(fd: int, pgid: int, watch: usage.OomWatch | None = None, pending: bytes = b"",
                  ended: "Ended | None" = None) -> None:
    """Forward each named signal read from ``fd`` (stdin, or a host's control
    connection) to the group; SIGKILL it at EOF.  ``pending``: bytes of that
    stream read already.  Nothing is sent once ``ended`` is set: the group's
    id may be another's by then.

    Reads the raw fd: a thread blocked in sys.stdin's buffered reader makes
    interpreter shutdown abort."""
    ended = ended or Ended()
    while True:
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            try:
                msg = wire.decode(raw)
                signum = msg.signum if isinstance(msg, wire.Signal) else None
            except wire.WireError:
                signum = None  # an unknown line is not worth a crash mid-run
            if signum is not None:
                if watch is not None:
                    watch.saw(signum)
                ended.kill_group(pgid, signum)
        try:
            data = os.read(fd, 512)
        except OSError:
            data = b""
        if not data:
            break
        pending += data
    if watch is not None:
        watch.saw(signal.SIGKILL)
    ended.kill_group(pgid, signal.SIGKILL)


class Ended:
    """Set once the controller is reaped: no signal goes to its group after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False

    def set(self) -> None:
        with self._lock:
            self._set = True

    def kill_group(self, pgid: int, signum: int) -> None:
        with self._lock:
            if not self._set:
                kill_group(pgid, signum)


def parse_args(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    chdir = server = None
    while argv[:1] in (["--chdir"], ["--forkserver"]) and len(argv) >= 2:
        if argv[0] == "--chdir":
            chdir = argv[1]
        else:
            server = argv[1]
        argv = argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        raise ValueError(USAGE)
    return chdir, server, argv[1:]


class ServedChild:
    """A controller forked by this host's preloading server (see
    ``forkserver_agent.listen``), seen like a Popen: a pid and its end.
    ``server_pid`` is the server's, from the socket where the system says
    (``portable.peer_pid``), else the controller's parent; None if neither
    is known any more."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid = conn, pid
        self.resources: contract.Resources | None = None
        self.server_pid = portable.peer_pid(conn)
        if self.server_pid is None:
            try:
                self.server_pid = psutil.Process(pid).ppid()
            except psutil.Error:
                pass  # it has ended already

    def wait(self) -> int:
        while True:
            try:
                frame = wire.recv_frame(self.conn)
            except (OSError, wire.WireError):
                frame = None
            if frame is None:  # the server is gone, and the controller's end with it
                kill_group(self.pid, signal.SIGKILL)
                return -signal.SIGKILL
            msg = wire.decode(frame[0])
            if isinstance(msg, wire.ChildExited) and msg.pid == self.pid:
                self.resources = contract.Resources.from_dict(msg.resources)
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
    request = wire.ForkRequest(command[3:], env, cwd or os.getcwd()).encode()
    try:
        wire.send_frame(conn, request, [*fds, lifeline_r])
        frame = wire.recv_frame(conn)  # waits out the server's imports
    except (OSError, wire.WireError):
        frame = None
    msg = wire.decode(frame[0]) if frame else None
    if not isinstance(msg, wire.Started):
        conn.close()
        return None
    return ServedChild(conn, msg.pid)


def main(argv: list[str]) -> int:
    try:
        chdir, server, command = parse_args(argv)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if chdir:
        try:
            os.chdir(chdir)
        except OSError as e:
            print(f"jaxrun: cannot change to {chdir!r} on this host: {e.strerror}", file=sys.stderr)
            return 2
    reaper.become_subreaper()
    return contract.exit_status(supervise(command, dict(os.environ), server))


def supervise(command: list[str], env: dict, server: str | None, *, cwd: str | None = None,
              fds: tuple[int, int] = (1, 2), control: int = 0, pending: bytes = b"", alone: bool = True,
              on_start: Callable[[int], None] | None = None) -> int:
    """Run one controller with ``fds`` as its stdout and stderr, obey the
    signals read from ``control`` until its EOF, and send the error record
    and the resources home as stderr's last bytes; the Popen-style
    returncode.  ``alone``: this process runs no other controller, so every
    descendant left at the end is this one's (else only those that hold its
    stdout or stderr are).  ``on_start``: told the controller's pid."""
    out, err = fds
    lifeline_r, lifeline_w = os.pipe()
    env = dict(env)
    env[contract.LIFELINE_FD] = str(lifeline_r)
    record_path = os.path.join(tempfile.mkdtemp(prefix="jaxrun-agent-"), "error.json")  # a 0700 folder
    env[contract.ERROR_FILE] = record_path
    watch = usage.OomWatch()
    joined_path = os.path.join(os.path.dirname(record_path), "joined")
    env[contract.JOINED_FILE] = joined_path
    child = fork_by_server(server, command, env, lifeline_r, fds, cwd) if server else None
    try:
        child = child or subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            pass_fds=(lifeline_r,),
            start_new_session=True,
        )
    except OSError as e:
        os.close(lifeline_r)
        os.close(lifeline_w)
        os.rmdir(os.path.dirname(record_path))
        write_all(err, f"jaxrun: cannot start {command[0]!r} on this host: {e.strerror}\n".encode())
        return 127
    os.close(lifeline_r)
    if on_start is not None:
        on_start(child.pid)
    ended = Ended()
    relay = threading.Thread(target=relay_signals, args=(control, child.pid, watch, pending, ended), daemon=True)
    relay.start()
    joins = JoinWatch(joined_path, lambda: announce_joined(err)).start()
    if isinstance(child, ServedChild):
        code = child.wait()
        used = watch.with_verdict(code, child.resources)
    else:
        code, used = usage.wait_popen(child, watch)
    joins.stop()  # before the record: nothing may follow the trailer
    kill_group(child.pid, signal.SIGKILL)  # grandchildren left behind by the shim
    ended.set()
    if alone:
        reaper.kill_descendants()  # and those that left its group
    # A served controller's orphans are its server's: those that hold this
    # controller's stdout or stderr open die now, the rest with the server.
    within = child.server_pid if isinstance(child, ServedChild) else None if alone else os.getpid()
    reaper.kill_holders(list(fds), within=within)
    os.close(lifeline_w)
    send_home(record_path, used, err)
    return code


def announce_joined(fd: int = 2) -> None:
    """The marker in one write: a pipe never splits it, nor mixes it with
    the controller's own writes to the same stderr."""
    os.write(fd, wire.JOINED_MARKER)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send_home(path: str, used: contract.Resources | None, fd: int = 2) -> None:
    """The error record (if the shim left one) and the resources, as the
    last bytes on stderr (``fd``)."""
    record = contract.ErrorRecord.take(path)
    sys.stderr.flush()
    write_all(fd, wire.home_report(record.to_json() if record else None, used.to_dict() if used else None))


def run(argv: list[str]) -> None:
    """Run and exit: the relay thread may still be blocked reading stdin."""
    code = main(argv)
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run(sys.argv[1:])
