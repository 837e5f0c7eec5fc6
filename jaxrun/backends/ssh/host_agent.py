"""The far end of the SSH backend: one agent per host for all of its processes.

The preflight session on each host (``ssh.commands.PREFLIGHT``, a stub that
starts ``ssh.preflight``) starts a :class:`HostAgent` once it has found jaxrun there.  The agent listens on a
Unix socket in a folder of its own (mode 0700) and says where in the
preflight's answer.  The launcher forwards a socket of its own private folder
to it over the host's ControlMaster (``ssh -O forward -L LOCAL:REMOTE``), so
that each connection it opens there is a new channel of the SSH connection
that already exists: no session, no remote shell (and its rc files), no
interpreter per process.  A process costs three connections, each opened by a
``ssh.Channel`` line with the process's key:

- ``stdout`` and ``stderr`` become the controller's own stdout and stderr:
  its bytes travel unchanged, never through this process;
- ``ctrl`` carries a ``ssh.Spawn`` line (what to run, the environment it
  adds, the folder, the host's preloading server), then ``ssh.Signal`` lines
  for the controller's group; its EOF kills the group.  The agent answers
  with a ``ssh.Started`` line (the controller's own pid, for the reports)
  once it runs, and one ``ssh.Exit`` line once it has ended.

Each controller is run by ``far_end.run``, with an ``session_agent.SshHome`` on
its channels, as a session agent runs it on the session's streams: its error
record and resources go home as the last bytes of its stderr, and its join as
a marker there.  A ``ping`` connection is answered ``pong``: the launcher's
check that the forwarding works (a server may refuse it; then each process
gets a session of its own).

Only this user's processes may connect (the folder, and the peer's user id
where the system tells it).  At the end of the session (``stop``) every
controller still running is killed, with whatever is left of what they
started: this process is their subreaper.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import threading
import time

from jaxrun import portable
from jaxrun.backends import far_end
from jaxrun.backends.ssh import session_agent as ssh_agent
from jaxrun.core import reaper
from jaxrun.wire import encoding, ssh

HEADER_WAIT = 10.0  # for a connection's first lines, from its accept
REPORT_WAIT = 2.0  # at the end, for the controllers just killed to be reported
MAX_LINE = 1 << 26  # a Spawn line carries an environment: as big as a frame may be


def read_line(conn: socket.socket, buffered: bytes = b"") -> tuple[bytes, bytes]:
    """The next line from ``conn`` and the bytes read past it."""
    while b"\n" not in buffered:
        if len(buffered) > MAX_LINE:
            raise encoding.WireError("line too long")
        data = conn.recv(1 << 16)
        if not data:
            raise encoding.WireError("connection closed before a whole line")
        buffered += data
    line, _, rest = buffered.partition(b"\n")
    return line, rest


class HostAgent:
    def __init__(self) -> None:
        reaper.become_subreaper()  # before the snapshot: where it marks the environment instead
        self.env = dict(os.environ)
        self.folder = tempfile.mkdtemp(prefix="jaxrun-host-")
        self.path = os.path.join(self.folder, "channels")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(self.path)
            self.listener.listen(256)
        except OSError:
            self.listener.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.lock = threading.Lock()
        self.waiting: dict[str, dict[str, tuple[socket.socket, bytes, ssh.Spawn | None]]] = {}
        self.running: dict[str, far_end.Controller | None] = {}  # key -> its controller, once started
        self.threads: dict[str, threading.Thread] = {}  # key -> the thread that runs it
        self.stopped = False

    def start(self) -> str:
        threading.Thread(target=self._accept, name="host-agent", daemon=True).start()
        return self.path

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed by stop()
            if portable.peer_uid(conn) not in (None, os.getuid()):
                conn.close()
                continue
            threading.Thread(target=self._greet, args=(conn,), name="host-agent-conn", daemon=True).start()

    def _greet(self, conn: socket.socket) -> None:
        conn.settimeout(HEADER_WAIT)
        try:
            line, rest = read_line(conn)
            hello = encoding.decode(line)
            if not isinstance(hello, ssh.Channel) or hello.role not in ssh.Channel.ROLES:
                raise encoding.WireError("not a channel")
            if hello.role == ssh.PING:
                conn.sendall(ssh.CHANNEL_PONG)
                conn.close()
                return
            spawn = None
            if hello.role == ssh.CONTROL:
                line, rest = read_line(conn, rest)
                spawn = encoding.decode(line)
                if not isinstance(spawn, ssh.Spawn):
                    raise encoding.WireError("no spawn line")
            conn.settimeout(None)
        except (OSError, encoding.WireError):
            conn.close()
            return
        self._offer(hello.key, hello.role, (conn, rest, spawn))

    def _offer(self, key: str, role: str, part: tuple[socket.socket, bytes, ssh.Spawn | None]) -> None:
        """Keep a process's connection until it has all three; then run it,
        in this thread."""
        with self.lock:
            parts = self.waiting.setdefault(key, {})
            if role in parts or key in self.running or self.stopped:
                part[0].close()
                return
            parts[role] = part
            if len(parts) < 3:
                return
            del self.waiting[key]
            self.running[key] = None
            self.threads[key] = threading.current_thread()
        self._run(key, parts)

    def _run(self, key: str, parts: dict) -> None:
        (out, _, _), (err, _, _), (ctrl, pending, spawn) = parts[ssh.STDOUT], parts[ssh.STDERR], parts[ssh.CONTROL]
        env = dict(self.env)
        env.update(spawn.env)
        code = -signal.SIGKILL
        try:
            home = ssh_agent.SshHome(ctrl.fileno(), err.fileno(), pending)
            code = far_end.run(spawn.argv, env, home, cwd=spawn.cwd or None, fds=(out.fileno(), err.fileno()),
                               server=spawn.server or None, alone=False,
                               on_start=lambda controller: self._started(key, controller, ctrl))
        finally:
            out.close()
            err.close()
            try:
                # The code alone: an older launcher reads no more fields (the
                # end's facts went home on stderr, the pid in Started).
                ctrl.sendall(ssh.Exit(code).line())
            except OSError:
                pass  # the launcher is gone
            ctrl.close()
            with self.lock:
                self.running.pop(key, None)
                self.threads.pop(key, None)

    def _started(self, key: str, controller: far_end.Controller, ctrl: socket.socket) -> None:
        try:  # this thread alone writes to ctrl: the Exit line comes later, from it too
            ctrl.sendall(ssh.Started(controller.pid).line())
        except OSError:
            pass  # the launcher is gone; the listener hears the EOF and kills the group
        with self.lock:
            stopped = self.stopped
            if not stopped:
                self.running[key] = controller
        if stopped:  # the session ended meanwhile
            controller.group.send(signal.SIGKILL)

    def stop(self) -> None:
        """The session's end: kill every controller and what it left."""
        with self.lock:
            self.stopped = True
            controllers = [c for c in self.running.values() if c is not None]
            threads = list(self.threads.values())
            waiting = [part[0] for parts in self.waiting.values() for part in parts.values()]
        self.listener.close()
        for conn in waiting:
            conn.close()
        for controller in controllers:
            controller.group.send(signal.SIGKILL)  # refused once it is reaped: the id may be another's
        end = time.monotonic() + REPORT_WAIT  # for each one's exit to be told, if anyone listens
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))
        reaper.kill_descendants()
        shutil.rmtree(self.folder, ignore_errors=True)
