"""Child side of the run's goodput: what this process spends on compiles
and checkpoint saves, and the steps its script marks.

Nothing is required of the script.  JAX reports each compile through
``jax.monitoring`` (jax 0.10: ``/jax/core/compile/jaxpr_trace_duration``,
``/jax/core/compile/jaxpr_to_mlir_module_duration`` and
``/jax/core/compile/backend_compile_duration``, one after the other for a
program; a hit in the persistent cache is inside the last one), and Orbax
reports the part of each save the step waits for
(``/jax/orbax/write/blocking_duration_secs``, and for an async save
``/jax/orbax/write/async/blocking_duration_secs``; Orbax sends them from
its primary host only).  A listener here adds them up.  A script that
saves its own way marks it: ``with jaxrun.checkpointing(): save(...)``, or
``jaxrun.checkpoint_saved(seconds)`` after the fact, and may count its
steps with ``jaxrun.step()``; any ``jax.monitoring`` duration event the
script itself emits under one of the names above counts the same way.

The runtime's start (JAX making its first backend: about 10 s on a TPU
host) is timed apart (``runtime_start``): a script's first JAX call often
starts it inside a trace or a compile, whose events would otherwise count it
as compile time; the part of a compile event that overlaps it is left out.

The sums go to the launcher as one small JSON object (``contract.Marks``)
in the file ``contract.MARKS_FILE``, rewritten whole after a save or a
compile, at most once every ``MIN_GAP`` seconds (a thread writes what a
gap held back), and once more when the script returns or fails.  The
launcher reads it when the process ends (a far end reads it there and
sends it home with the process's end), so a process killed without a
word still leaves what it had written.  The listener costs a few
additions per compile and per save; steps cost one addition.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from jaxrun import contract
from jaxrun.child.watch import backlog

COMPILE_EVENTS = frozenset({
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
})
CHECKPOINT_EVENTS = frozenset({
    "/jax/orbax/write/blocking_duration_secs",
    "/jax/orbax/write/async/blocking_duration_secs",
})
MIN_GAP = 2.0  # seconds between two writes of the file: a few a minute at most in a busy job


class Tally:
    """The sums, and when they were last written (one lock: compiles may run in threads)."""

    def __init__(self, path: str | None, clock=time.time, gap: float = MIN_GAP):
        self.path, self.clock, self.gap = path, clock, gap
        self.lock = threading.Lock()
        self.compile = self.checkpoint = self.compile_after_save = self.runtime_start = 0.0
        self.starts: list[tuple[float, float]] = []  # the runtime's starts, on the monotonic clock
        self.saves = self.steps = 0
        self.saved_at: float | None = None
        self.written_at = float("-inf")
        self.dirty = False
        self.wake = threading.Event()
        self.host = ""  # this machine's name, asked at the first write: no socket import at start-up
        self.places = ("", 0.0, "", 0.0)  # where the host's compute and its idle time went most (the account's)

    def heard(self, event: str, seconds: float, now: float | None = None) -> None:
        """A ``jax.monitoring`` duration event, ending ``now`` (monotonic)."""
        if event in COMPILE_EVENTS:
            end = time.monotonic() if now is None else now
            with self.lock:
                overlap = sum(max(0.0, min(end, b) - max(end - seconds, a)) for a, b in self.starts)
            self.add_compile(seconds - overlap)
        elif event in CHECKPOINT_EVENTS:
            self.saved(seconds)

    def runtime_started(self, began: float, ended: float) -> None:
        """The runtime started between ``began`` and ``ended`` (monotonic)."""
        with self.lock:
            self.starts.append((began, ended))
            self.runtime_start += max(0.0, ended - began)
        self.dirty = True  # told with the next write: the first compile's goes out at once, as before

    def add_compile(self, seconds: float) -> None:
        with self.lock:
            self.compile += max(0.0, seconds)
            self.compile_after_save += max(0.0, seconds)
        self._changed()

    def saved(self, seconds: float) -> None:
        """A save that took ``seconds`` of the step's time ended now."""
        with self.lock:
            self.checkpoint += max(0.0, seconds)
            self.saves += 1
            self.saved_at = self.clock()
            self.compile_after_save = 0.0
        self._changed()

    def step(self) -> None:
        self.steps += 1  # told with the next write: a step alone is no news worth a write

    def marks(self) -> contract.Marks:
        with self.lock:
            return contract.Marks(round(self.compile, 6), round(self.checkpoint, 6), self.saves, self.saved_at,
                                  round(self.compile_after_save, 6), self.steps, self.clock(), self._host(),
                                  round(self.runtime_start, 6), *self.places)

    def _host(self) -> str:
        if not self.host:
            import socket

            self.host = socket.gethostname()
        return self.host

    def _changed(self) -> None:
        if self.clock() - self.written_at >= self.gap:
            self.flush()
        else:
            self.dirty = True
            self.wake.set()

    def flush(self) -> None:
        """Write the sums now (the script returned or failed, or a gap has passed)."""
        if not self.path:
            return
        self.dirty = False
        self.written_at = self.clock()
        try:
            contract.write_private(self.path, json_line(self.marks()))
        except OSError:
            pass  # the account then lacks this process's marks, and says what it had

    def run(self) -> None:
        """The writer of what a gap held back (a daemon thread)."""
        while True:
            self.wake.wait()
            self.wake.clear()
            time.sleep(max(0.0, self.written_at + self.gap - self.clock()))
            if self.dirty:
                self.flush()


def json_line(marks: contract.Marks) -> bytes:
    import json

    return json.dumps(marks.to_dict()).encode() + b"\n"


_tally: Tally | None = None


def _the_tally() -> Tally:
    """This process's tally; outside jaxrun (no file to write) the marks are only counted."""
    global _tally
    if _tally is None:
        _tally = Tally(os.environ.get(contract.MARKS_FILE))
        if _tally.path:
            threading.Thread(target=_tally.run, name="jaxrun-marks", daemon=True).start()
    return _tally


def prepare(environ=os.environ) -> None:
    """Listen to JAX's events from the script's ``import jax`` on, where the
    launcher asked for marks."""
    if not environ.get(contract.MARKS_FILE):
        return
    from jaxrun.child import hooks

    hooks.after_import("jax", _listen)


def _listen(_jax) -> None:
    try:
        from jax import monitoring
    except ImportError:  # a jax without it (older, or a stand-in): no compile or save is heard
        return

    tally = _the_tally()

    def heard(event, seconds, **_kw):
        if threading.current_thread().name != backlog.THREAD:  # the account's probe compiles no step of the script's
            tally.heard(event, seconds)

    monitoring.register_event_duration_secs_listener(heard)
    _time_runtime_start(tally)


def _time_runtime_start(tally: Tally) -> None:
    """Time each backend JAX makes (``xla_bridge._init_backend``, once per platform)."""
    try:
        from jax._src import xla_bridge
    except ImportError:
        return
    real = getattr(xla_bridge, "_init_backend", None)
    if real is None or getattr(real, "_jaxrun_timed", False):
        return

    def _init_backend(*args, **kwargs):
        began = time.monotonic()
        try:
            return real(*args, **kwargs)
        finally:
            tally.runtime_started(began, time.monotonic())

    _init_backend._jaxrun_timed = True
    xla_bridge._init_backend = _init_backend


def checkpoint_saved(seconds: float) -> None:
    """Tell jaxrun that a checkpoint save that held this process for
    ``seconds`` has just ended (for a save ``checkpointing()`` cannot wrap)."""
    _the_tally().saved(float(seconds))


@contextlib.contextmanager
def checkpointing():
    """``with jaxrun.checkpointing(): save(state)``: the block's time counts as
    a checkpoint save in the run's goodput, and its end as the last point a
    restart can resume from.  A block that raises is no save."""
    started = time.monotonic()
    yield
    checkpoint_saved(time.monotonic() - started)


def step() -> None:
    """Count one step of the script's (cheap: one addition)."""
    _the_tally().step()


def host_places(compute: tuple[str, float] | None, idle: tuple[str, float] | None) -> None:
    """The account's word, at the script's return: the script's line where
    the host spent most of its own compute and of its idle time, with the
    seconds (``child.watch.accounting``); written with the marks that follow."""
    if _tally is None:
        return  # no marks wanted (or none heard): nobody reads them
    cap = contract.PLACE_MAX
    _tally.places = (compute[0][:cap] if compute else "", round(compute[1], 3) if compute else 0.0,
                     idle[0][:cap] if idle else "", round(idle[1], 3) if idle else 0.0)


def script_ended() -> None:
    """The script returned or failed: what is counted goes to the file now."""
    if _tally is not None:
        _tally.flush()
