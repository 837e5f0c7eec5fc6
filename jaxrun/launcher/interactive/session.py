"""The launcher's end of an interactive session: a listener, then process 0.

It binds one address, never a wildcard: loopback for a job on this machine,
else the address of this machine that routes to the coordinator's host, where
process 0 runs (or, under a scheduler, this host's own name, as the task
channel does).  Process 0
connects and proves itself with the session's secret, which travels in its
environment only; a connection with a wrong secret is dropped.  Then each
statement goes out as an ``Execute`` and comes back as one ``Reply`` with
every process's result (``jaxrun.wire.console``).

Every wait here is short and asks the caller whether to go on, so that a
run that ended (a process died) or a Ctrl-C is heard at once.
"""

from __future__ import annotations

import os
import secrets
import select
import socket
import time
from collections.abc import Callable

from jaxrun import contract, portable
from jaxrun.core.spec import LaunchOptions
from jaxrun.wire import console, encoding

TICK = 0.25  # seconds between two looks at the caller's ``go_on``
HELLO_WAIT = 5.0  # a connection that sends no hello in this long is dropped
# Connections waiting for their hello, all read at once: idle ones (any user
# of the machine can open some) never hold up process 0's.  Past this many,
# the oldest is dropped.
PENDING = 256
MAX_HELLO = 4096


def listen_address(options: LaunchOptions, coordinator: str, environ=os.environ) -> str:
    """Where the session listens: under a scheduler, this host's name (as the
    task channel, since the tasks' nodes are known only once they run); else
    this machine's address on the route to the coordinator's host, which is
    where process 0 runs (loopback for a local run)."""
    if options.scheduled:
        name = environ.get(contract.TASK_CHANNEL_HOST) or socket.gethostname()
        try:
            found = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return "127.0.0.1"
        address = found[0][4][0] if found else "127.0.0.1"
        return "127.0.0.1" if address == "0.0.0.0" else address  # never a wildcard
    return route_to(contract.address_host(coordinator))


def route_to(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    if contract.is_loopback(host):
        return "127.0.0.1"
    return portable.sockets.route_source(host) or "127.0.0.1"


class Session:
    """One session: its secret at once, its listener once the run knows
    where process 0 is (``listen``, from the run's thread)."""

    def __init__(self):
        self.secret = secrets.token_hex(32)
        self.listener: socket.socket | None = None
        self.address: str | None = None
        self.link: socket.socket | None = None
        self.buffer = b""
        self.number = 0

    def listen(self, host: str) -> dict[str, str]:
        """Bind (once) on ``host``; what the processes need to find the
        session (process 0 uses it)."""
        if self.listener is None:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
            listener.bind((host, 0))
            listener.listen(PENDING)
            self.address = contract.join_address(host, listener.getsockname()[1])
            self.listener = listener
        return {contract.CONSOLE_ADDRESS: self.address, contract.CONSOLE_SECRET: self.secret}

    def accept(self, go_on: Callable[[], bool]) -> bool:
        """Wait for process 0; False when ``go_on`` says to stop waiting.
        Every connection's hello is read as it comes, each within its own
        HELLO_WAIT: one that never speaks holds up no other (issue 70)."""
        pending: dict[socket.socket, tuple[float, bytes]] = {}  # connection -> (deadline, bytes so far)
        try:
            while self.link is None:
                if not go_on():
                    return False
                if self.listener is None:  # the run has not placed its processes yet
                    time.sleep(TICK / 5)
                    continue
                now = time.monotonic()
                for conn in [c for c, (deadline, _) in pending.items() if deadline <= now]:
                    pending.pop(conn)
                    conn.close()
                ready, _, _ = select.select([self.listener, *pending], [], [], TICK)
                for conn in ready:
                    if conn is self.listener:
                        self._take(pending)
                    else:
                        self._hear(conn, pending)
        finally:
            for conn in pending:
                conn.close()
        self.listener.close()
        return True

    def _take(self, pending: dict) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        conn.setblocking(False)
        if len(pending) >= PENDING:
            oldest = min(pending, key=lambda c: pending[c][0])
            pending.pop(oldest)
            oldest.close()
        pending[conn] = (time.monotonic() + HELLO_WAIT, b"")

    def _hear(self, conn: socket.socket, pending: dict) -> None:
        """More of ``conn``'s hello; once whole, the link if it is process 0's."""
        deadline, line = pending[conn]
        try:
            chunk = conn.recv(MAX_HELLO - len(line))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        line += chunk
        if chunk and b"\n" not in line and len(line) < MAX_HELLO:
            pending[conn] = (deadline, line)
            return
        pending.pop(conn)
        hello, newline, rest = line.partition(b"\n")
        if newline and self._authentic(hello):
            conn.setblocking(True)
            self.link, self.buffer = conn, rest
        else:
            conn.close()

    def _authentic(self, line: bytes) -> bool:
        try:
            hello = encoding.decode(line)
        except encoding.WireError:
            return False
        if not isinstance(hello, console.SessionHello) or not isinstance(hello.secret, str):
            return False
        given = hello.secret.encode("utf-8", "surrogatepass")
        return secrets.compare_digest(given, self.secret.encode())

    def run(self, code: str, mode: str, go_on: Callable[[], bool]) -> console.Reply | None:
        """Send one statement; its reply, or None when the link is gone or
        ``go_on`` says to give up."""
        request = console.Execute(code, mode, self.number)
        self.number += 1
        try:
            self.link.sendall(request.line())
        except OSError:
            return None
        while True:
            line = self._line(go_on)
            if line is None:
                return None
            reply = encoding.decode(line)
            if isinstance(reply, console.Reply) and reply.number == request.number:
                return reply

    def _line(self, go_on: Callable[[], bool]) -> bytes | None:
        while b"\n" not in self.buffer:
            if not go_on():
                return None
            ready, _, _ = select.select([self.link], [], [], TICK)
            if not ready:
                continue
            try:
                chunk = self.link.recv(1 << 20)
            except OSError:
                return None
            if not chunk or len(self.buffer) > console.MAX_LINE:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def quit(self) -> None:
        """Ask every process to end the session (each then exits 0)."""
        if self.link is None:
            return
        try:
            self.link.sendall(console.Quit(self.number).line())
        except OSError:
            pass

    def close(self) -> None:
        for sock in (self.link, self.listener):
            if sock is not None:
                sock.close()
