"""Tracing on demand: ``jaxrun profile`` and ``--profile`` in each controller.

Where the launcher names a trace folder (``contract.PROFILE_DIR``), the shim
calls :func:`install` at start-up: ``contract.PROFILE_SIGNAL`` (SIGUSR2)
then means "start a trace", the next one "stop it".  The signal reaches
every process the same way on every backend (the launcher's ``send``, which
each far end relays), as the stack dump's SIGUSR1 does.

Each ask is heard at once, in the stack dumps' thread (:func:`dumps.relay`:
one byte on the wakeup pipe per signal), also while the main thread sits in
a compile or a collective; Python's own handler would run once, when that
call returns, for the start and the stop together.  The ask only goes on a
queue, and starts nothing.  The thread that serves the queue is started at
start-up, and sleeps on it until the first ask; it starts and stops
``jax.profiler``'s trace (``start_trace``/``stop_trace``, never
``start_server``, which listens on every interface).  Until the first ask,
nothing of ``jax.profiler`` is imported.

Each trace goes into a session folder of its own (``contract.traces``); once
it is over, the marker there says which host name jax gave its files, or
why there is no trace.  A trace that nobody stops (an ask lost: a script
that took the wakeup fd hears its signals in the main thread, as one per
long call) ends by itself after ``contract.PROFILE_MAX_SECONDS``, and the
next ask starts a trace again.
"""

from __future__ import annotations

import itertools
import os
import queue
import sys
import threading
import time

from jaxrun import contract, portable
from jaxrun.child.watch import dumps

_asks: queue.SimpleQueue = queue.SimpleQueue()  # SimpleQueue.put is reentrant: also from a handler
# Clear while jaxrun's bootstrap is inside jax.distributed.initialize.  The
# launcher asks once every process has arrived there, and the trace's start
# makes jax's backend (``start_trace`` does): made before the join is whole,
# it would speak to the coordination service with a client not yet
# connected (seen: "wrong service incarnation", the process aborted).
_not_joining = threading.Event()
_not_joining.set()


def joining() -> None:
    """jaxrun's bootstrap is about to join the job: a trace waits for it."""
    _not_joining.clear()


def joined() -> None:
    """The join is over (done or failed): a trace may start."""
    _not_joining.set()


def install(environ=os.environ) -> bool:
    """Take ``contract.PROFILE_SIGNAL`` as the launcher's ask, if it named a
    trace folder; True if it did.  From the main thread, before the script,
    after ``dumps.install()``."""
    value = environ.get(contract.PROFILE_DIR)
    if not value:
        return False
    threading.Thread(target=Tracer(value).serve, args=(_asks,), name="jaxrun-profiler", daemon=True).start()
    dumps.relay(contract.PROFILE_SIGNAL, _asked)
    return True


def _asked() -> None:
    _asks.put(contract.PROFILE_SIGNAL)


class Tracer:
    """Start and stop: each ask turns the trace on or off, whether or not the
    last turn succeeded, so that the launcher's asks and the turns stay in step."""

    def __init__(self, folder: str, limit: float = contract.PROFILE_MAX_SECONDS):
        self.folder, self.limit = folder, limit
        self.asked = False  # the launcher's last ask was "start"
        self.session: str | None = None  # the session folder of the trace being taken
        self.held = -1  # its descriptor, until the trace's marker is written
        self.count = itertools.count()

    def serve(self, asks: queue.SimpleQueue) -> None:
        while True:
            try:
                asks.get(timeout=self.limit if self.session else None)
            except queue.Empty:  # nobody stopped it (two asks heard as one): end it; the next ask starts again
                self.stop()
                self.asked = False
                continue
            self.asked = not self.asked
            if self.asked:
                self.start()
            else:
                self.stop()

    def start(self) -> None:
        name = f"{os.getpid()}-{next(self.count)}"
        try:  # a bare name: in this host's private base, made now (one of a random name where another user's is)
            if not os.path.isabs(self.folder):
                self.folder = contract.trace_folder(self.folder, make=True) or ""
        except OSError as e:
            print(f"jaxrun: no trace: no private trace folder on this host ({e.strerror or e})", file=sys.stderr,
                  flush=True)
            return
        if not self.folder:
            print("jaxrun: no trace: the launcher named no trace folder", file=sys.stderr, flush=True)
            return
        session = os.path.join(self.folder, name)
        try:  # held by descriptor: a folder renamed or swapped meanwhile changes nothing
            held = contract.open_chain(self.folder, 2)
            try:
                os.mkdir(name, 0o700, dir_fd=held)
                self.held = contract.open_folder(name, held)
            finally:
                os.close(held)
        except contract.NotOurs as e:
            print(f"jaxrun: no trace: {self.folder} or its parent is not private: {e}", file=sys.stderr, flush=True)
            return
        except OSError as e:
            print(f"jaxrun: no trace: cannot make {session}: {e.strerror or e}", file=sys.stderr, flush=True)
            return
        session = portable.held_path(self.held, session)
        if "jax" not in sys.modules:  # importing it here would make its backend before the job joined
            self.finish(session, "the process has not imported jax")
            return
        _not_joining.wait()
        try:
            import jax.profiler

            jax.profiler.start_trace(session)
        except Exception as e:  # noqa: BLE001 - a trace the script took itself, a missing profiler
            self.finish(session, f"{type(e).__name__}: {e}")
            return
        self.session = session

    def stop(self) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        error = None
        try:
            import jax.profiler

            jax.profiler.stop_trace()
        except Exception as e:  # noqa: BLE001 - the script stopped it itself
            error = f"{type(e).__name__}: {e}"
        self.finish(session, error)

    def finish(self, session: str, error: str | None) -> None:
        """The marker: the trace is over, and what the gatherer needs to name its files."""
        import json  # here: only a trace's end needs them
        import socket

        said = {"host": socket.gethostname(), "error": error, "at": time.time()}
        try:
            contract.write_private(os.path.join(session, contract.TRACE_MARKER), json.dumps(said).encode())
        finally:
            if self.held >= 0:
                os.close(self.held)
                self.held = -1
