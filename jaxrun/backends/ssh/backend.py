"""Running controllers on other hosts with the system's OpenSSH client.

One connection per host, opened before anything starts: a ControlMaster whose
own session is the preflight check and then the host agent
(:mod:`jaxrun.backends.ssh.connections`).  The host agent runs every process
of its host, each over three channels of that connection, so a process costs
no session, no remote shell and no interpreter of its own
(``children.ChannelChild``).  Where the server refuses to forward, each
process gets a session on the master instead, running its own session agent
(``children.SessionChild``).  Either way ``send`` works like a local
``killpg``, and a dropped connection or a dead jaxrun ends the remote job.

What the agents report comes back in-band on each controller's stderr, and
the child takes it out (:mod:`jaxrun.backends.ssh.stream`).

Every remote word is ``shlex.quote``d (see :mod:`jaxrun.backends.ssh.commands`);
the remote shell sees plain words only.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tarfile
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TextIO

from jaxrun import contract
from jaxrun.backends.ssh.children import ChannelChild, SessionChild
from jaxrun.backends.ssh.commands import (
    preflight_table,
    process_env,
    process_words,
    remote_command,
    server_words,
    traces_words,
)
from jaxrun.backends.ssh.connections import MASTER_CLOSE_WAIT, Connections
from jaxrun.backends.ssh.options import SshOptions
from jaxrun.backends.ssh.routes import CoordinatorRoutes
from jaxrun.contract import devices
from jaxrun.core.backend import Ask, Backend, News, Placement
from jaxrun.core.spec import Host, ProcessSpec
from jaxrun.wire import ssh


def visible_gpus(listed_gpus: Mapping[str, int], env: Mapping[str, str]) -> dict[str, int]:
    """Each host's GPUs as its processes will see them: what nvidia-smi -L
    listed there, or fewer where -x gives CUDA_VISIBLE_DEVICES (nvidia-smi
    ignores it; JAX does not)."""
    visible = devices.listed(env.get("CUDA_VISIBLE_DEVICES"))
    if visible is None:
        return dict(listed_gpus)
    return {name: min(count, len(visible)) for name, count in listed_gpus.items() if visible}


def routed(spec: ProcessSpec, env: Mapping[str, str], address: str, own: str) -> tuple[ProcessSpec, dict[str, str]]:
    """``spec`` and its environment with the coordinator's ``address`` (the
    first host's socket) replaced by ``own``, its own host's forwarded socket,
    wherever it appears (the variables, the {coordinator} placeholder's word)."""
    env = {key: value.replace(address, own) for key, value in env.items()}
    return dataclasses.replace(spec, shim_args=tuple(word.replace(address, own) for word in spec.shim_args)), env


class SshBackend(Backend):
    """Controllers on the hosts of a hosts file, over the system's ssh client."""

    name = "ssh"
    starts_one_again = True  # the host's agent starts it, as it started the first

    def __init__(self, settings: SshOptions, hosts: Sequence[Host], console: TextIO, verbose: bool = False,
                 preload: bool = False, preload_modules: Sequence[str] = ()):
        self.settings = settings
        self.hosts = list(hosts)
        self.listed = list(hosts)  # what the user gave; self.hosts is what the last placement kept
        self.console = console
        self.verbose = verbose
        self.preload = preload
        self.preload_modules = tuple(preload_modules)
        self.connections: Connections | None = None
        self.servers: dict[str, tuple[str, subprocess.Popen]] = {}  # host name -> (socket name, session)
        self.serving: set[str] = set()  # hosts whose server this attempt uses
        self.channels: dict[str, str] = {}  # host name -> local socket forwarded to its agent
        self.routes: CoordinatorRoutes | None = None  # this attempt's coordinator forwards, if any
        self.said_open = False  # the warning that the service is on a network port, said once

    def open(self) -> None:
        self._open(tolerate=False)

    def pool(self) -> list[Host]:
        return list(self.listed)

    def place(self, ask: Ask) -> Placement:
        """The hosts it was asked for, each host's GPUs and which names are
        one machine.  An elastic restart (``ask.recheck``) starts over: every
        connection and server ends, the hosts asked for are connected and
        checked again, and those that fail are left out."""
        if not ask.recheck:
            return Placement(ask.hosts, ask.num_processes, facts=self._facts())
        self.close()
        self.hosts, self.servers, self.serving, self.channels = list(ask.hosts), {}, set(), {}
        self._open(tolerate=True)
        placement = Placement.chosen(ask, dict(self.connections.left_out), self._facts())
        return dataclasses.replace(placement, facts={**placement.facts, "hosts": placement.hosts})

    def _open(self, tolerate: bool) -> None:
        self.connections = Connections(self.settings, self.hosts, self.hooks)
        # Each host's preloading server starts with its preflight, so that its
        # import of jax overlaps the rest of the start; only a --preload-module
        # that --sync has yet to bring waits for the copy.
        early = self.preload and not (self.settings.sync and self.preload_modules)
        if early:
            for index, host in enumerate(self.hosts):
                self.servers.setdefault(host.name, (f"jaxrun-{os.getpid()}-{uuid.uuid4().hex}-{index}", None))
        results = self.connections.preflight(
            {name: (socket_name, *self.preload_modules) for name, (socket_name, _) in self.servers.items()},
            tolerate)
        self.hosts = list(self.connections.hosts)  # without those a tolerant preflight left out
        for name in self.connections.left_out:
            self.servers.pop(name, None)
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
            from jaxrun.backends.ssh import sync as ssh_sync

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
        """The first host's address and a port, checked as every host's route
        to it (the collectives need it); then, unless the user fixed the
        address, the service moves off the network onto a Unix socket that
        jaxrun's SSH connections forward to every host (ssh/routes.py).  A host
        whose sshd refuses that keeps the port, said once."""
        address, bind = self.connections.choose_coordinator(fixed)
        self._end_routes()
        if fixed:
            return address, bind
        routes = CoordinatorRoutes(self.connections)
        why = routes.open(contract.address_host(address))
        if why:
            if not self.said_open:
                self.said_open = True
                print(f"jaxrun: {why}: the coordination service listens on {address} instead, open to every "
                      "machine that reaches it (docs/security.md)", file=self.console, flush=True)
            return address, bind
        self.routes = routes
        first = routes.addresses[self.hosts[0].name]
        if self.verbose:
            others = [name for name in routes.addresses if name != self.hosts[0].name]
            print(f"jaxrun: coordination service: {first} on {self.hosts[0].name}"
                  + (f", forwarded to {', '.join(others)} over their SSH connections" if others else ""),
                  file=self.console, flush=True)
        return first, first

    def _end_routes(self) -> None:
        if self.routes is not None:
            self.routes.close()
            self.routes = None

    def end_attempt(self) -> None:
        self._end_routes()

    def _start_servers(self) -> None:
        """One preloading server per host, started as soon as the hosts are
        known good (and synced), so that its ``import jax`` overlaps the rest
        of the start.  It serves every attempt; a controller reads the JAX_*
        values of its own environment again after the fork (see
        ``child.join.preloaded.sync_preloaded_config``), so the server needs only
        what every process gets: the user's --env/-x."""
        env = dict(self.settings.env)
        env["PYTHONUNBUFFERED"] = "1"
        for host in self.hosts:
            if host.name in self.servers:
                continue  # one host listed twice
            socket_name = f"jaxrun-{os.getpid()}-{uuid.uuid4().hex}"
            words = server_words(self.settings.python_on(host), self.settings.chdir, self.preload_modules)
            session = self.connections.start_session(host, remote_command(words, self.settings.setup),
                                                     {**env, contract.FORKSERVER_NAME: socket_name},
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
        from jaxrun.backends.forkserver.client import differing_import_time_vars

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

    def _facts(self) -> dict:
        results = self.connections.results
        gpus = visible_gpus({name: info["gpus"] for name, info in results.items() if info.get("gpus")},
                            self.settings.env)
        machines = {name: info["machine"] for name, info in results.items() if info.get("machine")}
        return {"host_devices": gpus, "host_machines": machines}

    def dry_run_coordinator(self, fixed: str | None) -> tuple[str, str | None]:
        if fixed:
            return fixed, None  # no host is contacted
        # A socket in the first host's private jaxrun folder, forwarded to the others (ssh/routes.py).
        return contract.unix_address(f"/PRIVATE-FOLDER-ON-{self.hosts[0].name}/coordinator-HEX.sock"), None

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None, news: News) -> SessionChild | ChannelChild:
        del lifeline_fd  # the remote side's lifeline is the ssh channel itself
        server = self.servers[spec.host.name][0] if spec.host.name in self.serving else None
        env = process_env(spec, extra_env)
        if self.routes is not None:
            spec, env = routed(spec, env, self.routes.addresses[self.hosts[0].name],
                               self.routes.addresses[spec.host.name])
        error_file = extra_env.get(contract.ERROR_FILE)  # where the record that comes home is kept
        channel = self.channels.get(spec.host.name)
        if channel:
            master = self.connections.masters[spec.host.name]
            return ChannelChild(channel, ssh.Spawn(list(spec.argv), env, self.settings.chdir, server or ""),
                                master.pid, spec.host.name, news, error_file)
        words = process_words(spec, self.settings.chdir, self.settings.python_on(spec.host))
        if server:
            env = {**env, contract.FORKSERVER_NAME: server}  # on stdin: the session agent takes it out
        return SessionChild(self.connections.start_session(spec.host, remote_command(words, self.settings.setup),
                                                           env),
                            news, error_file)

    def bring_home(self, spec: ProcessSpec, here: str, wait: float) -> str | None:
        """The process's finished traces, from its host's trace folder into
        ``here``: one session on the host's master, whose far end
        (``ssh/traces_agent.py``) sends them as a tar stream and removes them."""
        for folder in (os.path.dirname(here), here):
            problem = contract.private_folder(folder)
            if problem:
                return f"{folder} is not private: {problem}"
        words = traces_words(spec, self.settings.python_on(spec.host), wait)
        # The user's variables, as the host's server gets them: PYTHONPATH may be what finds jaxrun there.
        session = self.connections.start_session(spec.host, remote_command(words, self.settings.setup),
                                                 dict(self.settings.env))
        session.stdin.close()
        try:
            with tarfile.open(fileobj=session.stdout, mode="r|") as tar:
                tar.extractall(here, filter="data")  # nothing outside ``here``, no device, no link out
        except tarfile.TarError as e:
            problem = f"its traces did not come from {spec.host.name}: {e}"
        finally:
            session.stdout.close()
        try:
            said = session.stderr.read(4096).decode(errors="replace").strip()
            code = session.wait(MASTER_CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            session.kill()
            code, said = session.wait(), "it did not end"
        finally:
            session.stderr.close()
        if code != 0:
            return f"its traces did not come from {spec.host.name}: {said or f'exit {code}'}"
        return problem

    def close(self) -> None:
        self._end_routes()
        self._stop_servers()
        if self.connections is not None:
            self.connections.close()

    def abort(self) -> None:
        if self.connections is not None:
            self.connections.abort()
