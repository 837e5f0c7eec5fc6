"""The far end of the SSH backend: a tiny supervisor between ``ssh`` and the shim.

Started by the launcher over SSH, after its environment has arrived on stdin
(see ``ssh_commands.AGENT_MAIN``), as if by::

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
and everything it started are gone, the agent sends it home as the last bytes
on stderr (``wire.record_trailer``), which the launcher takes off the stream.

The exit status is the shim's, or 128+N when it died of signal N, since SSH
has no way to pass a signal death back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading

from jaxrun import contract, wire
from jaxrun.backends import reaper

USAGE = f"usage: python -m {contract.SSH_AGENT_MODULE} [--chdir DIR] -- COMMAND..."


def kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def relay_signals(fd: int, pgid: int) -> None:
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
                kill_group(pgid, signum)
    kill_group(pgid, signal.SIGKILL)


def parse_args(argv: list[str]) -> tuple[str | None, list[str]]:
    chdir = None
    if argv[:1] == ["--chdir"] and len(argv) >= 2:
        chdir, argv = argv[1], argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        raise ValueError(USAGE)
    return chdir, argv[1:]


def main(argv: list[str]) -> int:
    try:
        chdir, command = parse_args(argv)
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
    record_fd, record_path = tempfile.mkstemp(prefix="jaxrun-error-", suffix=".json")  # 0600
    os.close(record_fd)
    env[contract.ERROR_FILE] = record_path
    try:
        child = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(lifeline_r,),
            start_new_session=True,
        )
    except OSError as e:
        os.unlink(record_path)
        print(f"jaxrun: cannot start {command[0]!r} on this host: {e.strerror}", file=sys.stderr)
        return 127
    os.close(lifeline_r)
    relay = threading.Thread(target=relay_signals, args=(0, child.pid), daemon=True)
    relay.start()
    code = child.wait()
    kill_group(child.pid, signal.SIGKILL)  # grandchildren left behind by the shim
    reaper.kill_descendants()  # and those that left its group
    os.close(lifeline_w)
    send_record_home(record_path)
    return contract.exit_status(code)


def send_record_home(path: str) -> None:
    record = contract.ErrorRecord.load(path)
    try:
        os.unlink(path)
    except OSError:
        pass
    if record is not None:
        sys.stderr.flush()
        os.write(2, wire.record_trailer(record.to_json()))


def run(argv: list[str]) -> None:
    """Run and exit: the relay thread may still be blocked reading stdin."""
    code = main(argv)
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run(sys.argv[1:])
