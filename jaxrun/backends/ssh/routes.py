"""The coordination service over jaxrun's own SSH connections, never a network port.

Process 0 binds a Unix socket in its host agent's private folder on the
first host (``tempfile.mkdtemp``: 0700, removed when the agent ends).  The
launcher adds forwards to the masters it already holds (``ssh -O forward``,
OpenSSH's Unix-socket forwarding): ``-L`` from a socket in its own private
folder to that socket on the first host, and ``-R`` from a socket in each
other host's agent folder back to the launcher's.  A process on another host
connects to its own host's socket; the connection travels over that host's
authenticated connection to the launcher and over the first host's to
process 0.  No port of any host is opened for it; on each host only the
user (and root) can enter the folder.

The collectives (Gloo, NCCL) still connect directly between the hosts: the
socket's name carries the first host's network address
(``contract.route_socket_name``), and every process advertises its own
address on the route towards it (:func:`jaxrun.child.join.addresses.reachable_address`).
"""

from __future__ import annotations

import posixpath
import secrets
import subprocess
import time

from jaxrun import contract, portable
from jaxrun.backends.shield import shielded
from jaxrun.backends.ssh.commands import mux_args
from jaxrun.core.spec import Host
from jaxrun.wire.preflight import PreflightKey as Key

COORDINATOR_SOCKET = "coordinator-{token}"  # in each host agent's private folder, with the route
CANCEL_WAIT = 3.0  # for the masters to drop an ended attempt's forwards


def host_socket(channels: str | None, token: str, route: str) -> str | None:
    """The coordinator's socket in the private folder of the host agent that
    listens at ``channels``, its name carrying ``route`` (None: no agent
    there, or a path too long)."""
    if not channels:
        return None
    name = contract.route_socket_name(COORDINATOR_SOCKET.format(token=token), route)
    path = posixpath.join(posixpath.dirname(channels), name)
    return path if len(path) <= portable.sockets.LONGEST_SOCKET_PATH else None


class CoordinatorRoutes:
    """One attempt's forwards: ``open`` adds them, ``close`` takes them away."""

    def __init__(self, connections) -> None:
        self.connections = connections
        self.addresses: dict[str, str] = {}  # host name -> the unix: address its processes connect to
        self.added: list[tuple[Host, str, str]] = []  # (host, -L or -R, the forward)

    def open(self, route: str, token: str | None = None) -> str | None:
        """Add every forward; None once all are in place, else why not (and
        none is left in place).  ``route``: the first host's network address."""
        token = token or secrets.token_hex(4)
        connections = self.connections
        hosts = list({h.name: h for h in connections.hosts}.values())  # a host listed twice: one socket
        paths = {h.name: host_socket(connections.results[h.name].get(Key.CHANNELS), token, route) for h in hosts}
        missing = [name for name, path in paths.items() if path is None]
        if missing:
            return f"{missing[0]} has no private folder of jaxrun's (its host agent did not start)"
        first = hosts[0]
        relay = f"{connections.dir}/k{token}"  # the launcher's end, in its private 0700 folder
        wanted = [(first, "-L", f"{relay}:{paths[first.name]}")]
        wanted += [(h, "-R", f"{paths[h.name]}:{relay}") for h in hosts[1:]]
        failed = None
        popens = []
        for host, flag, spec in wanted:
            with shielded():
                popens.append((host, flag, spec, subprocess.Popen(
                    mux_args(connections.settings, host, connections.control_path(host), "forward", flag, spec),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        end = time.monotonic() + connections.settings.connect_timeout
        for host, flag, spec, popen in popens:
            try:
                code = popen.wait(max(0.0, end - time.monotonic()))
                said = popen.stderr.read().decode(errors="replace").strip().splitlines()
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
                code, said = None, ["no answer"]
            popen.stderr.close()
            if code == 0:
                self.added.append((host, flag, spec))
            elif failed is None:
                failed = f"{host.name}'s sshd refused to forward a Unix socket ({said[-1] if said else f'exit {code}'})"
        if failed:
            self.close()
            return failed
        self.addresses = {name: contract.unix_address(path) for name, path in paths.items()}
        return None

    def close(self) -> None:
        """Take the forwards off the masters (best effort: a master that has
        ended took its own with it); the socket files go with the agents' folders."""
        added, self.added, self.addresses = self.added, [], {}
        popens = []
        for host, flag, spec in added:
            if host.name not in self.connections.masters:
                continue
            with shielded():
                popens.append(subprocess.Popen(
                    mux_args(self.connections.settings, host, self.connections.control_path(host), "cancel",
                             flag, spec),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        end = time.monotonic() + CANCEL_WAIT
        for popen in popens:
            try:
                popen.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
