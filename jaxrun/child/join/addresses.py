"""Child side: the addresses a joining process uses.

Where it listens for every listener JAX opens (collectives, transfers): one
address, never a wildcard; and whether process 0's coordination service
answers yet.  :mod:`jaxrun.child.join.bootstrap` calls these when the process
joins, never at start-up (only then is ``socket`` needed at all).
"""

from __future__ import annotations

import time

from jaxrun import contract, portable


def reachable_address(coordinator: str) -> str:
    """This process's one address for every listener JAX opens (collectives,
    transfers): loopback when the job is on this machine only, else the local
    address that routes towards the coordinator's host.  Never a wildcard,
    and never what the hostname resolves to, which is often 127.0.1.1."""
    host = contract.address_host(coordinator)
    if contract.is_loopback(host):
        return "127.0.0.1"
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))  # no packet is sent: this only picks the route
        return probe.getsockname()[0]
    finally:
        probe.close()


# How long a process looks for process 0's coordination service before it
# leaves the waiting to initialize() itself, as a plain launch does.
COORDINATOR_WAIT = 60.0


def wait_for_coordinator(coordinator: str, within: float = COORDINATOR_WAIT) -> bool:
    """Until the coordinator answers: True; False once ``within`` seconds
    have passed, or at once where its host does not answer (a firewall, no
    route), which initialize() then reports as it would.

    A process whose first connection finds nobody listening yet waits out
    gRPC's reconnect backoff, about a second, before its second; initialize()
    returns in every process together, so the whole job waits with it.
    Looking first costs one connection when the service is up.  An accept
    is no answer: a forward (sshd's, on an SSH host) accepts before anyone
    listens behind it; the service's own first bytes are (``_connect``)."""
    end = time.monotonic() + within
    pause = 0.002
    while True:
        try:
            _connect(coordinator)
            return True
        except (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, BrokenPipeError, TimeoutError):
            pass  # the host (or the socket's folder, or a forward) is there; the service is not, yet
        except OSError:
            return False
        if time.monotonic() + pause > end:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.02)


# A client's first bytes in HTTP/2 (gRPC's transport): the preface and an empty
# SETTINGS frame.  A service answers with its own SETTINGS frame.
HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _connect(coordinator: str) -> None:
    """One connection to the coordinator's address (a Unix socket's,
    ``unix:PATH``, or HOST:PORT's), its hello said and the service's first
    bytes read, then closed; a hang-up before them is no answer."""
    import socket

    path = contract.unix_socket_path(coordinator)
    if path is not None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            s.close()
            raise
    else:
        host, port = coordinator.rsplit(":", 1)
        s = socket.create_connection((host.strip("[]"), int(port)), timeout=1.0)
    with s:
        s.sendall(HTTP2_HELLO)
        if not s.recv(9):
            raise ConnectionRefusedError("accepted, then closed: nobody behind it yet")


def alone() -> None:
    """A job of one process connects to no other: no transfer address, no
    bulk transport (its caller sets neither), and no CPU collectives, which
    JAX builds with gloo for every joined process: a TCP listener, and an
    address it must find for the host, refused where the machine refuses
    internet sockets (the TPU host of issue 71).  JAX's CPU client is built
    as with ``jax_cpu_collectives_implementation`` None, as a bare python's
    is, while the script still reads the implementation it chose."""
    _collectives_hook(None)


def transfer_address(ip: str) -> str:
    """A free address of our own for cross-process device_put, reachable by peers."""
    return contract.join_address(ip, portable.free_port(ip))


# The bulk transport's default is four listeners on 0.0.0.0:0.
TRANSPORT_LISTENERS = 4


def advertise_for_collectives(ip: str) -> None:
    """Gloo, jax's CPU collectives, is created without a hostname, so it
    listens on and advertises what the hostname resolves to: loopback on
    many machines, where peers on other hosts get "connection refused".  The
    narrowest hook: only the module jax creates its default CPU client in
    sees a ``make_gloo_tcp_collectives`` that fills in ``hostname``, and only
    when the caller gave none."""
    _collectives_hook(ip)


def _collectives_hook(ip: str | None) -> None:
    """``ip``: the hostname gloo gets; None: no gloo at all (``alone``)."""
    from jax._src import xla_bridge

    real_module = xla_bridge._jax
    real = getattr(real_module, "make_gloo_tcp_collectives", None)
    if real is None or isinstance(real_module, _GlooHostname):
        return
    xla_bridge._jax = _GlooHostname(real_module, real, ip)


class _GlooHostname:
    """``xla_bridge``'s view of jaxlib's ``_jax`` module, but for one function."""

    def __init__(self, module, real, hostname: str | None):
        self._module, self._real, self._hostname = module, real, hostname

    def make_gloo_tcp_collectives(self, distributed_client, hostname=None, interface=None):
        if self._hostname is None:
            return None  # one process: make_cpu_client takes None for no collectives
        if hostname is None and interface is None:
            hostname = self._hostname
        return self._real(distributed_client=distributed_client, hostname=hostname, interface=interface)

    def __getattr__(self, name):
        return getattr(self._module, name)
