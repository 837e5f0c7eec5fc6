"""The far end of the SSH backend: the session agent, between ``ssh`` and the shim.

Every SSH process is run by :func:`jaxrun.backends.far_end.run`, and talks
with the launcher through an :class:`SshHome`: in the host agent
(:mod:`jaxrun.backends.ssh.host_agent`), whose channels stand in for the session's
stdin, stdout and stderr, and, where a server refuses channels, in a session
of the process's own, run by this module's session agent, as described here.

Started by the launcher over SSH, once its environment has arrived on stdin
(see ``commands.RUN_MODULE``), as::

    python -m jaxrun.backends.ssh.session_agent [--chdir DIR] -- PYTHON -m jaxrun.shim ...

Killing the local ``ssh`` client does not signal anything on the remote host,
so this module gives the launcher a handle on the remote process:

- The shim runs in a process group of its own, with stdout and stderr passed
  straight through (the bytes are never touched here).
- Each line on stdin is a :class:`jaxrun.wire.ssh.Signal`, which is sent to the
  whole group.
- EOF on stdin means the launcher closed the channel, died, or the connection
  dropped: the group is SIGKILLed at once.
- The shim holds the read end of a lifeline pipe whose write end only this
  process holds, so if this process is killed, the shim kills its group too.

The session agent is a child subreaper (see :mod:`jaxrun.core.reaper`): a
daemon the script starts with ``setsid()`` stays its descendant, and is killed
with whatever else is left once the shim ends.

The shim's error record goes to a private file on this host; once the shim
and everything it started are gone, the agent sends it home, with the
resources the shim used (``core.usage``), as the last bytes on stderr
(``ssh.home_report``), which the launcher takes off the stream.

When the controller arrives at the job's rendezvous (its joined file appears
in the same private folder), the agent writes ``ssh.JOINED_MARKER`` on stderr
once, which the launcher also takes off the stream.

The exit status is the shim's, or 128+N when it died of signal N, since SSH
has no way to pass a signal death back.
"""

from __future__ import annotations

import os
import sys

from jaxrun import contract
from jaxrun.backends import far_end
from jaxrun.core import reaper
from jaxrun.wire import encoding, ssh

USAGE = f"usage: python -m {contract.SSH_AGENT_MODULE} [--chdir DIR] -- COMMAND..."


class SshHome:
    """The SSH far end's side of the launcher: ``ssh.Signal`` lines read
    from ``control`` (stdin, or a host agent's control channel; ``pending``:
    bytes of it read already), whose EOF means the launcher is gone; the join
    and the report home written on ``err``, the controller's own stderr."""

    def __init__(self, control: int = 0, err: int = 2, pending: bytes = b""):
        self.control, self.err, self.pending = control, err, pending

    def listen(self, controller: far_end.Controller) -> None:
        """Reads the raw fd: a thread blocked in sys.stdin's buffered reader
        makes interpreter shutdown abort."""
        pending = self.pending
        while True:
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                try:
                    msg = encoding.decode(raw)
                    signum = msg.signum if isinstance(msg, ssh.Signal) else None
                except encoding.WireError:
                    signum = None  # an unknown line is not worth a crash mid-run
                if signum is not None:
                    controller.signal(signum)
            try:
                data = os.read(self.control, 512)
            except OSError:
                data = b""
            if not data:
                break
            pending += data
        controller.lost()

    def joined(self, recoverable: bool) -> None:
        """The marker in one write: a pipe never splits it, nor mixes it with
        the controller's own writes to the same stderr."""
        os.write(self.err, ssh.JOINED_RECOVERABLE_MARKER if recoverable else ssh.JOINED_MARKER)

    def activity(self, state: str) -> None:
        os.write(self.err, ssh.activity_marker(state))  # one write, as the joined marker

    def cannot_start(self, command: list[str], error: OSError) -> None:
        far_end.write_all(self.err, f"jaxrun: cannot start {command[0]!r} on this host: {error.strerror}\n".encode())

    def report(self, code: int, record: contract.ErrorRecord | None, used: contract.Resources | None,
               reaped: far_end.Reaped) -> None:
        """The error record (if the shim left one), the resources, and the
        controller's own pid and the time of its end, as the last bytes on
        stderr."""
        sys.stderr.flush()
        far_end.write_all(self.err, ssh.home_report(record.to_json() if record else None,
                                                     used.to_dict() if used else None,
                                                     pid=reaped.pid, reaped_at=reaped.at, clock=reaped.clock,
                                                     marks=reaped.marks.to_dict() if reaped.marks else None))


def parse_args(argv: list[str]) -> tuple[str | None, list[str]]:
    chdir = None
    if argv[:1] == ["--chdir"] and len(argv) >= 2:
        chdir, argv = argv[1], argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        raise ValueError(USAGE)
    return chdir, argv[1:]


def main(argv: list[str]) -> int:
    # The host's preloading server, named in the environment (never on a command line).
    server = os.environ.pop(contract.FORKSERVER_NAME, None) or None
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
    return contract.exit_status(far_end.run(command, dict(os.environ), SshHome(), server=server))


def run(argv: list[str]) -> None:
    """Run and exit: the listening thread may still be blocked reading stdin."""
    code = main(argv)
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run(sys.argv[1:])
