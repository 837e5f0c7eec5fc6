"""Running controllers on other hosts with the system's OpenSSH client.

One connection per host, opened before anything starts: a ControlMaster whose
own session is the preflight check (versions of python, jax, jaxlib and
jaxrun, and the address the host was reached at).  That session then waits on
stdin, so the master lives exactly as long as jaxrun holds the pipe: closed at
the end, or closed by the kernel if jaxrun is SIGKILLed.  Every process
session and the coordinator's port probe ride on that master, so N processes
on a host cost one handshake.

Each process runs ``python -m jaxrun.remote`` (see there), which relays the
signal names we write to the ssh client's stdin, and kills the shim's group
when that stdin reaches EOF.  So ``SshChild.send`` works like a local
``killpg``, and a dropped connection or a dead jaxrun ends the remote job.

Every remote word is ``shlex.quote``d; the remote shell sees plain words only.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Mapping, Sequence, TextIO

from jaxrun import __version__, contract
from jaxrun import launch
from jaxrun.launch import LaunchError, RunConfig
from jaxrun.plan import Host, ProcessSpec

# A server's default MaxSessions is 10 per connection; the master's own session
# takes one.  Processes beyond this many on one host get a connection of their own.
SESSIONS_PER_MASTER = 9
# After SIGKILL has been written, how long the remote side gets to finish
# before the local ssh client is killed (which closes the channel anyway).
CLIENT_KILL_WAIT = 3.0
# Python start-up and metadata reads on top of the connect timeout.
PREFLIGHT_SLACK = 20.0
MASTER_CLOSE_WAIT = 3.0
# Marks the preflight answer: a login shell may print its own lines first.
ANSWER = b"jaxrun-preflight "

# Runs as the master's own session: report, then hold the connection until EOF.
PREFLIGHT = r"""
import json, os, platform, sys
info = {"python": platform.python_version(), "executable": sys.executable}
conn = os.environ.get("SSH_CONNECTION", "").split()
info["address"] = conn[2] if len(conn) == 4 else None
try:
    from importlib import metadata
    for name in ("jax", "jaxlib"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
except ImportError:
    info["jax"] = info["jaxlib"] = None
try:
    import jaxrun, jaxrun.remote
    info["jaxrun"] = jaxrun.__version__
    info["jaxrun_path"] = os.path.dirname(jaxrun.__file__)
except Exception as e:
    info["jaxrun"] = None
    info["jaxrun_error"] = "%s: %s" % (type(e).__name__, e)
if sys.argv[1]:
    try:
        os.chdir(sys.argv[1])
    except OSError as e:
        info["chdir_error"] = "cannot change to %r: %s" % (sys.argv[1], e.strerror)
print("jaxrun-preflight " + json.dumps(info), flush=True)
sys.stdin.buffer.read()
"""

# Prints a port that is free on the given address (0: any free port).
PORT_PROBE = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        sys.exit(e.strerror or str(e))
    print(s.getsockname()[1])
"""


@dataclasses.dataclass(frozen=True)
class SshSettings:
    python: str
    chdir: str
    config_file: str | None = None
    options: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # --env/-x, for preflight


# -- pure: command lines ------------------------------------------------------

def ssh_args(settings: SshSettings, host: Host, control: Sequence[str]) -> list[str]:
    """``ssh ... -- [user@]host``: ours first where it must win (ssh keeps the
    first value of an option), the user's next, overridable defaults last."""
    args = ["ssh"]
    if settings.config_file:
        args += ["-F", settings.config_file]
    args += ["-o", "BatchMode=yes", *control]
    for opt in settings.options:
        args += ["-o", opt]
    args += ["-o", f"ConnectTimeout={max(1, round(settings.connect_timeout))}", "-T"]
    if host.port:
        args += ["-p", str(host.port)]
    return args + ["--", host.ssh_target]


def master_control(path: str) -> list[str]:
    return ["-o", "ControlMaster=yes", "-o", f"ControlPath={path}", "-o", "ControlPersist=no"]


def session_control(path: str | None) -> list[str]:
    # LogLevel=ERROR keeps ssh's own warnings out of the process's stderr log.
    return ["-o", "ControlMaster=no", "-o", f"ControlPath={path or 'none'}", "-o", "LogLevel=ERROR"]


def env_words(env: Mapping[str, str]) -> list[str]:
    return ["env"] + [f"{k}={v}" for k, v in sorted(env.items())] if env else []


def remote_command(words: Sequence[str]) -> str:
    """The one string ssh hands to the remote shell: every word quoted."""
    return " ".join(shlex.quote(w) for w in words)


def process_words(spec: ProcessSpec, chdir: str, python: str, extra_env: Mapping[str, str]) -> list[str]:
    env = dict(spec.env)
    env.update(extra_env)
    env.pop(contract.LIFELINE_FD, None)  # jaxrun.remote makes its own
    return env_words(env) + [python, "-m", "jaxrun.remote", "--chdir", chdir, "--", *spec.argv]


def preflight_words(settings: SshSettings) -> list[str]:
    return env_words(settings.env) + [settings.python, "-c", PREFLIGHT, settings.chdir]


def port_probe_words(python: str, address: str, port: int) -> list[str]:
    return [python, "-c", PORT_PROBE, address, str(port)]


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def remote_status(code: int) -> int:
    """ssh's exit status back to Popen style: jaxrun.remote reports a death by
    signal N as 128+N; 255 is ssh's own failure and stays as it is."""
    if 128 < code < 128 + signal.NSIG:
        return -(code - 128)
    return code


def check_preflight(results: Mapping[str, dict], python: str) -> list[str]:
    """Problems found in the preflight answers, one line each, host first."""
    problems = []
    for name, info in results.items():
        if info.get("jaxrun") is None:
            problems.append(f"{name}: cannot import jaxrun with {python} ({info.get('jaxrun_error')})")
        elif info["jaxrun"] != __version__:
            problems.append(f"{name}: jaxrun {info['jaxrun']} there, {__version__} here")
        if info.get("jax") is None:
            problems.append(f"{name}: jax is not installed for {python}")
        if info.get("chdir_error"):
            problems.append(f"{name}: {info['chdir_error']}")
    for key, shown in (("python", "python"), ("jax", "jax"), ("jaxlib", "jaxlib")):
        values = {name: _version_key(key, info.get(key)) for name, info in results.items()}
        if len(set(values.values())) > 1:
            listed = ", ".join(f"{name} has {results[name].get(key)}" for name in values)
            problems.append(f"hosts disagree on the {shown} version: {listed}")
    return problems


def _version_key(key: str, value: str | None) -> str | None:
    # Patch releases of python may differ; jax and jaxlib must match exactly.
    if key == "python" and value:
        return ".".join(value.split(".")[:2])
    return value


def preflight_table(results: Mapping[str, dict]) -> list[str]:
    rows = [("host", "address", "python", "jax", "jaxlib", "jaxrun")]
    for name, info in results.items():
        rows.append((name, *(str(info.get(k) or "-") for k in ("address", "python", "jax", "jaxlib", "jaxrun"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["jaxrun: " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except (TypeError, ValueError):
        return False


# -- impure: connections, processes -------------------------------------------

def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def read_answer(stdout, answers: dict[str, bytes], name: str) -> None:
    """The preflight line, or b"" if the session ended without one."""
    for line in iter(stdout.readline, b""):
        if line.startswith(ANSWER):
            answers[name] = line
            return
    answers[name] = b""


class Connections:
    """One ControlMaster per host, in a private folder removed at the end."""

    def __init__(self, settings: SshSettings, hosts: Sequence[Host]):
        self.settings = settings
        self.hosts = list(hosts)
        self.dir = tempfile.mkdtemp(prefix="jaxrun-ssh-")  # mode 0700: sockets stay private
        self.masters: dict[str, subprocess.Popen] = {}
        self.results: dict[str, dict] = {}
        self.sessions: dict[str, list[subprocess.Popen]] = {}

    def __enter__(self) -> "Connections":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def control_path(self, host: Host) -> str:
        return os.path.join(self.dir, f"m{self.hosts.index(host)}")

    def session_args(self, host: Host, *, direct: bool = False) -> list[str]:
        path = self.control_path(host) if host.name in self.masters and not direct else None
        return ssh_args(self.settings, host, session_control(path))

    def start_session(self, host: Host, command: str) -> subprocess.Popen:
        """A process's own ssh session, over the host's master while it has
        sessions to spare (counting only those still running, for restarts)."""
        live = [p for p in self.sessions.get(host.name, []) if p.poll() is None]
        popen = subprocess.Popen(
            self.session_args(host, direct=len(live) >= SESSIONS_PER_MASTER) + [command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C in the terminal is jaxrun's to handle
            bufsize=0,
        )
        self.sessions[host.name] = live + [popen]
        return popen

    # -- preflight ---------------------------------------------------------
    def preflight(self) -> dict[str, dict]:
        """Open every master at once and read each one's report, within one
        deadline.  Raises LaunchError naming each host that failed."""
        command = remote_command(preflight_words(self.settings))
        answers: dict[str, bytes] = {}
        readers = []
        for host in self.hosts:
            master = self.masters[host.name] = self._start_master(host, command)
            reader = threading.Thread(target=read_answer, args=(master.stdout, answers, host.name), daemon=True)
            reader.start()
            readers.append(reader)
        deadline = time.monotonic() + self.settings.connect_timeout + PREFLIGHT_SLACK
        for reader in readers:
            reader.join(max(0.0, deadline - time.monotonic()))
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
            return subprocess.Popen(
                ssh_args(self.settings, host, master_control(self.control_path(host))) + [command],
                stdin=subprocess.PIPE,  # held until close(): EOF ends the master
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )

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
            self._probe_port(first, address, int(port), f"--coordinator {fixed}")
            return fixed, fixed
        address = self.results[first.name].get("address")
        if not address:
            raise LaunchError(f"{first.name}: SSH_CONNECTION is not set there; pass --coordinator HOST:PORT")
        remote_peers = [h.name for h in self.hosts[1:] if not is_loopback(self.results[h.name].get("address"))]
        if is_loopback(address) and remote_peers:
            raise LaunchError(
                f"{first.name} was reached over loopback ({address}), which {remote_peers[0]} cannot "
                "connect to; list a routable host first or pass --coordinator HOST:PORT"
            )
        port = self._probe_port(first, address, 0, f"{first.name}")
        where = join_address(address, port)
        return where, where

    def _probe_port(self, host: Host, address: str, port: int, what: str) -> int:
        command = remote_command(port_probe_words(self.settings.python, address, port))
        try:
            done = subprocess.run(
                self.session_args(host) + [command],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.settings.connect_timeout + PREFLIGHT_SLACK,
            )
        except subprocess.TimeoutExpired:
            raise LaunchError(f"{what}: no answer from {host.name} while looking for a free port") from None
        if done.returncode != 0 or not done.stdout.strip().isdigit():
            reason = last_line(done.stderr.decode(errors="replace")) or f"status {done.returncode}"
            raise LaunchError(f"{what}: cannot listen on {address}:{port} on {host.name} ({reason})")
        return int(done.stdout)

    # -- the end -------------------------------------------------------------
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


class SshChild:
    """A remote controller, seen through its local ssh client."""

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
                stdin.write(f"{signal.Signals(signum).name}\n".encode())
                if signum == signal.SIGKILL:
                    stdin.close()  # EOF: jaxrun.remote kills the group
            except OSError:
                stdin.close()
                return
        if signum == signal.SIGKILL:
            timer = threading.Timer(CLIENT_KILL_WAIT, self._kill_client)
            timer.daemon = True
            timer.start()

    def _kill_client(self) -> None:
        # The channel did not close in time (a hung connection): closing the
        # client ends the session, and sshd then closes jaxrun.remote's stdin.
        if self.popen.poll() is None:
            self.popen.kill()

    def wait(self) -> int:
        return remote_status(self.popen.wait())


class SshSpawner:
    def __init__(self, settings: SshSettings, connections: Connections):
        self.settings = settings
        self.connections = connections

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str]) -> SshChild:
        del lifeline_fd  # the remote side's lifeline is the ssh channel itself
        words = process_words(spec, self.settings.chdir, self.settings.python, extra_env)
        popen = self.connections.start_session(spec.host, remote_command(words))
        return SshChild(popen)


def run_over_ssh(config: RunConfig, settings: SshSettings, console: TextIO | None = None) -> int:
    """Preflight every host, then run the job there; exit status as launch.run."""
    console = console or sys.stderr
    hosts = config.options.hosts
    if config.dry_run:  # show the plan without contacting any host
        first = hosts[0].name
        return launch.run(config, choose_coordinator=lambda fixed: (fixed or f"{first}:PORT", None))
    with Connections(settings, hosts) as connections:
        results = connections.preflight()
        if config.verbose:
            for line in preflight_table(results):
                print(line, file=console, flush=True)
        return launch.run(config, SshSpawner(settings, connections), connections.choose_coordinator, console)
