"""The control channel's listening end: how a running jaxrun answers the
commands that look into it from another terminal (``launcher/inspect/``:
``jaxrun stacks``, ``jaxrun top``, ``jaxrun profile``).

Where it listens: a Unix stream socket in this user's private socket
folder (``portable``'s, 0700; never the log folder, which ``--log-dir`` may
put anywhere, and never TCP), named by the run id (``address``).  It
appears whole (bound under a temporary name, then renamed), so a command
never finds a socket that nobody listens on yet; one left by a jaxrun that
was SIGKILLed refuses connections, and the commands remove it.  Who may
connect: this user only; the folder keeps others out, and the peer's user
id is checked on every connection where the system says it.

What it says: ``wire.inspect``, one request and one answer per connection,
each in a thread of its own.  A request is answered by the handler
registered for its type (``handles``); another module adds a kind by
registering one, once it is imported.  Handlers read the job through a
``JobView`` and never block the supervisor's loop: they read a snapshot of
its slots, or put an event on its queue (``JobView.post``) and wait for its
effect with a bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import secrets
import select
import socket
import sys
import threading
import time
from collections.abc import Callable

from jaxrun import portable
from jaxrun.launcher.attempt import profiling, snapshot
from jaxrun.wire import encoding, inspect as words

PREFIX, SUFFIX = "run-", ".sock"
CONNECTION_TIMEOUT = 10.0  # for a request's line to arrive, and an answer to leave
MAX_REQUEST = 1 << 16

Handler = Callable[[encoding.Message, "JobView"], encoding.Message]
HANDLERS: dict[type, Handler] = {}


def handles(kind: type) -> Callable[[Handler], Handler]:
    """Register the handler of one request type (a message of ``wire``)."""

    def register(handler: Handler) -> Handler:
        if kind in HANDLERS:
            raise ValueError(f"{kind.__name__} has a handler already: {HANDLERS[kind].__qualname__}")
        HANDLERS[kind] = handler
        return handler

    return register


def address(run_id: str, folder: str | None = None) -> str | None:
    """Where run ``run_id``'s channel listens (None: this user has no private
    socket folder).  A path too long for a Unix socket names the run by a
    hash of its id instead, as the fork server's does."""
    folder = folder or portable.sockets.private_socket_folder()
    if folder is None:
        return None
    path = os.path.join(folder, f"{PREFIX}{run_id}{SUFFIX}")
    if len(path) > portable.sockets.LONGEST_SOCKET_PATH:
        path = os.path.join(folder, PREFIX + hashlib.sha256(run_id.encode()).hexdigest()[:16] + SUFFIX)
    return path


@dataclasses.dataclass
class JobView:
    """What the handlers read of the running job.  The run loop keeps
    ``running`` (its list: the current attempt's supervisor) and says when an
    attempt is over (``attempt_over``)."""

    run_id: str
    argv: list
    log_dir: str
    max_restarts: int
    running: list
    post: Callable[[object], None]  # an event for the supervisor's loop (the run's queue)
    started: float = dataclasses.field(default_factory=time.time)
    usage: snapshot.Usage = dataclasses.field(default_factory=snapshot.Usage)
    # The supervisor whose attempt is over, with the whole job to start again.
    _over: object = dataclasses.field(default=None, init=False, repr=False)

    def supervisor(self):
        return self.running[0] if self.running else None

    def attempt_over(self, restart_follows: bool) -> None:
        self._over = self.supervisor() if restart_follows else None

    @property
    def restarting(self) -> bool:
        """Between two attempts: the last is over, the next not yet started."""
        return self._over is not None and self.supervisor() is self._over


@handles(words.Describe)
def describe(request: words.Describe, view: JobView) -> words.JobInfo:
    return words.JobInfo(view.run_id, os.getpid(), view.started, list(view.argv), view.log_dir)


@handles(words.AskTable)
def table(request: words.AskTable, view: JobView) -> words.Table:
    supervisor = view.supervisor()
    if supervisor is None:  # the first attempt is being placed
        return words.Table(view.run_id, 0, 0, view.max_restarts, ())
    return snapshot.table(supervisor, view.run_id, view.max_restarts, view.usage, view.restarting)


@handles(words.AskStacks)
def stacks(request: words.AskStacks, view: JobView) -> words.Stacks:
    supervisor = view.supervisor()
    if supervisor is None or view.restarting:
        return words.Stacks((), f"no process runs now: the job is {'re' if view.restarting else ''}starting")
    return snapshot.dumps(supervisor, view.post, min(max(request.wait, 0.5), 60.0))


@handles(words.AskProfile)
def profile(request: words.AskProfile, view: JobView) -> encoding.Message:
    supervisor = view.supervisor()
    if supervisor is None or view.restarting or supervisor.profiler is None:
        return words.Refused("no process runs now: the job is starting")
    try:
        traced = supervisor.profiler.trace(request.seconds)
    except (profiling.NotNow, ValueError) as e:
        return words.Refused(str(e))
    return words.ProfileTaken(traced.root, traced.folder, profiling.open_command(traced.root),
                              tuple(words.ProfilePart(p.rank, list(p.files), p.problem or "") for p in traced.parts))


class ControlChannel:
    """The listening socket and its thread; ``close`` removes the socket."""

    def __init__(self, view: JobView, path: str):
        self.view, self.path = view, path
        self.refused = 0  # connections from another user
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        temporary = os.path.join(os.path.dirname(path), f".t{secrets.token_hex(4)}")
        try:
            self.listener.bind(temporary)
            self.listener.listen(16)
            os.replace(temporary, path)  # it appears listening
            self.inode = os.lstat(path).st_ino
        except BaseException:
            self.listener.close()
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        self._wake_r, self._wake_w = os.pipe()
        self.thread = threading.Thread(target=self._accept, name="jaxrun-control-channel", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            ready, _, _ = select.select([self.listener, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), name="jaxrun-control-request", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if portable.peer_uid(conn) not in (None, os.getuid()):
                self.refused += 1
                return  # another user: not a word
            conn.settimeout(CONNECTION_TIMEOUT)
            try:
                request = encoding.decode(read_line(conn, MAX_REQUEST))
            except (OSError, EOFError, encoding.WireError) as e:
                answer: encoding.Message = words.Refused(f"no request: {e}")
            else:
                answer = self._answer(request)
            with contextlib.suppress(OSError):
                conn.sendall(answer.line())

    def _answer(self, request: encoding.Message) -> encoding.Message:
        handler = HANDLERS.get(type(request))
        if handler is None:
            return words.Refused(f"this jaxrun does not answer {request.WORD!r}")
        try:
            return handler(request, self.view)
        except Exception as e:  # noqa: BLE001 -- the asker hears why; the run goes on
            return words.Refused(f"{type(e).__name__}: {e}")

    def close(self) -> None:
        """Stop listening and remove the socket (if it is still this one's)."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self.thread.join(timeout=2.0)
        with contextlib.suppress(OSError):
            if os.lstat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        self.listener.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def read_line(conn: socket.socket, limit: int) -> bytes:
    """One line from ``conn`` (EOFError: it closed first; WireError: too long)."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            if data:
                break
            raise EOFError("the peer closed")
        data += chunk
        if len(data) > limit:
            raise encoding.WireError(f"a line over {limit} bytes")
    return bytes(data)


def open_channel(view: JobView, note: Callable[[str], None] = lambda line: None,
                 say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
                 ) -> ControlChannel | None:
    """Listen for the run's inspecting commands; None where this user has no
    private socket folder, or the socket cannot be made (the run goes on
    without its channel, and ``note`` says why).  ``say``: the line that
    tells where the run's sockets are when the usual folder was taken."""
    folder, why = portable.sockets.socket_folder()
    if why:
        say(why)
    path = address(view.run_id, folder) if folder else None
    if path is None:
        note("jaxrun: no private socket folder: jaxrun stacks and jaxrun top cannot reach this run")
        return None
    try:
        return ControlChannel(view, path)
    except OSError as e:
        note(f"jaxrun: cannot listen on {path}: {e.strerror or e}; jaxrun stacks and jaxrun top cannot reach "
             "this run")
        return None
