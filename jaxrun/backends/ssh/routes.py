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
import socket
import subprocess
import threading
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


# What a gRPC server answers: HTTP/2's client preface and an empty SETTINGS
# frame, to which the server says its own SETTINGS.
HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
ANSWER_WAIT = 2.0  # for one look's answer, once the connection is through
LOOK_EVERY = 0.01  # between two looks, while process 0 is not listening yet


def service_answers(path: str) -> bool:
    """Whether the gRPC service behind the forward at ``path`` answers: its
    first bytes, not only a connection, which the ssh client accepts before
    process 0 listens (and hangs up once the far end finds nobody)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(ANSWER_WAIT)
        try:
            conn.connect(path)
            conn.sendall(HTTP2_HELLO)
            return bool(conn.recv(9))
        except OSError:
            return False


class CoordinatorRoutes:
    """One attempt's forwards: ``open`` adds them, ``close`` takes them away.

    The other hosts' sockets appear only once process 0's service answers
    through the first host's forward.  Before that, a process there finds no
    socket and looks again a few milliseconds later; had its host's sshd
    accepted for a service not yet listening, its connection would have
    ended at once, and gRPC would wait out its reconnect backoff (about a
    second, which the whole job then waits with).  Whether each sshd
    forwards at all is found at ``open``, on a socket of another name."""

    def __init__(self, connections) -> None:
        self.connections = connections
        self.addresses: dict[str, str] = {}  # host name -> the unix: address its processes connect to
        self.added: list[tuple[Host, str, str]] = []  # (host, -L or -R, the forward)
        self.lock = threading.Lock()
        self.ended = threading.Event()
        self.linker: threading.Thread | None = None

    def open(self, route: str, token: str | None = None) -> str | None:
        """Add every forward; None once all are in place, else why not (and
        none is left in place).  ``route``: the first host's network address."""
        token = token or secrets.token_hex(4)
        trial = secrets.token_hex(4)
        connections = self.connections
        hosts = list({h.name: h for h in connections.hosts}.values())  # a host listed twice: one socket
        paths, trials = ({h.name: host_socket(connections.results[h.name].get(Key.CHANNELS), t, route) for h in hosts}
                         for t in (token, trial))
        missing = [name for name, path in paths.items() if path is None]
        if missing:
            return f"{missing[0]} has no private folder of jaxrun's (its host agent did not start)"
        first = hosts[0]
        relay = f"{connections.dir}/k{token}"  # the launcher's end, in its private 0700 folder
        wanted = [(first, "-L", f"{relay}:{paths[first.name]}")]
        wanted += [(h, "-R", f"{trials[h.name]}:{relay}") for h in hosts[1:]]  # does its sshd forward?
        failed = self._forward(wanted)
        if failed:
            self.close()
            return failed
        self.addresses = {name: contract.unix_address(path) for name, path in paths.items()}
        later = [(h, "-R", f"{paths[h.name]}:{relay}") for h in hosts[1:]]
        if later:
            self.linker = threading.Thread(target=self._link, args=(relay, later), name="ssh-coordinator-routes",
                                           daemon=True)
            self.linker.start()
        return None

    def _link(self, relay: str, later: list[tuple[Host, str, str]]) -> None:
        """The other hosts' sockets, once the service answers."""
        while not self.ended.is_set():
            if service_answers(relay):
                if not self.ended.is_set():
                    self._forward(later)
                return
            self.ended.wait(LOOK_EVERY)

    def _forward(self, wanted: list[tuple[Host, str, str]]) -> str | None:
        """Add ``wanted`` on the masters at once; why one failed, or None."""
        connections = self.connections
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
                with self.lock:
                    self.added.append((host, flag, spec))
            elif failed is None:
                failed = f"{host.name}'s sshd refused to forward a Unix socket ({said[-1] if said else f'exit {code}'})"
        return failed

    def close(self) -> None:
        """Take the forwards off the masters (best effort: a master that has
        ended took its own with it); the socket files go with the agents' folders."""
        self.ended.set()
        if self.linker is not None:
            self.linker.join(self.connections.settings.connect_timeout + ANSWER_WAIT)
        with self.lock:
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
