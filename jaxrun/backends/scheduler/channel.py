"""The scheduler task channel's listening end, where the task agents connect back.

The task agents (:mod:`jaxrun.backends.scheduler.task_agent`) open three TCP
connections each to one listener here, every one opened by a ``tasks.TaskHello``
that carries the per-run secret, the task's rank and the connection's kind
(``tasks.CONTROL``, ``tasks.STDOUT``, ``tasks.STDERR``), and answered by a
``tasks.Ack``.  Once a connection has shown the secret, the listener hands it
to its rank (:mod:`jaxrun.backends.scheduler.child`) and forgets it.

The listener faces the network, so ``TaskListener`` trusts nothing that has
not shown the secret:

- it binds the one address the tasks are told (``channel_address``), never
  a wildcard;
- one thread (``task-channel``) reads every header, without blocking,
  against one deadline for the whole line: a client that sends a byte a
  second holds nothing;
- at most ``MAX_UNAUTHENTICATED`` connections wait for their header at a
  time; more are closed at once.  A task whose connection was closed gets no
  ``Ack`` and connects again (see the agent), so a flood delays it, no more;
- running out of file descriptors (EMFILE, ENFILE) closes the stranger that
  has waited longest, or pauses accepting for a moment when there is none;
  it never ends the listener;
- once every rank has attached its three connections, it stops listening.

Only connections that showed the secret get a thread: the three per rank.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping

from jaxrun import contract, portable
from jaxrun.core.backend import RunHooks, start_thread
from jaxrun.wire import encoding, tasks

# One deadline for a connection's whole TaskHello line, from its accept.
HEADER_TIMEOUT = 10.0
MAX_HEADER = 512  # a TaskHello is about 80 bytes
MAX_UNAUTHENTICATED = 64
ACCEPT_BATCH = 256  # accepts per wake-up, so a flood cannot starve the headers already in
ACCEPT_PAUSE = 0.1  # after EMFILE/ENFILE: no accepts for this long, then try again
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class TaskListener:
    """The channel's one listening socket, and the one thread (``task-channel``)
    that accepts and reads headers; see the module docstring.

    ``attach(hello, sock)`` is called for each connection that showed the
    secret and that ``wanted(hello)`` accepted, after its ``Ack`` went out.
    The listener closes once ``expected`` connections were attached, or at
    ``close()``.
    """

    def __init__(self, host: str, secret: str, expected: int, wanted: Callable[[tasks.TaskHello], bool],
                 attach: Callable[[tasks.TaskHello, socket.socket], None], hooks: RunHooks, port: int = 0):
        self.secret = secret.encode()
        self.expected = expected
        self.wanted = wanted
        self.attach = attach
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # The backlog absorbs a burst (every task at once, or a flood) while
        # this thread drains it; the kernel caps it at somaxconn.
        self.sock = socket.create_server((host, port), family=family, backlog=max(1024, 3 * expected))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._waiting: dict[socket.socket, tuple[float, bytearray]] = {}  # deadline, bytes so far
        self.thread = start_thread("task-channel", self._serve, hooks=hooks)

    def stop(self) -> None:
        """Stop listening soon; never blocks.  The thread closes what it holds."""
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self) -> None:
        """Stop listening, and wait (briefly) until the thread has."""
        self.stop()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=1.0)
        if not self.thread.is_alive():  # ended, or died early: nobody else closes these
            self.sock.close()
            self._wake_r.close()
            self._wake_w.close()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        selector.register(self.sock, selectors.EVENT_READ)
        resume_at: float | None = None  # accepting paused until then (out of descriptors)
        try:
            while not self._closing and self.expected > 0:
                now = time.monotonic()
                if resume_at is not None and now >= resume_at:
                    selector.register(self.sock, selectors.EVENT_READ)
                    resume_at = None
                wake = [deadline for deadline, _ in self._waiting.values()]
                if resume_at is not None:
                    wake.append(resume_at)
                for key, _ in selector.select(max(0.0, min(wake) - now) if wake else None):
                    if key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    elif key.fileobj is self.sock:
                        if not self._accept_some(selector):
                            selector.unregister(self.sock)
                            resume_at = time.monotonic() + ACCEPT_PAUSE
                    elif key.fileobj in self._waiting:
                        self._read_header(key.fileobj, selector)
                now = time.monotonic()
                for sock in [s for s, (deadline, _) in self._waiting.items() if deadline <= now]:
                    self._drop(sock, selector)
        finally:
            # Every rank attached, or the step is closing: nobody else may come in.
            for sock in list(self._waiting):
                self._drop(sock, selector)
            selector.close()
            self.sock.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept_some(self, selector: selectors.BaseSelector) -> bool:
        """Accept what the backlog holds; False when out of file descriptors."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.sock.accept()
            except BlockingIOError:
                return True
            except OSError as e:
                if e.errno not in OUT_OF_RESOURCES:
                    continue  # that one connection failed (ECONNABORTED and the like)
                if not self._waiting:
                    return False
                # Out of descriptors: the stranger that has waited longest
                # makes room.  A task's TaskHello comes with its connection, so
                # it passes at accept time and never waits to be evicted.
                self._drop(next(iter(self._waiting)), selector)
                continue
            sock.setblocking(False)
            self._waiting[sock] = (time.monotonic() + HEADER_TIMEOUT, bytearray())
            # A task sends its TaskHello with the connection: it is usually here
            # already, and then the connection never counts against the cap.
            if self._read_header(sock, None) and len(self._waiting) > MAX_UNAUTHENTICATED:
                self._drop(sock, None)
            elif sock in self._waiting:
                selector.register(sock, selectors.EVENT_READ)
        return True

    def _read_header(self, sock: socket.socket, selector: selectors.BaseSelector | None) -> bool:
        """Read what has arrived; True while the header is still incomplete."""
        _, data = self._waiting[sock]
        try:
            chunk = sock.recv(MAX_HEADER - len(data))
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            chunk = b""
        data += chunk
        if chunk and b"\n" not in data and len(data) < MAX_HEADER:
            return True
        line, newline, rest = bytes(data).partition(b"\n")
        hello = self._authenticate(line) if newline and not rest else None  # a task sends nothing before its Ack
        if hello is None:
            self._drop(sock, selector)
            return False
        self._forget(sock, selector)
        try:
            sent = sock.send(tasks.Ack().line())
        except OSError:
            sent = 0
        if sent != len(tasks.Ack().line()):
            sock.close()
            return False
        sock.setblocking(True)
        self.expected -= 1
        self.attach(hello, sock)
        return False

    def _authenticate(self, line: bytes) -> tasks.TaskHello | None:
        try:
            hello = encoding.decode(line)
        except (ValueError, RecursionError):  # WireError is a ValueError
            return None
        if not isinstance(hello, tasks.TaskHello) or not isinstance(hello.secret, str):
            return None
        # Bytes, compared in constant time; any text (non-ASCII, lone
        # surrogates from a JSON escape) encodes under surrogatepass.
        if not secrets.compare_digest(hello.secret.encode("utf-8", "surrogatepass"), self.secret):
            return None
        if type(hello.rank) is not int or hello.kind not in tasks.TaskHello.STREAM_KINDS:
            return None
        return hello if self.wanted(hello) else None

    def _forget(self, sock: socket.socket, selector: selectors.BaseSelector | None) -> None:
        del self._waiting[sock]
        if selector is not None:
            try:
                selector.unregister(sock)
            except (KeyError, ValueError):
                pass  # accepted in this round and not registered yet

    def _drop(self, sock: socket.socket, selector: selectors.BaseSelector | None) -> None:
        self._forget(sock, selector)
        sock.close()


def channel_address(environ: Mapping[str, str] = os.environ, hostname: str | None = None,
                    routed: Callable[[], str | None] | None = None) -> str:
    """The one address the channel binds and tells the tasks.

    ``contract.TASK_CHANNEL_HOST`` if set, else this host's name, resolved
    here: tasks connect to exactly the address we listen on (binding a
    wildcard would expose the channel on every interface).  Many Debian
    hosts map their own name to 127.0.1.1, which no other node can reach:
    a name that resolves to a loopback address, or to nothing, gives the
    address this host sends from on its way out (``routed``, by default
    ``route_source``), and loopback only where it has none.
    """
    given = environ.get(contract.TASK_CHANNEL_HOST)
    found = _resolve(given or hostname or socket.gethostname())
    if given or (found and not ipaddress.ip_address(found.split("%")[0]).is_loopback):
        return found or "127.0.0.1"
    source = (routed or route_source)()
    if source and not ipaddress.ip_address(source.split("%")[0]).is_loopback:
        return source
    return found or "127.0.0.1"


def _resolve(name: str) -> str | None:
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    # IPv4 first: what tasks on most clusters resolve and route.
    found.sort(key=lambda info: info[0] != socket.AF_INET)
    return found[0][4][0] if found else None


def route_source() -> str | None:
    """The address this host's outgoing IPv4 traffic leaves from; None
    without a route."""
    return portable.sockets.route_source("192.0.2.1")  # TEST-NET-1 (RFC 5737): routed like any address
