"""Whether this process's device is busy while its main thread is outside
JAX, for the time account (``child.watch.accounting``, issue 76), read by a
tiny program of its own.

A loop that waits for its devices only every N steps, or never, runs its
programs under the host's next input stage: the main thread is outside JAX
while the device computes, and the account's look alone would call that
time the host's.  So, at a look that finds the main thread outside JAX (at
most every ``PERIOD`` seconds on average, each gap drawn between half and
one and a half of it, so that no loop's period aliases with it), the
account asks a thread of jaxrun's (``THREAD``) to dispatch ``x + 1`` on a
scalar kept on the process's first local device, and that thread asks
``CHECK`` seconds after the dispatch returned whether it has finished.  An accelerator runs a
device's programs in order (measured on the TPU host: a probe dispatched
behind a 198 ms program came back after 196 ms, its dispatch took 0.4 ms),
so a probe not finished by then waited behind programs queued before it:
the device was busy when the main thread was outside JAX.  An idle device
answers in 0.5-1.0 ms (the round trip there: median 0.73 ms, 99th
percentile 1.0 ms, from the dispatch's start); from the dispatch's return,
which a main thread computing in numpy can delay to the probe's enqueue, an
idle chip's probe was still out at 1 ms 0-8 times in 300, hence ``CHECK``;
a backlog shorter than about ``CHECK`` is missed.  The answer covers the main thread's time
outside JAX since the last answer (``Accountant.look``): the instants are
random within that time, so the share of answers that say busy is the share
of that time the device was busy.  While the probe waits behind a backlog,
the device is busy now (``verdict``).  A main thread parked outside JAX for
``accounting.PARKED_QUIET``, the device seen idle, asks no more: it
dispatches nothing, and a stalled job stays still.

The thread waits for its probe with ``is_ready`` and short sleeps, never in
JAX: a long program is never held by jaxrun's thread too.  The probe is
made at the first ask, from a stage of the host's, never beside the
script's first compiles.  The probe runs
only where a device runs programs in order, out of the host's sight: not on
CPU, where XLA's threads run a program beside the others (measured there:
the probe came back in 0.3 ms while a 187 ms program ran), and only once the
script has made JAX's backend (the runtime's start is the script's, never
this thread's).  Its compile is one, and no part of the
script's ``compile`` (``child.watch.marks`` leaves this thread's events out); it is one process's, one
device's, so the checks that match programs across processes and the flight
recorder leave it out (``child.checks.programs``, ``child.checks.flight``
read ``THREAD`` and ``PROGRAM``).  It stops when the script returns and
never keeps the process alive (a daemon thread)."""

from __future__ import annotations

import sys
import threading
import time

THREAD = "jaxrun-backlog"  # jaxrun's own (``place._OWN_THREADS``): neither work nor a spin
PROGRAM = "jaxrun_backlog_probe"  # the probe's function name, as the checks read it
PERIOD = 0.05  # seconds between probes, on average, while the main thread is outside JAX
CHECK = 0.0015  # seconds after its dispatch returned: a probe not done by then waited behind programs
STOP_WAIT = 0.5  # seconds the script's return waits for the thread, at most
POLL = (0.001, 0.05)  # the first and the longest sleep between looks at a probe that waits


def _backend_ready() -> bool:
    """Whether the script has made JAX's backend (never made here)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    ready = getattr(bridge, "backends_are_initialized", None)
    try:
        return bool(ready is not None and ready())
    except Exception:  # noqa: BLE001 - a jax without it: no probe
        return False


class Backlog:
    """The probe's thread, the probe in flight, and its last answer."""

    def __init__(self, check: float = CHECK, ready=_backend_ready, clock=time.perf_counter):
        self.check, self.ready, self.clock = check, ready, clock
        self.fresh: bool | None = None  # the last answer, until the account takes it
        self.flight: tuple | None = None  # (the probe's output, its dispatch) while it is not done
        self.probes = self.busy_probes = 0
        self.platform = ""  # the device's, once known
        self.asked = threading.Event()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None  # set once started, under ``lock``
        self.lock = threading.Lock()  # start and stop: a stop never finds a thread not yet started
        self.main = threading.main_thread().ident
        self.code = None  # the code the main thread ran when asked
        self.moved = 0  # asks not sent: the main thread had moved on

    def start(self) -> None:
        with self.lock:
            if self.thread is None and not self.stopped.is_set():
                thread = threading.Thread(target=self.run, name=THREAD, daemon=True)
                thread.start()
                self.thread = thread

    def stop(self) -> None:
        """The script returned: no more probes, and no more answers; the thread
        is out of JAX before JAX's own shutdown (it waits in Python's sleeps, so
        at once, unless a dispatch is under way: ``STOP_WAIT`` at most)."""
        with self.lock:  # the account's thread may be starting the probe's now
            self.stopped.set()
            thread = self.thread
        self.asked.set()
        self.fresh = self.flight = None
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_WAIT)

    def ask(self, code=None) -> None:
        """A probe now (the main thread is outside JAX, running ``code``),
        unless one is in flight."""
        if self.flight is None:
            if self.thread is None and not self.ready():
                return  # no backend of the script's yet: no thread (a process without JAX never has one)
            self.code = code
            self.asked.set()
            self.start()  # at the first ask: a process that never asks never has this thread

    def verdict(self) -> bool | None:
        """True: the device is busy now (the probe in flight waits behind its
        programs), or was at the last probe; False: it was idle then; None:
        no new answer since the last verdict."""
        flight = self.flight
        if flight is not None and self.clock() - flight[1] >= self.check:
            try:
                if not flight[0].is_ready():
                    return True
            except Exception:  # noqa: BLE001 - the probe's array went away under us
                return None
        fresh, self.fresh = self.fresh, None
        return fresh

    def run(self) -> None:
        try:
            # Made at the first ask, never before: the main thread is then outside
            # JAX, past its first compile, so the probe's compile is not one the
            # script's waits behind (made beside it, it cost the script's first
            # compile about 1 s on the TPU host).
            while True:
                self.asked.wait()
                self.asked.clear()
                if self.stopped.is_set():
                    return
                if self.ready():
                    break
            probe, one = self.prepare()
            while probe is not None and not self.stopped.is_set():
                self.asked.wait()
                self.asked.clear()
                if not self.stopped.is_set():
                    self.sample(probe, one)
        except Exception:  # noqa: BLE001 - a probe that fails is no failure of the job's; the account goes on without
            pass
        finally:
            self.fresh = self.flight = None

    def prepare(self):
        """The probe's program, compiled once, and its scalar on the first
        local device; (None, None) where the device is a CPU."""
        import jax  # made by the script already: its backend is up

        device = jax.local_devices()[0]
        self.platform = device.platform
        if device.platform == "cpu":
            return None, None

        def jaxrun_backlog_probe(x):
            return x + 1

        one = jax.device_put(jax.numpy.zeros((), "float32"), device)
        probe = jax.jit(jaxrun_backlog_probe)
        self.wait(probe(one))  # its compile, once
        return probe, one

    def still(self) -> bool:
        """Whether the main thread still runs the code it ran when asked.  A
        probe sent after it went into JAX would wait behind the program it
        dispatched then, whose time is the devices' already (the host blocks
        on it): its "busy" would move the host's time before it too.  Between
        the ask and this thread's turn lie a wake-up and the GIL."""
        if self.code is None:
            return True
        frame = sys._current_frames().get(self.main)
        return frame is not None and frame.f_code is self.code

    def sample(self, probe, one) -> None:
        if not self.still():
            self.moved += 1
            return
        out = probe(one)
        # From the dispatch's return, not its start: a dispatch slowed by the
        # script's threads (the GIL) may enqueue the probe only at its end.
        sent = self.clock()
        time.sleep(self.check)
        busy = not out.is_ready()
        self.probes += 1
        self.busy_probes += busy
        if busy:
            self.flight = (out, sent)
        if not self.stopped.is_set():
            self.fresh = busy
        self.wait(out)
        self.flight = None

    def wait(self, out) -> None:
        """Until ``out`` is done, in short sleeps of Python's (never in JAX)."""
        pause = POLL[0]
        while not out.is_ready():
            if self.stopped.wait(pause):
                return
            pause = min(POLL[1], pause * 2)


started: Backlog | None = None


def start() -> Backlog:
    """This process's probe; its thread starts at its first ask."""
    global started
    if started is None:
        started = Backlog()
    return started


def stop() -> None:
    if started is not None:
        started.stop()
