"""The SSH connections: one ControlMaster per host, its preflight, and the forwards.

One connection per host, opened before anything starts: a ControlMaster whose
own session is the preflight check (versions of python, jax, jaxlib and
jaxrun, and the address the host was reached at).  That session then waits on
stdin, so the master lives exactly as long as jaxrun holds the pipe: closed at
the end, or closed by the kernel if jaxrun is SIGKILLed.  Meanwhile it
answers requests written there: it holds the coordinator's port on the first
host while every other host's session checks that it reaches it.

Every local ``ssh`` client starts with the stop signals blocked
(:mod:`jaxrun.backends.shield`): a SIGTERM sent to jaxrun's whole tree at
once must not drop a connection, on which the host's agent would kill its
processes at once instead of letting them use their grace.  (Inherited
SIG_IGN would do for the master, whose main loop keeps it; a session over
the master installs its own handlers whatever it inherits.)

The same session is the host agent (:mod:`jaxrun.backends.ssh.host_agent`).
``open_channels`` forwards a local socket to it (``ssh -O forward``) and pings
it there; a host whose server refuses to forward gets a session per process
instead (``start_session``).  The children that use either way are in
:mod:`jaxrun.backends.ssh.children`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence

from jaxrun import contract, portable
from jaxrun.backends.shield import shielded
from jaxrun.backends.ssh.commands import (
    check_preflight,
    forward_args,
    master_control,
    preflight_words,
    remote_command,
    session_control,
    ssh_args,
)
from jaxrun.backends.ssh.options import SshOptions
from jaxrun.core.backend import RunHooks, start_thread, wait_until
from jaxrun.core.config import LaunchError
from jaxrun.core.spec import Host
from jaxrun.wire import encoding, preflight, ssh
from jaxrun.wire.preflight import PreflightKey as Key

# A server's default MaxSessions is 10 per connection; the master's own session
# takes one.  Processes beyond this many on one host get a connection of their own.
SESSIONS_PER_MASTER = 9
# Python start-up and metadata reads on top of the connect timeout.
PREFLIGHT_SLACK = 20.0
MASTER_CLOSE_WAIT = 3.0
PING_WAIT = 5.0  # for a host agent's answer over a forwarded channel


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def read_answer(stdout, answers: dict[str, bytes], name: str, mark: bytes = preflight.PREFLIGHT_ANSWER,
                skip: int = 0) -> None:
    """The preflight session's next line that starts with ``mark`` (its
    answer, or a reply) after ``skip`` such lines, or b"" if the session
    ended without one."""
    for line in iter(stdout.readline, b""):
        if line.startswith(mark) and skip:
            skip -= 1
        elif line.startswith(mark):
            answers[name] = line
            return
    answers[name] = b""


def read_reply(line: bytes | None) -> encoding.Message | None:
    """The request's reply in a ``preflight.PREFLIGHT_REPLY`` line (a line that
    says something else fails), or None for none."""
    if not line:
        return None
    try:
        return encoding.decode(line[len(preflight.PREFLIGHT_REPLY):])
    except encoding.WireError as e:
        return preflight.Failed(str(e))


def _reason(reply: encoding.Message) -> str:
    return reply.reason if isinstance(reply, preflight.Failed) else f"unexpected reply {reply.encode()[:200]!r}"


def send_env(popen: subprocess.Popen, env: Mapping[str, str]) -> None:
    """The environment, first thing on the session's stdin.  The pipe is made
    big enough to take it at once, so this never waits on the network."""
    frame = ssh.env_frame(dict(env))
    # Where pipes have a fixed size, or over the system's limit, the write
    # below may wait for ssh to read.
    portable.set_pipe_size(popen.stdin.fileno(), max(len(frame) + 4096, 1 << 16))
    view = memoryview(frame)
    try:
        while view:
            view = view[popen.stdin.write(view):]
    except OSError:
        pass  # the client is already gone; its exit status says why


SSH_SOCKET_ROOM = len("/jaxrun-ssh-12345678/m9999.") + 16


class Connections:
    """One ControlMaster per host, in a private folder removed at the end."""

    def __init__(self, settings: SshOptions, hosts: Sequence[Host], hooks: RunHooks | None = None):
        self.hooks = hooks or RunHooks()
        self.settings = settings
        self.hosts = list(hosts)
        self.slot = {host.name: index for index, host in enumerate(self.hosts)}  # stays when a host is left out
        # Mode 0700: sockets stay private.  ssh binds each master's socket at
        # its path plus a dot and 16 random letters: with a long $TMPDIR the
        # folder goes under /tmp, so that ssh's path still fits.
        self.dir = tempfile.mkdtemp(prefix="jaxrun-ssh-", dir=portable.temp_base_for_sockets(SSH_SOCKET_ROOM))
        self.masters: dict[str, subprocess.Popen] = {}
        self.results: dict[str, dict] = {}
        self.sessions: dict[str, list[subprocess.Popen]] = {}
        self.unread: dict[str, int] = {}  # per host: replies to requests sent with tell()
        self.left_out: dict[str, str] = {}  # host -> why: failed a tolerant preflight

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def control_path(self, host: Host) -> str:
        return os.path.join(self.dir, f"m{self.slot[host.name]}")

    def session_args(self, host: Host, *, direct: bool = False) -> list[str]:
        path = self.control_path(host) if host.name in self.masters and not direct else None
        return ssh_args(self.settings, host, session_control(path))

    def start_session(self, host: Host, command: str, env: Mapping[str, str],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> subprocess.Popen:
        """A process's own ssh session, over the host's master while it has
        sessions to spare (counting only those still running, for restarts)."""
        live = [p for p in self.sessions.get(host.name, []) if p.poll() is None]
        with shielded():  # a session over the master installs its handlers whatever it inherits
            popen = subprocess.Popen(
                self.session_args(host, direct=len(live) >= SESSIONS_PER_MASTER) + [command],
                stdin=subprocess.PIPE,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # a Ctrl-C in the terminal is jaxrun's to handle
                bufsize=0,
            )
        self.sessions[host.name] = live + [popen]
        send_env(popen, env)
        return popen

    # -- preflight ---------------------------------------------------------
    def preflight(self, servers: Mapping[str, Sequence[str]] | None = None,
                  tolerate: bool = False) -> dict[str, dict]:
        """Open every master at once and read each one's report, within one
        deadline.  Raises LaunchError naming each host that failed, or, with
        ``tolerate`` (an elastic restart), leaves those hosts out and keeps
        why in ``left_out``.  ``servers``: per host, the preloading server the
        preflight starts there (its name, then its modules: the name goes in
        the session's environment, never on its command line)."""
        answers: dict[str, bytes] = {}
        readers = []
        for host in self.hosts:
            hold = host is self.hosts[0]  # the coordinator's host: it holds a free port from the start
            server = (servers or {}).get(host.name)
            command = remote_command(preflight_words(self.settings, list(server[1:]) if server else None, hold,
                                                     self.settings.python_on(host)), self.settings.setup)
            env = {**self.settings.env, contract.FORKSERVER_NAME: server[0]} if server else self.settings.env
            master = self.masters[host.name] = self._start_master(host, command, env)
            readers.append(start_thread(f"ssh-preflight:{host.name}", read_answer, master.stdout, answers,
                                        host.name, hooks=self.hooks))
        # A signal or --timeout ends this wait (Interrupted); close() then ends the masters.
        wait_until(lambda: not any(r.is_alive() for r in readers), self.hooks,
                   self.settings.connect_timeout + PREFLIGHT_SLACK)
        problems: dict[str, str] = {}
        for host in self.hosts:
            try:
                self.results[host.name] = self._answer(host, answers.get(host.name))
            except LaunchError as e:
                problems[host.name] = str(e)
        if tolerate:
            self._leave_out(problems)
            problems = {}
        if not problems:
            mismatch = check_preflight(self.results, self.settings.python,
                                       {h.name: self.settings.python_on(h) for h in self.hosts})
            if mismatch:
                raise LaunchError("; ".join(mismatch))
        if problems:
            raise LaunchError("; ".join(problems.values()))
        return self.results

    def _leave_out(self, problems: Mapping[str, str]) -> None:
        """Hosts that failed their preflight take no further part: their
        masters are ended (each already has, or was killed)."""
        self.left_out.update(problems)
        for name in problems:
            master = self.masters.pop(name)
            if master.poll() is None:
                master.kill()
            master.wait()
        self.hosts = [host for host in self.hosts if host.name not in problems]

    def _start_master(self, host: Host, command: str, env: Mapping[str, str]) -> subprocess.Popen:
        with open(self._stderr_path(host), "wb") as stderr, shielded():
            master = subprocess.Popen(
                ssh_args(self.settings, host, master_control(self.control_path(host))) + [command],
                stdin=subprocess.PIPE,  # held until close(): EOF ends the master
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
                bufsize=0,
            )
        send_env(master, env)
        return master

    def _stderr_path(self, host: Host) -> str:
        return self.control_path(host) + ".stderr"

    def _answer(self, host: Host, line: bytes | None) -> dict:
        master = self.masters[host.name]
        if line:
            try:
                return preflight.parse_preflight_answer(line)
            except encoding.WireError:
                raise LaunchError(f"{host.name}: unexpected preflight answer {line[:200]!r}") from None
        if line is None:
            master.kill()
            master.wait()
            limit = self.settings.connect_timeout + PREFLIGHT_SLACK
            raise LaunchError(f"{host.name}: no answer over ssh within {limit:g} s")
        code = master.wait()
        with open(self._stderr_path(host), "rb") as f:
            reason = last_line(f.read().decode(errors="replace")) or "no error message"
        what = "ssh failed" if code == 255 else f"{self.settings.python_on(host)} exited with status {code}"
        raise LaunchError(f"{host.name}: {what}: {reason}")

    # -- the coordinator ---------------------------------------------------
    def choose_coordinator(self, fixed: str | None) -> tuple[str, str]:
        """(address every process connects to, address process 0 binds).

        Process 0 binds the address the launcher reached the first host at
        (the server side of its SSH_CONNECTION), not every interface: the
        coordination service has no authentication."""
        first = self.hosts[0]
        if fixed:
            address, port = fixed.rsplit(":", 1)
            address = address.strip("[]")
            self._hold_port(first, address, int(port), f"--coordinator {fixed}")
            self._check_reachable(first, address, int(port))
            return fixed, fixed
        address = self.results[first.name].get(Key.ADDRESS)
        if not address:
            raise LaunchError(f"{first.name}: SSH_CONNECTION is not set there; pass --coordinator HOST:PORT")
        remote_peers = [h.name for h in self.hosts[1:]
                        if not contract.is_loopback(self.results[h.name].get(Key.ADDRESS))]
        if contract.is_loopback(address) and remote_peers:
            raise LaunchError(
                f"{first.name} was reached over loopback ({address}), which {remote_peers[0]} cannot "
                "connect to; list a routable host first or pass --coordinator HOST:PORT"
            )
        port = self.results[first.name].pop(Key.PORT, None)  # held since the preflight (the first attempt)
        if not isinstance(port, int):
            port = self._hold_port(first, address, 0, f"{first.name}")
        self._check_reachable(first, address, port)
        where = contract.join_address(address, port)
        return where, where

    def ask(self, requests: Mapping[str, encoding.Message], within: float) -> dict[str, encoding.Message | None]:
        """Send each named host's preflight session one request (see
        :mod:`jaxrun.backends.ssh.preflight`), all at once, and wait for the
        replies together: {host: reply, or None for none within ``within`` seconds}."""
        answers: dict[str, bytes] = {}
        readers = []
        for name, request in requests.items():
            master = self.masters[name]
            try:
                master.stdin.write(request.line())
            except OSError:
                answers[name] = b""
                continue
            readers.append(start_thread(f"ssh-ask:{name}", read_answer, master.stdout, answers, name,
                                        preflight.PREFLIGHT_REPLY,
                                        self.unread.pop(name, 0), hooks=self.hooks))
        wait_until(lambda: not any(r.is_alive() for r in readers), self.hooks, within)
        return {name: read_reply(answers.get(name)) for name in requests}

    def tell(self, name: str, request: encoding.Message) -> None:
        """A request whose reply nobody waits for: the next ``ask`` of that
        host skips it (replies come in order).  ``preflight.Unlisten`` lets the
        port go long before process 0, still to start, binds it."""
        try:
            self.masters[name].stdin.write(request.line())
            self.unread[name] = self.unread.get(name, 0) + 1
        except OSError:
            pass

    def _hold_port(self, host: Host, address: str, port: int, what: str) -> int:
        """Listen on ``address``:``port`` on ``host`` (0: a free port) until the
        next request to that host; the port."""
        reply = self.ask({host.name: preflight.Listen(address, port)},
                         self.settings.connect_timeout + PREFLIGHT_SLACK)[host.name]
        if reply is None:
            raise LaunchError(f"{what}: no answer from {host.name} while looking for a free port")
        if not isinstance(reply, preflight.Listening):
            raise LaunchError(f"{what}: cannot listen on {address}:{port} on {host.name} ({_reason(reply)})")
        return reply.port

    def _check_reachable(self, first: Host, address: str, port: int) -> None:
        """Every other host connects to the coordinator's address and port
        while the first host's preflight session holds it: a firewall or a
        wrong interface is named now, not after JAX's five-minute
        initialization timeout.  The port is let go of in the end."""
        limit = self.settings.connect_timeout
        others = {h.name for h in self.hosts if h.name != first.name}
        try:
            replies = self.ask({name: preflight.Connect(address, port, limit) for name in others},
                               limit + PREFLIGHT_SLACK)
        finally:
            self.tell(first.name, preflight.Unlisten())
        problems = []
        for name in sorted(others, key=[h.name for h in self.hosts].index):
            reply = replies[name]
            if reply is None:
                problems.append(f"{name}: no answer while checking that it reaches the coordinator")
            elif not isinstance(reply, preflight.Reached):
                problems.append(f"{name}: cannot reach the coordinator at {address}:{port} on {first.name} "
                                f"({_reason(reply)}); check firewalls, or pass --coordinator HOST:PORT")
        if problems:
            raise LaunchError("; ".join(problems))

    # -- channels --------------------------------------------------------------
    def open_channels(self) -> dict[str, str]:
        """{host: the local socket forwarded to its agent} for every host
        whose agent listens and whose server forwards to it (see
        :mod:`jaxrun.backends.ssh.host_agent`); the other hosts' processes get a
        session each."""
        forwards = {}
        for host in self.hosts:
            remote = self.results[host.name].get(Key.CHANNELS)
            local = self.control_path(host) + ".c"
            if not remote or host.name in forwards or ":" in remote + local:
                continue
            try:
                with shielded():
                    forwards[host.name] = (local, subprocess.Popen(
                        forward_args(self.settings, host, self.control_path(host), local, remote),
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            except OSError:
                pass
        try:
            wait_until(lambda: all(popen.poll() is not None for _, popen in forwards.values()), self.hooks,
                       self.settings.connect_timeout)
        finally:
            for _, popen in forwards.values():
                if popen.poll() is None:
                    popen.kill()
                popen.wait()
        answered: dict[str, bool] = {}
        pings = [start_thread(f"ssh-ping:{name}", lambda n=name, at=local: answered.update({n: ping(at)}),
                              hooks=self.hooks)
                 for name, (local, popen) in forwards.items() if popen.returncode == 0]
        wait_until(lambda: not any(t.is_alive() for t in pings), self.hooks, PING_WAIT)
        return {name: local for name, (local, _) in forwards.items() if answered.get(name)}

    # -- the end -------------------------------------------------------------
    def abort(self) -> None:
        """Kill every local ssh client: each remote agent sees EOF and kills its group."""
        for popen in [*self.masters.values(), *(p for ps in self.sessions.values() for p in ps)]:
            if popen.poll() is None:
                try:
                    popen.kill()
                except OSError:
                    pass

    def close(self) -> None:
        """EOF to every master's session; it exits once its sessions are done."""
        for master in self.masters.values():
            try:
                master.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + MASTER_CLOSE_WAIT
        for master in self.masters.values():
            try:
                master.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait()
            master.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def ping(path: str) -> bool:
    """Whether the host agent behind the forwarded socket ``path`` answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(PING_WAIT)
            sock.connect(path)
            sock.sendall(ssh.Channel("", ssh.PING).line())
            answer = b""
            while len(answer) < len(ssh.CHANNEL_PONG) and (data := sock.recv(64)):
                answer += data
            return answer == ssh.CHANNEL_PONG
    except OSError:
        return False
