"""The far end of the SSH backend: a tiny supervisor between ``ssh`` and the shim.

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

The agent is a child subreaper (see :mod:`jaxrun.backends.reaper`): a
daemon the script starts with ``setsid()`` stays its descendant, and is killed
with whatever else is left once the shim ends.

The shim's error record goes to a private file on this host; once the shim
and everything it started are gone, the agent sends it home, with the
resources the shim used (``backends.usage``), as the last bytes on stderr
(``wire.record_trailer``), which the launcher takes off the stream.

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

import psutil

from jaxrun import contract, portable, wire
from jaxrun.backends import reaper, usage
from jaxrun.backends.joinwatch import JoinWatch

USAGE = f"usage: python -m {contract.SSH_AGENT_MODULE} [--chdir DIR] [--forkserver NAME] -- COMMAND..."
SERVER_WAIT = 3.0  # for the host's server to listen: it started with the preflight, long before us


def kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def relay_signals(fd: int, pgid: int, watch: usage.OomWatch | None = None) -> None:
    """Forward each named signal on stdin to the group; SIGKILL it at EOF.

    Reads the raw fd: a thread blocked in sys.stdin's buffered reader makes
    interpreter shutdown abort."""
    pending = b""
    while True:
        try:
            data = os.read(fd, 512)
        except OSError:
            data = b""
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for raw in lines:
            try:
                msg = wire.decode(raw)
                signum = msg.signum if isinstance(msg, wire.Signal) else None
            except wire.WireError:
                signum = None  # an unknown line is not worth a crash mid-run
            if signum is not None:
                if watch is not None:
                    watch.saw(signum)
                kill_group(pgid, signum)
    if watch is not None:
        watch.saw(signal.SIGKILL)
    kill_group(pgid, signal.SIGKILL)


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


def fork_by_server(name: str, command: list[str], env: dict, lifeline_r: int) -> ServedChild | None:
    """Ask the host's server for the controller; None: start it ourselves
    (no server, or it could not import, or the command is not the shim)."""
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
    request = wire.ForkRequest(command[3:], env, os.getcwd()).encode()
    try:
        wire.send_frame(conn, request, [1, 2, lifeline_r])
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
    lifeline_r, lifeline_w = os.pipe()
    env = dict(os.environ)
    env[contract.LIFELINE_FD] = str(lifeline_r)
    record_path = os.path.join(tempfile.mkdtemp(prefix="jaxrun-agent-"), "error.json")  # a 0700 folder
    env[contract.ERROR_FILE] = record_path
    watch = usage.OomWatch()
    joined_path = os.path.join(os.path.dirname(record_path), "joined")
    env[contract.JOINED_FILE] = joined_path
    child = fork_by_server(server, command, env, lifeline_r) if server else None
    try:
        child = child or subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(lifeline_r,),
            start_new_session=True,
        )
    except OSError as e:
        os.rmdir(os.path.dirname(record_path))
        print(f"jaxrun: cannot start {command[0]!r} on this host: {e.strerror}", file=sys.stderr)
        return 127
    os.close(lifeline_r)
    relay = threading.Thread(target=relay_signals, args=(0, child.pid, watch), daemon=True)
    relay.start()
    joins = JoinWatch(joined_path, announce_joined).start()
    if isinstance(child, ServedChild):
        code = child.wait()
        used = watch.with_verdict(code, child.resources)
    else:
        code, used = usage.wait_popen(child, watch)
    joins.stop()  # before the record: nothing may follow the trailer
    kill_group(child.pid, signal.SIGKILL)  # grandchildren left behind by the shim
    reaper.kill_descendants()  # and those that left its group
    if isinstance(child, ServedChild):
        reaper.kill_holders([1, 2], within=child.server_pid)  # its orphans, holding our session open
    os.close(lifeline_w)
    send_home(record_path, used)
    return contract.exit_status(code)


def announce_joined() -> None:
    """The marker in one write: a pipe never splits it, nor mixes it with
    the controller's own writes to the same stderr."""
    os.write(2, wire.JOINED_MARKER)


def send_home(path: str, used: contract.Resources | None) -> None:
    """The error record (if the shim left one) and the resources, as stderr's last bytes."""
    record = contract.ErrorRecord.take(path)
    payload = wire.home_payload(record.to_json() if record else None, used.to_dict() if used else None)
    sys.stderr.flush()
    data = memoryview(wire.record_trailer(payload))
    while data:
        data = data[os.write(2, data):]


def run(argv: list[str]) -> None:
    """Run and exit: the relay thread may still be blocked reading stdin."""
    code = main(argv)
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run(sys.argv[1:])
