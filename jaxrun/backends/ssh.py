"""Running controllers on other hosts with the system's OpenSSH client.

One connection per host, opened before anything starts: a ControlMaster whose
own session is the preflight check (versions of python, jax, jaxlib and
jaxrun, and the address the host was reached at).  That session then waits on
stdin, so the master lives exactly as long as jaxrun holds the pipe: closed at
the end, or closed by the kernel if jaxrun is SIGKILLed.  Meanwhile it
answers requests written there: it holds the coordinator's port on the first
host while every other host's session checks that it reaches it.

The same session is the host's agent (:mod:`jaxrun.backends.ssh_host`): it
runs every process of its host, each over three channels of the connection
that exists already (a local socket forwarded to the agent's with ``ssh -O
forward``), so a process costs no session, no remote shell and no
interpreter of its own (:class:`ChannelChild`).  Where the server refuses to
forward, each process gets a session on the master instead, running its own
agent (:mod:`jaxrun.backends.ssh_agent`), which relays the signals we write to
the ssh client's stdin and kills the shim's group when that stdin reaches EOF
(:class:`SshChild`).  Either way ``send`` works like a local ``killpg``, and a
dropped connection or a dead jaxrun ends the remote job.

Every remote word is ``shlex.quote``d (see :mod:`jaxrun.backends.ssh_commands`);
the remote shell sees plain words only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Mapping, Sequence, TextIO

from jaxrun import contract, portable, wire
from jaxrun.backends.ssh_commands import (
    ANSWER,
    REPLY,
    check_preflight,
    forward_args,
    master_control,
    preflight_table,
    preflight_words,
    process_env,
    process_words,
    remote_command,
    server_words,
    session_control,
    ssh_args,
)
from jaxrun.core.backend import Backend, RunHooks, start_thread, wait_until
from jaxrun.core.config import LaunchError, SshOptions
from jaxrun.core.spec import Host, ProcessSpec

# A server's default MaxSessions is 10 per connection; the master's own session
# takes one.  Processes beyond this many on one host get a connection of their own.
SESSIONS_PER_MASTER = 9
# After SIGKILL has been written, how long the remote side gets to finish
# before the local ssh client is killed (which closes the channel anyway).
CLIENT_KILL_WAIT = 3.0
# Python start-up and metadata reads on top of the connect timeout.
PREFLIGHT_SLACK = 20.0
MASTER_CLOSE_WAIT = 3.0
PING_WAIT = 5.0  # for a host agent's answer over a forwarded channel

def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def read_answer(stdout, answers: dict[str, bytes], name: str, mark: bytes = ANSWER, skip: int = 0) -> None:
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


def _reason(reply: str) -> str:
    return reply[len("error "):] if reply.startswith("error ") else reply


def send_env(popen: subprocess.Popen, env: Mapping[str, str]) -> None:
    """The environment, first thing on the session's stdin.  The pipe is made
    big enough to take it at once, so this never waits on the network."""
    frame = wire.env_frame(dict(env))
    # Where pipes have a fixed size, or over the system's limit, the write
    # below may wait for ssh to read.
    portable.set_pipe_size(popen.stdin.fileno(), max(len(frame) + 4096, 1 << 16))
    view = memoryview(frame)
    try:
        while view:
            view = view[popen.stdin.write(view):]
    except OSError:
        pass  # the client is already gone; its exit status says why


class Connections:
    """One ControlMaster per host, in a private folder removed at the end."""

    def __init__(self, settings: SshOptions, hosts: Sequence[Host], hooks: RunHooks | None = None):
        self.hooks = hooks or RunHooks()
        self.settings = settings
        self.hosts = list(hosts)
        self.dir = tempfile.mkdtemp(prefix="jaxrun-ssh-")  # mode 0700: sockets stay private
        self.masters: dict[str, subprocess.Popen] = {}
        self.results: dict[str, dict] = {}
        self.sessions: dict[str, list[subprocess.Popen]] = {}
        self.unread: dict[str, int] = {}  # per host: replies to requests sent with tell()

    def __enter__(self) -> "Connections":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def control_path(self, host: Host) -> str:
        return os.path.join(self.dir, f"m{self.hosts.index(host)}")

    def session_args(self, host: Host, *, direct: bool = False) -> list[str]:
        path = self.control_path(host) if host.name in self.masters and not direct else None
        return ssh_args(self.settings, host, session_control(path))

    def start_session(self, host: Host, command: str, env: Mapping[str, str],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> subprocess.Popen:
        """A process's own ssh session, over the host's master while it has
        sessions to spare (counting only those still running, for restarts)."""
        live = [p for p in self.sessions.get(host.name, []) if p.poll() is None]
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
    def preflight(self, servers: Mapping[str, Sequence[str]] | None = None) -> dict[str, dict]:
        """Open every master at once and read each one's report, within one
        deadline.  Raises LaunchError naming each host that failed.
        ``servers``: per host, the preloading server the preflight starts there."""
        answers: dict[str, bytes] = {}
        readers = []
        for host in self.hosts:
            hold = host is self.hosts[0]  # the coordinator's host: it holds a free port from the start
            command = remote_command(preflight_words(self.settings, (servers or {}).get(host.name, ()), hold))
            master = self.masters[host.name] = self._start_master(host, command)
            readers.append(start_thread(f"ssh-preflight:{host.name}", read_answer, master.stdout, answers,
                                        host.name, hooks=self.hooks))
        # A signal or --timeout ends this wait (Interrupted); close() then ends the masters.
        wait_until(lambda: not any(r.is_alive() for r in readers), self.hooks,
                   self.settings.connect_timeout + PREFLIGHT_SLACK)
        problems = []
        for host in self.hosts:
            try:
                self.results[host.name] = self._answer(host, answers.get(host.name))
            except LaunchError as e:
                problems.append(str(e))
        if not problems:
            problems = check_preflight(self.results, self.settings.python)
        if problems:
            raise LaunchError("; ".join(problems))
        return self.results

    def _start_master(self, host: Host, command: str) -> subprocess.Popen:
        with open(self._stderr_path(host), "wb") as stderr:
            master = subprocess.Popen(
                ssh_args(self.settings, host, master_control(self.control_path(host))) + [command],
                stdin=subprocess.PIPE,  # held until close(): EOF ends the master
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
                bufsize=0,
            )
        send_env(master, self.settings.env)
        return master

    def _stderr_path(self, host: Host) -> str:
        return self.control_path(host) + ".stderr"

    def _answer(self, host: Host, line: bytes | None) -> dict:
        master = self.masters[host.name]
        if line:
            try:
                return json.loads(line[len(ANSWER):])
            except ValueError:
                raise LaunchError(f"{host.name}: unexpected preflight answer {line[:200]!r}") from None
        if line is None:
            master.kill()
            master.wait()
            limit = self.settings.connect_timeout + PREFLIGHT_SLACK
            raise LaunchError(f"{host.name}: no answer over ssh within {limit:g} s")
        code = master.wait()
        with open(self._stderr_path(host), "rb") as f:
            reason = last_line(f.read().decode(errors="replace")) or "no error message"
        what = "ssh failed" if code == 255 else f"{self.settings.python} exited with status {code}"
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
        address = self.results[first.name].get("address")
        if not address:
            raise LaunchError(f"{first.name}: SSH_CONNECTION is not set there; pass --coordinator HOST:PORT")
        remote_peers = [h.name for h in self.hosts[1:] if not contract.is_loopback(self.results[h.name].get("address"))]
        if contract.is_loopback(address) and remote_peers:
            raise LaunchError(
                f"{first.name} was reached over loopback ({address}), which {remote_peers[0]} cannot "
                "connect to; list a routable host first or pass --coordinator HOST:PORT"
            )
        port = self.results[first.name].pop("port", None)  # held since the preflight (the first attempt)
        if not isinstance(port, int):
            port = self._hold_port(first, address, 0, f"{first.name}")
        self._check_reachable(first, address, port)
        where = contract.join_address(address, port)
        return where, where

    def ask(self, requests: Mapping[str, Sequence[str]], within: float) -> dict[str, str | None]:
        """Send each named host's preflight session one request (see
        ``ssh_commands.PREFLIGHT``), all at once, and wait for the replies
        together: {host: reply, or None for none within ``within`` seconds}."""
        answers: dict[str, bytes] = {}
        readers = []
        for name, words in requests.items():
            master = self.masters[name]
            try:
                master.stdin.write((" ".join(words) + "\n").encode())
            except OSError:
                answers[name] = b""
                continue
            readers.append(start_thread(f"ssh-ask:{name}", read_answer, master.stdout, answers, name, REPLY,
                                        self.unread.pop(name, 0), hooks=self.hooks))
        wait_until(lambda: not any(r.is_alive() for r in readers), self.hooks, within)
        return {name: answers[name][len(REPLY):].decode(errors="replace").strip() if answers.get(name) else None
                for name in requests}

    def tell(self, name: str, words: Sequence[str]) -> None:
        """A request whose reply nobody waits for: the next ``ask`` of that
        host skips it (replies come in order).  "unlisten" lets the port go
        long before process 0, still to start, binds it."""
        try:
            self.masters[name].stdin.write((" ".join(words) + "\n").encode())
            self.unread[name] = self.unread.get(name, 0) + 1
        except OSError:
            pass

    def _hold_port(self, host: Host, address: str, port: int, what: str) -> int:
        """Listen on ``address``:``port`` on ``host`` (0: a free port) until the
        next request to that host; the port."""
        reply = self.ask({host.name: ["listen", address, str(port)]},
                         self.settings.connect_timeout + PREFLIGHT_SLACK)[host.name]
        if reply is None:
            raise LaunchError(f"{what}: no answer from {host.name} while looking for a free port")
        if not reply.startswith("listening "):
            raise LaunchError(f"{what}: cannot listen on {address}:{port} on {host.name} ({_reason(reply)})")
        return int(reply.split()[1])

    def _check_reachable(self, first: Host, address: str, port: int) -> None:
        """Every other host connects to the coordinator's address and port
        while the first host's preflight session holds it: a firewall or a
        wrong interface is named now, not after JAX's five-minute
        initialization timeout.  The port is let go of in the end."""
        limit = self.settings.connect_timeout
        others = {h.name for h in self.hosts if h.name != first.name}
        try:
            replies = self.ask({name: ["connect", address, str(port), f"{limit:g}"] for name in others},
                               limit + PREFLIGHT_SLACK)
        finally:
            self.tell(first.name, ["unlisten"])
        problems = []
        for name in sorted(others, key=[h.name for h in self.hosts].index):
            reply = replies[name]
            if reply is None:
                problems.append(f"{name}: no answer while checking that it reaches the coordinator")
            elif reply != "reached":
                problems.append(f"{name}: cannot reach the coordinator at {address}:{port} on {first.name} "
                                f"({_reason(reply)}); check firewalls, or pass --coordinator HOST:PORT")
        if problems:
            raise LaunchError("; ".join(problems))

    # -- channels --------------------------------------------------------------
    def open_channels(self) -> dict[str, str]:
        """{host: the local socket forwarded to its agent} for every host
        whose agent listens and whose server forwards to it (see
        :mod:`jaxrun.backends.ssh_host`); the other hosts' processes get a
        session each."""
        forwards = {}
        for host in self.hosts:
            remote = self.results[host.name].get("channels")
            local = self.control_path(host) + ".c"
            if not remote or host.name in forwards or ":" in remote + local:
                continue
            try:
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
            sock.sendall(wire.Channel("", "ping").line())
            answer = b""
            while len(answer) < len(wire.CHANNEL_PONG) and (data := sock.recv(64)):
                answer += data
            return answer == wire.CHANNEL_PONG
    except OSError:
        return False


class ChannelChild:
    """A remote controller whose stdout, stderr and control travel on three
    channels of its host's connection, to that host's agent (see
    :mod:`jaxrun.backends.ssh_host`)."""

    sends_error_record = True  # as the last bytes of stderr
    reports_joins = True  # wire.JOINED_MARKER on stderr

    def __init__(self, path: str, spawn: wire.Spawn, pid: int, host: str):
        self.pid = pid  # the local master's: the remote pid is not known here
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._write_closed = False
        self._killed = False
        key = uuid.uuid4().hex
        socks = []
        try:
            for role in ("stdout", "stderr", "ctrl"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                socks.append(sock)
                sock.connect(path)
                sock.sendall(wire.Channel(key, role).line())
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
                self._ctrl.sendall(wire.Signal.of(signum).line())
                if signum == signal.SIGKILL:
                    self._killed = True
                    self._write_closed = True
                    self._ctrl.shutdown(socket.SHUT_WR)  # EOF: the agent kills the group
            except OSError:
                self._write_closed = True
                return
        if signum == signal.SIGKILL:
            timer = threading.Timer(CLIENT_KILL_WAIT, self._hang_up)
            timer.daemon = True
            timer.start()

    def _hang_up(self) -> None:
        # No word from the host in time (a hung connection): end the streams
        # and the wait here; the agent kills the group at the channels' EOF.
        with self._lock:
            if self._done.is_set():
                return
            for sock in self._socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def wait(self) -> int:
        code = 255  # no Exit line: the connection is gone, as ssh's own failure
        if self._ctrl is not None:
            try:
                with self._ctrl.makefile("rb") as lines:
                    for raw in lines:
                        try:
                            msg = wire.decode(raw)
                        except wire.WireError:
                            continue
                        if isinstance(msg, wire.Exit):
                            code = msg.returncode
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
        return code


class SshChild:
    """A remote controller, seen through its local ssh client."""

    sends_error_record = True  # as the last bytes of stderr: see ssh_agent
    reports_joins = True  # wire.JOINED_MARKER on stderr: see ssh_agent

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid  # the local ssh client's; the remote pid is not known here
        self.stdout = popen.stdout
        self.stderr = popen.stderr
        self._lock = threading.Lock()

    def send(self, signum: int) -> None:
        with self._lock:
            stdin = self.popen.stdin
            if stdin.closed:
                return
            try:
                stdin.write(wire.Signal.of(signum).line())
                if signum == signal.SIGKILL:
                    stdin.close()  # EOF: the agent kills the group
            except OSError:
                stdin.close()
                return
        if signum == signal.SIGKILL:
            timer = threading.Timer(CLIENT_KILL_WAIT, self._kill_client)
            timer.daemon = True
            timer.start()

    def _kill_client(self) -> None:
        # The channel did not close in time (a hung connection): closing the
        # client ends the session, and sshd then closes the agent's stdin.
        if self.popen.poll() is None:
            self.popen.kill()

    def wait(self) -> int:
        return contract.returncode_from_status(self.popen.wait())


class SshBackend(Backend):
    """Controllers on the hosts of a hosts file, over the system's ssh client."""

    name = "ssh"

    def __init__(self, settings: SshOptions, hosts: Sequence[Host], console: TextIO, verbose: bool = False,
                 preload: bool = False, preload_modules: Sequence[str] = ()):
        self.settings = settings
        self.hosts = list(hosts)
        self.console = console
        self.verbose = verbose
        self.preload = preload
        self.preload_modules = tuple(preload_modules)
        self.connections: Connections | None = None
        self.servers: dict[str, tuple[str, subprocess.Popen]] = {}  # host name -> (socket name, session)
        self.serving: set[str] = set()  # hosts whose server this attempt uses
        self.channels: dict[str, str] = {}  # host name -> local socket forwarded to its agent

    def open(self) -> None:
        self.connections = Connections(self.settings, self.hosts, self.hooks)
        # Each host's preloading server starts with its preflight, so that its
        # import of jax overlaps the rest of the start; only a --preload-module
        # that --sync has yet to bring waits for the copy.
        early = self.preload and not (self.settings.sync and self.preload_modules)
        if early:
            for index, host in enumerate(self.hosts):
                self.servers.setdefault(host.name, (f"jaxrun-{os.getpid()}-{uuid.uuid4().hex}-{index}", None))
        results = self.connections.preflight(
            {name: (socket_name, *self.preload_modules) for name, (socket_name, _) in self.servers.items()})
        if self.verbose:
            for line in preflight_table(results):
                print(line, file=self.console, flush=True)
        by_machine: dict[str, list[str]] = {}
        for name, info in results.items():
            by_machine.setdefault(info.get("machine") or name, []).append(name)
        for names in by_machine.values():
            if len(names) > 1:
                print(f"jaxrun: {' and '.join(names)} are one machine (same hostname and machine-id): "
                      "their processes share its local ranks and devices", file=self.console, flush=True)
        if self.settings.sync:
            from jaxrun.backends import ssh_sync

            copied = ssh_sync.sync(self.settings.chdir, self.hosts, self.connections.session_args,
                                   lambda host: bool(results[host.name].get("rsync")), self.hooks)
            if self.verbose:
                print(f"jaxrun: --sync: {self.settings.chdir} is on {len(copied)} host(s)",
                      file=self.console, flush=True)
        if self.preload and not early:
            self._start_servers()
        self.channels = self.connections.open_channels()
        if self.verbose:
            for name in results:
                how = "channels of its connection" if name in self.channels else "a session each"
                print(f"jaxrun: {name}: processes run over {how}", file=self.console, flush=True)

    def choose_coordinator(self, fixed: str | None) -> tuple[str, str]:
        return self.connections.choose_coordinator(fixed)

    def _start_servers(self) -> None:
        """One preloading server per host, started as soon as the hosts are
        known good (and synced), so that its ``import jax`` overlaps the rest
        of the start.  It serves every attempt; a controller reads the JAX_*
        values of its own environment again after the fork (see
        ``child.bootstrap.sync_preloaded_config``), so the server needs only
        what every process gets: the user's --env/-x."""
        env = dict(self.settings.env)
        env["PYTHONUNBUFFERED"] = "1"
        for host in self.hosts:
            if host.name in self.servers:
                continue  # one host listed twice
            socket_name = f"jaxrun-{os.getpid()}-{uuid.uuid4().hex}"
            words = server_words(self.settings.python, self.settings.chdir, socket_name, self.preload_modules)
            session = self.connections.start_session(host, remote_command(words), env,
                                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self.start_thread(f"ssh-preload-log:{host.name}", self._relay_server_stderr, host.name, session.stderr)
            self.servers[host.name] = (socket_name, session)

    def _relay_server_stderr(self, name: str, stderr) -> None:
        """What a host's server says (an import that failed) goes to the console."""
        for line in iter(stderr.readline, b""):
            print(f"jaxrun: {name}: {line.decode(errors='replace').rstrip()}", file=self.console, flush=True)
        stderr.close()

    def begin_attempt(self, specs: Sequence[ProcessSpec], log_dir: str) -> None:
        """A host whose processes differ in what jax reads at import starts
        them fresh this attempt; the others use the host's server."""
        from jaxrun.backends.forkserver import differing_import_time_vars

        by_host: dict[str, list[ProcessSpec]] = {}
        for spec in specs:
            by_host.setdefault(spec.host.name, []).append(spec)
        self.serving = {name for name, host_specs in by_host.items()
                        if name in self.servers and not differing_import_time_vars(host_specs)}

    def _stop_servers(self) -> None:
        """EOF ends each host's server (and whatever its controllers left)."""
        servers, self.servers = list(self.servers.values()), {}
        servers = [(name, session) for name, session in servers if session is not None]  # the rest end with the masters
        for _, session in servers:
            try:
                session.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + MASTER_CLOSE_WAIT
        for _, session in servers:
            try:
                session.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                session.kill()
                session.wait()

    def plan_facts(self) -> dict:
        results = self.connections.results
        gpus = {name: info["gpus"] for name, info in results.items() if info.get("gpus")}
        machines = {name: info["machine"] for name, info in results.items() if info.get("machine")}
        return {"host_devices": gpus, "host_machines": machines}

    def dry_run_coordinator(self, fixed: str | None) -> tuple[str, str | None]:
        return fixed or f"{self.hosts[0].name}:PORT", None  # no host is contacted

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None) -> SshChild | ChannelChild:
        del lifeline_fd  # the remote side's lifeline is the ssh channel itself
        server = self.servers[spec.host.name][0] if spec.host.name in self.serving else None
        env = process_env(spec, extra_env)
        channel = self.channels.get(spec.host.name)
        if channel:
            master = self.connections.masters[spec.host.name]
            return ChannelChild(channel, wire.Spawn(list(spec.argv), env, self.settings.chdir, server or ""),
                                master.pid, spec.host.name)
        words = process_words(spec, self.settings.chdir, self.settings.python, server)
        return SshChild(self.connections.start_session(spec.host, remote_command(words), env))

    def close(self) -> None:
        self._stop_servers()
        if self.connections is not None:
            self.connections.close()

    def abort(self) -> None:
        if self.connections is not None:
            self.connections.abort()
