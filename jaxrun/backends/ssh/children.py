"""The SSH backend's children: a remote controller, as the supervisor sees it.

Each remote controller is run by an agent on its host (``far_end.run``),
either in the host agent, over three channels of the host's connection
(:class:`ChannelChild`), or, where the server refuses to forward, in a session
agent of its own (:class:`SessionChild`).  Either way ``send`` works like a
local ``killpg`` (the agent relays each signal to the controller's group and
kills the group when the launcher's side closes), and a dropped connection or
a dead jaxrun ends the remote job.

The agent's facts travel in-band on the controller's stderr, and the child
takes them out itself (:mod:`jaxrun.backends.ssh.stream`): its
``stream_filter`` for stderr calls ``on_join`` at the joined marker and keeps
the report home, so the supervisor hears them the way it hears every
backend's.  The report home is stderr's last bytes, and the pump may read
them after the exit is known (the exit comes on another channel, or as the
ssh client's status): ``wait`` returns once stderr has been read to its end,
or ``REPORT_WAIT`` seconds after the exit, whichever comes first.

The report home also brings the controller's own pid on its host and when
its end was seen there (a host agent says the pid at the start too, in a
``ssh.Started`` line): ``ChildExit.pid``, ``reaped_at`` and ``clock``.  An
exit that no far end confirmed (no ``Exit`` line on a channel, no report
home and ssh's own failure or death) is the helper's: ``ChildExit.lost``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable

from jaxrun import contract
from jaxrun.backends.ssh.stream import AgentStderr
from jaxrun.core.backend import NO_NEWS, ChildExit, News
from jaxrun.core.events import Stream
from jaxrun.wire import encoding, ssh

# After SIGKILL has been written, how long the remote side gets to finish
# before the local end is cut (which closes the channel anyway).
CLIENT_KILL_WAIT = 3.0
# After the exit is known, how long the end of stderr (the report home) may
# take to be read.  Together with CLIENT_KILL_WAIT, within the supervisor's
# KILL_CONFIRM_WAIT: a killed child's late answer is still heard in time.
REPORT_WAIT = 1.5


class AgentChild:
    """What both SSH children share: a controller run by an agent whose
    facts come on its stderr."""

    reports_joins = True  # the markers on stderr tell the spawn's News

    def __init__(self, news: News, error_file: str | None):
        self._news = news
        self._error_file = error_file
        self._stderr_filter: AgentStderr | None = None
        self._cut_off = False  # jaxrun ended the connection itself: no report home will come

    def stream_filter(self, stream: Stream) -> AgentStderr | None:
        if stream is not Stream.STDERR:
            return None
        if self._stderr_filter is None:
            self._stderr_filter = AgentStderr(self._news, self._error_file)
        return self._stderr_filter

    def _exit(self, returncode: int, confirmed: bool, helper: str, pid: int | None = None) -> ChildExit:
        """The exit, with what the report home brought, if stderr is filtered
        and its end is read in time.  ``confirmed``: the far end said how the
        controller ended; else, without a report home either, ``helper``'s
        end stands in for it."""
        heard = self._stderr_filter
        if heard is not None and not self._cut_off:
            heard.closed.wait(REPORT_WAIT)
        home = heard is not None and heard.closed.is_set() and heard.came_home
        facts = heard.facts if home else {}
        lost = None if confirmed or home else helper
        return ChildExit(returncode, heard.resources if home else None, facts.get("reaped_at"), facts.get("clock"),
                         facts.get("pid", pid), lost, contract.Marks.from_dict(facts.get("marks")))

    @staticmethod
    def _later(action: Callable[[], None]) -> None:
        """``action`` in CLIENT_KILL_WAIT seconds, on a timer that does not keep jaxrun alive."""
        timer = threading.Timer(CLIENT_KILL_WAIT, action)
        timer.daemon = True
        timer.start()


class ChannelChild(AgentChild):
    """A remote controller whose stdout, stderr and control travel on three
    channels of its host's connection, to that host's agent (see
    :mod:`jaxrun.backends.ssh.host_agent`)."""

    def __init__(self, path: str, spawn: ssh.Spawn, pid: int, host: str,
                 news: News = NO_NEWS, error_file: str | None = None):
        super().__init__(news, error_file)
        self.pid = pid  # the local master's; the controller's own comes with its exit
        self._host = host
        self._remote_pid: int | None = None  # the controller's own, once its host agent says
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._write_closed = False
        self._killed = False
        key = uuid.uuid4().hex
        socks = []
        try:
            for role in (ssh.STDOUT, ssh.STDERR, ssh.CONTROL):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                socks.append(sock)
                sock.connect(path)
                sock.sendall(ssh.Channel(key, role).line())
            socks[2].sendall(spawn.line())
        except OSError as e:
            for sock in socks:
                sock.close()
            self._fail(f"jaxrun: the connection to {host} is gone ({e.strerror or e})\n")
            return
        self._socks = socks
        self._ctrl = socks[2]
        # The pumps own (and close) these; ours stay open for hang_up().
        self.stdout = os.fdopen(os.dup(socks[0].fileno()), "rb", buffering=0)
        self.stderr = os.fdopen(os.dup(socks[1].fileno()), "rb", buffering=0)

    def _fail(self, message: str) -> None:
        """Never started: ends at once, with ``message`` on stderr."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        os.write(err_w, message.encode())
        os.close(out_w)
        os.close(err_w)
        self.stdout = os.fdopen(out_r, "rb", buffering=0)
        self.stderr = os.fdopen(err_r, "rb", buffering=0)
        self._socks, self._ctrl = [], None
        self._write_closed = True

    def send(self, signum: int) -> None:
        with self._lock:
            if self._write_closed:
                return
            try:
                self._ctrl.sendall(ssh.Signal.of(signum).line())
                if signum == signal.SIGKILL:
                    self._killed = True
                    self._write_closed = True
                    self._ctrl.shutdown(socket.SHUT_WR)  # EOF: the agent kills the group
            except OSError:
                self._write_closed = True
                return
        if signum == signal.SIGKILL:
            self._later(self._hang_up)

    def _hang_up(self) -> None:
        # No word from the host in time (a hung connection): end the streams
        # and the wait here; the agent kills the group at the channels' EOF.
        with self._lock:
            if self._done.is_set():
                return
            self._cut_off = True
            for sock in self._socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def wait(self) -> ChildExit:
        code = 255  # no Exit line: the connection is gone, as ssh's own failure
        confirmed = False
        if self._ctrl is not None:
            try:
                with self._ctrl.makefile("rb") as lines:
                    for raw in lines:
                        try:
                            msg = encoding.decode(raw)
                        except encoding.WireError:
                            continue
                        if isinstance(msg, ssh.Started) and isinstance(msg.pid, int):
                            self._remote_pid = msg.pid
                        elif isinstance(msg, ssh.Exit):
                            code, confirmed = msg.returncode, True
                            break
                    else:
                        if self._killed:
                            code = -signal.SIGKILL
            except OSError:
                pass
        with self._lock:
            self._done.set()
            self._write_closed = True
            for sock in self._socks:
                sock.close()
        return self._exit(code, confirmed, f"the connection to {self._host}", self._remote_pid)


class SessionChild(AgentChild):
    """A remote controller in an ssh session of its own, run there by its
    session agent (:mod:`jaxrun.backends.ssh.session_agent`), seen through its local
    ssh client: signals go to the agent's stdin, and the exit is the client's."""

    def __init__(self, popen: subprocess.Popen, news: News = NO_NEWS,
                 error_file: str | None = None):
        super().__init__(news, error_file)
        self.popen = popen
        self.pid = popen.pid  # the local ssh client's; the controller's own comes with its exit
        self.stdout = popen.stdout
        self.stderr = popen.stderr
        self._lock = threading.Lock()

    def send(self, signum: int) -> None:
        with self._lock:
            stdin = self.popen.stdin
            if stdin.closed:
                return
            try:
                stdin.write(ssh.Signal.of(signum).line())
                if signum == signal.SIGKILL:
                    stdin.close()  # EOF: the agent kills the group
            except OSError:
                stdin.close()
                return
        if signum == signal.SIGKILL:
            self._later(self._kill_client)

    def _kill_client(self) -> None:
        # The channel did not close in time (a hung connection): closing the
        # client ends the session, and sshd then closes the agent's stdin.
        if self.popen.poll() is None:
            self._cut_off = True
            self.popen.kill()

    def wait(self) -> ChildExit:
        status = self.popen.wait()
        # ssh's own failure (255) or its death by a signal: the session
        # agent's status never came, unless its report home did.
        return self._exit(contract.returncode_from_status(status), status >= 0 and status != 255, "the ssh client")
