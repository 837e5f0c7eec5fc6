"""Where this process's time goes, from its join on: its own work, its
programs, and its waits for the other processes (on unless ``--no-account``).

The main thread's sampler (``child.watch.sampler``, one thread that serves
the stall watchdog too) looks at the main thread every ``TICK`` seconds and
gives the time since its last look to one part of a ``contract.TimeSplit``:

- ``work``: the main thread is outside JAX and computes (the script's own
  Python, its input pipeline, numpy): on a CPU or ready for one at the look,
  or asleep but on a CPU for ``COMPUTED`` of the tick since the last look
  (a thread that runs Python waits for the GIL while a look holds it); the
  run's goodput calls it ``input``;
- ``idle``: outside JAX and parked: the script's frame in one of Python's
  own waits (``time.sleep``, ``select``), or asleep with less CPU than that
  (a queue's ``get``, a socket's read, a lock).  For both, the script's
  innermost frame of its own is counted per line (``most_at``), and the
  line that holds most of each goes home with the marks at the end;
- ``compile``: it is inside JAX's compiler;
- ``programs`` and ``waiting``: it is inside JAX (a jitted call, an eager
  operation, ``block_until_ready``, ``float(x)``).  The process's CPU since
  the last look, plus the time its main thread was ready to run but had no
  CPU (a loaded machine's run queue) and the time its CPU group was held
  back by a quota (a container's CPU limit: its threads wanted the CPU), is
  its programs' time, one core at most; the rest of the tick
  it used no CPU and wanted none: it waited, and inside JAX what a process
  waits for is the other processes, at a collective or a sync point.  On
  CPU a waiting process blocks (0.3% of a core was measured: 1 ms of CPU in
  300 ms of waiting at a collective), so the line between the two is sharp.
  A process alone in its job (``alone``) waits for nobody: its time inside
  JAX is its programs', the device's time on an accelerator (where the host
  blocks while the chip runs the step) as on CPU.

Outside JAX, where the process's device is an accelerator, a probe of
jaxrun's (``child.watch.backlog``), asked at a look about every ``PERIOD``,
says whether the device was busy then with programs the script dispatched
before: a loop that waits for its devices only every N steps, or never,
computes its next batch while the device runs the last step.  The main
thread's time outside JAX since the last answer is ``programs`` (the
devices' time) where the answer is "busy", and stays the host's otherwise.

The runtime's start (JAX making its first backend: about 10 s on a TPU
host, often inside the script's first trace or compile) is no part of the
split: it is start-up, and the account's clock moves past it (``began``
and ``covered`` leave it out).

Each look costs a walk of the main thread's frames (each code object is
judged once, then looked up), one CPU clock read, the main thread's
``schedstat`` and the CPU group's ``cpu.stat``:
``bench/account.py`` measures it against the same job with the account off,
and times looks back to back; ``bench/looks.py`` times them on their
schedule (200-380 us of CPU each on a 2-core machine, about 1% of a core).
A main thread found parked at one place at every look for ``STILL_SLOW``
is looked at every ``STILL_TICK`` until a look finds it elsewhere.
The cumulative split goes to the launcher beside the activity line
(``contract.read_activity_file``): ``FIRST_EVERY`` seconds after the join,
then at twice the last gap up to ``EVERY``, and when the script returns; what
the launcher makes of it (who the others wait for) is in
``launcher/attempt/straggler.py``.  docs/time.md says what each part is
computed from on GPU and TPU.  A wait inside JAX at one call site that lasts
is said to ``waits`` (the parting check, where ``--checks`` runs), as ``watch.waiting`` judges it.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

from jaxrun import contract, portable
from jaxrun.child.watch import activity, backlog, marks, place, sampler, waiting

TICK = sampler.TICK  # seconds between looks
COMPUTED = 0.25  # of a look's tick on a CPU, or waiting for one: a main thread outside JAX that computes
FIRST_EVERY = 2.0  # the first record, then 4 and 8 s after it ...
EVERY = 10.0  # ... and every 10 s
PARKED_QUIET = 1.0  # seconds parked outside JAX, the device idle, after which its probe is not asked
# A main thread found parked at one place at every look for STILL_SLOW seconds is looked
# at every STILL_TICK, until a look finds it elsewhere: an idle process (a session at its
# prompt, a script asleep) paid 1.7-2.1% of a core for looks every TICK on this project's
# machine (bench/looks.py).
STILL_SLOW = 1.0
STILL_TICK = 0.1
_OUTSIDE, _INSIDE, _COMPILER, _STARTING = place.OUTSIDE, place.INSIDE, place.COMPILER, place.STARTING

_started: Accountant | None = None
# Who hears of a long wait (the parting check, ``child.checks.parting``): anything
# with ``seconds`` (how long a wait at one place must last) and ``changed(waiting)``,
# called on the sampler's thread once a wait has lasted that long, and once it ends.
waits = None


def _is_jax(value) -> bool:
    return (getattr(type(value), "__module__", None) or "").startswith(("jax.", "jaxlib."))


def calls_jax(frame, sites=frozenset()) -> bool:
    """Whether ``frame`` stands at a call into JAX's native code: a call site
    seen calling into JAX before (``sites``: its first call of a jitted
    function ran JAX's Python), a jitted function named by a global (or an
    attribute of one), ``block_until_ready``.

    A callable in the frame's own variables is never read: ``f_locals`` of
    a running frame copies every local into a dict that lives on with the
    frame, and the script's arrays would outlive their ``del`` (a training
    state kept a step too long is the device memory of a whole state)."""
    code = frame.f_code
    offset = place.site_offset(code, frame.f_lasti)
    if (code, offset) in sites:
        return True
    recipe = place.callee_recipe(code, offset)
    if recipe is None:
        return False
    if recipe[-1] in place.JAX_WAITS:
        return True
    if recipe[0]:
        return False
    value = frame.f_globals.get(recipe[1])
    if value is None:
        value = frame.f_builtins.get(recipe[1])
    if len(recipe) == 3:
        import inspect  # here: once, the first time an attribute is called

        value = None if value is None else inspect.getattr_static(value, recipe[2], None)
    return _is_jax(value)


class Accountant:
    """The account: its last look, and the parts so far."""

    def __init__(self, tell, main: int | None = None, clock=time.monotonic, wall=time.time,
                 cpu=activity.others_cpu, delay=None, frames=sys._current_frames, alone: bool = False,
                 host=None, running=None, device=None, starved=None):
        self.tell = tell  # called with each TIME line
        self.alone = alone  # the job's only process: nobody to wait for
        self.main = threading.main_thread().ident if main is None else main
        main_tid = portable.main_native_id()
        self.clock, self.cpu, self.frames = clock, cpu, frames
        throttled, main_delay = portable.Throttling(), portable.RunDelay(main_tid)
        self.delay = delay or (lambda: main_delay() + throttled())
        # The wait at one call site (watch.waiting); its threads' waits for a CPU are read from the
        # system, unless a ``delay`` of the caller's own (a test's) says the system is not read.
        self.wait = waiting.Wait(starved or ((lambda: 0.0) if delay is not None else waiting.threads_starved))

        def main_used() -> float:
            both = main_delay.both()
            return 0.0 if both is None else both[0] + both[1]

        # The main thread's CPU seconds and its waits for one so far (read at every look, 0.4 us),
        # and whether it is on a CPU or ready for one now (None: the system does not say; read
        # only outside JAX, where it tells compute from parked).
        self.host = host or main_used
        self.running = running or portable.ThreadRunning(main_tid)
        # The device's probe (child.watch.backlog's: ``ask()``, ``verdict()``), where one runs; the
        # main thread's seconds outside JAX, by part, since its last answer; when to ask next.
        self.device = device
        self.unanswered = {"work": 0.0, "idle": 0.0}
        self.next_ask, self.parked_for, self.outside_looks = 0.0, 0.0, 0
        self.device_busy: bool | None = None  # the probe's last answer: busy, idle, or none yet
        self.places: dict[object, int] = {}  # code object -> _OUTSIDE, _INSIDE or _COMPILER
        self.own: dict[object, bool] = {}  # code object -> the script's own (not a library's, not Python's)
        self.sites: set[tuple[object, int]] = set()  # (code, offset): the script's calls seen going into JAX
        self.parts = {"work": 0.0, "programs": 0.0, "waiting": 0.0, "compile": 0.0, "idle": 0.0}
        # Where the host's own time went: (code, line) of the script's innermost frame -> seconds, per part.
        self.host_sites: dict[str, dict[tuple[object, int], float]] = {"work": {}, "idle": {}}
        self.host_at: tuple[object, int] | None = None  # that frame, at the last look
        self.innermost = None  # the main thread's innermost frame, from place() to look()'s use of it
        self.began = wall()
        self.start = self.last_time = clock()
        self.last_cpu, self.last_delay, self.last_host = cpu(), self.delay(), self.host()
        self.next_tell, self.gap = self.start + FIRST_EVERY, FIRST_EVERY
        self.lock = threading.Lock()
        self.finished = False
        self.at = None  # (code, line) of the script's frame that called into JAX, at the last look
        # Parked at one place (its innermost frame and instruction) at every look since: the pause
        # to the next look (the sampler's) grows to STILL_TICK once that has lasted STILL_SLOW.
        self.still_at, self.still_for, self.pause = None, 0.0, TICK

    def place(self) -> int:
        """Where the main thread is now: outside JAX, inside it, or in its
        compiler.  A frame of the script's that called into JAX (the frame
        below JAX's outermost) is a call site of JAX's, kept in ``sites``."""
        frame = self.frames().get(self.main)
        innermost, where, inner, at, mine = frame, _OUTSIDE, _OUTSIDE, None, None
        places, own = self.places, self.own
        while frame is not None:
            code = frame.f_code
            found = places.get(code)
            if found is None:
                found = places[code] = place.code_place(code)
            if found:
                where = max(where, found)
            else:
                if inner:
                    self.learn(code, frame.f_lasti)
                    if at is None:
                        at = (code, frame.f_lineno)
                if mine is None:
                    is_own = own.get(code)
                    if is_own is None:
                        is_own = own[code] = place.is_scripts(code.co_filename)
                    if is_own:
                        mine = (code, frame.f_lineno)
            inner = found
            frame = frame.f_back
        self.at, self.host_at, self.innermost = at, mine, innermost
        if where == _OUTSIDE and innermost is not None and calls_jax(innermost, self.sites):
            self.at = (innermost.f_code, innermost.f_lineno)
            return _INSIDE  # a jitted call's C++ path, y.block_until_ready(): jaxlib's, no frame of their own
        return where

    @staticmethod
    def calls_wait(frame) -> bool:
        try:
            return frame is not None and place.calls_python_wait(frame)
        except (AttributeError, TypeError):  # a frame that changed under the walk
            return False

    def learn(self, code, lasti: int) -> None:
        site = (code, place.site_offset(code, lasti))
        if site not in self.sites:
            if len(self.sites) > 4096:
                self.sites.clear()
            self.sites.add(site)

    def look(self) -> None:
        """Give the time since the last look to the part the main thread is in."""
        where = self.place()
        innermost, self.innermost = self.innermost, None  # a frame kept would keep the script's locals
        self.outside_looks = self.outside_looks + 1 if where == _OUTSIDE else 0
        now, cpu, delay, host = self.clock(), self.cpu(), self.delay(), self.host()
        seconds = max(0.0, now - self.last_time)
        wanted = max(0.0, cpu - self.last_cpu) + max(0.0, delay - self.last_delay)
        computed = max(0.0, host - self.last_host)
        self.last_time, self.last_cpu, self.last_delay, self.last_host = now, cpu, delay, host
        if where != _OUTSIDE:
            self.still(False, None, seconds)
        if where == _OUTSIDE:  # the host's own time: its compute (work, the goodput's input), or parked (idle)
            # In one of Python's own waits (time.sleep, select: a thread just woken from one
            # may still wait for a CPU), or asleep now and hardly on a CPU since the last look:
            # parked.  (A thread that computes in Python sleeps too, for a moment, while this
            # look holds the GIL: its CPU since the last look says it computed.)
            parked = self.calls_wait(innermost) or (computed < COMPUTED * seconds and self.running() is False)
            part = "idle" if parked else "work"
            self.still(parked, innermost, seconds)
            self.parts[part] += seconds
            if self.host_at is not None:
                sites = self.host_sites[part]
                if len(sites) > 4096:
                    sites.clear()
                sites[self.host_at] = sites.get(self.host_at, 0.0) + seconds
            if self.device is not None:
                self.probed(now, part, seconds, innermost.f_code if innermost is not None else None)
        elif where == _COMPILER:
            self.parts["compile"] += seconds
        elif where == _STARTING:  # start-up: the account's clock moves past it
            self.start += seconds
            self.began += seconds
        else:
            ran = seconds if self.alone else min(seconds, wanted)
            self.parts["programs"] += ran
            self.parts["waiting"] += seconds - ran
        if waits is not None:
            self.wait.judge(waits, where == _INSIDE and self.at is not None, self.at, wanted, seconds, now)

    def still(self, parked: bool, innermost, seconds: float) -> None:
        """Whether the main thread stands parked where it stood at the last
        look: the looks slow down once every look has found it so for
        ``STILL_SLOW`` (not while the device's probe last said "busy"), and
        come every ``TICK`` again at the first look that finds it elsewhere
        or not parked.  Parked is the account's own rule (in one of Python's
        waits, or hardly on a CPU), so a thread that wakes now and then to
        wait again (a queue's consumer, a sleep in a loop) stays still; the
        looks sample it as often as the time is split, each at most
        ``STILL_TICK`` of a thread that woke put where the next look finds it."""
        at = (innermost.f_code, innermost.f_lasti) if parked and innermost is not None else None
        self.still_for = self.still_for + seconds if at is not None and at == self.still_at else 0.0
        self.still_at = at
        slow = self.still_for >= STILL_SLOW and self.device_busy is not True
        self.pause = STILL_TICK if slow else TICK

    def probed(self, now: float, part: str, seconds: float, code=None) -> None:
        """The device's answer for the main thread's time outside JAX up to the
        instant it was asked: where the device was busy (it ran programs the
        script dispatched before: a loop that waits every N steps, or never),
        that time is the devices' (``programs``), which the host's ran under.
        This look's ``seconds`` (given to ``part``) wait for the next answer.
        Asked only at the second look in a row outside JAX: a stage of the
        host's, not a moment between two calls into JAX (the script's start,
        which compiles one small program after another: the probe's own
        compile beside those cost the TPU host's script about 1 s of compile),
        and asked with the code the main thread runs (``code``): a probe is
        sent only while the main thread still runs it (``backlog.Backlog.sample``)."""
        busy = self.device.verdict()
        if busy is not None:
            self.device_busy = busy
            if busy:
                moved = self.unanswered["work"] + self.unanswered["idle"]
                self.parts["work"] -= self.unanswered["work"]
                self.parts["idle"] -= self.unanswered["idle"]
                self.parts["programs"] += moved
            self.unanswered = {"work": 0.0, "idle": 0.0}
        self.unanswered[part] += seconds
        self.parked_for = self.parked_for + seconds if part == "idle" else 0.0
        if self.device_busy is False and self.parked_for > PARKED_QUIET:
            return  # parked, the device idle since: the main thread dispatches nothing (a stalled job stays still)
        if now >= self.next_ask and self.outside_looks >= 2:
            self.next_ask = now + backlog.PERIOD * random.uniform(0.5, 1.5)
            self.device.ask(code)

    def split(self) -> contract.TimeSplit:
        p = self.parts
        return contract.TimeSplit(self.began, self.last_time - self.start, p["work"], p["programs"],
                                  p["waiting"], p["compile"], p["idle"])

    def most_at(self, part: str) -> tuple[str, float] | None:
        """The script's line where the host spent most of ``part`` (``work``
        or ``idle``), as ``FILE:LINE in FUNCTION``, and its seconds."""
        sites = self.host_sites[part]
        if not sites:
            return None
        (code, line), spent = max(sites.items(), key=lambda item: item[1])
        return f"{os.path.basename(code.co_filename)}:{line} in {code.co_name}", spent

    def due(self) -> bool:
        if self.last_time < self.next_tell:
            return False
        self.gap = min(EVERY, self.gap * 2)
        self.next_tell = self.last_time + self.gap
        return True

    def tick(self) -> bool:
        """One look, and the split home where it is due; False once the account is over."""
        with self.lock:
            if self.finished:
                return False
            try:
                self.look()
                if self.due():
                    self.tell(self.split().line())
            except Exception:  # noqa: BLE001 - an account that fails is no failure of the job's
                self.finished = True
                return False
            return True

    def run(self) -> None:
        """On a thread of its own (a bench's way; a process's runs on ``sampler.shared``)."""
        while True:
            time.sleep(self.pause)
            if not self.tick():
                return

    def finish(self) -> None:
        """The script returned: the last look, and the last record."""
        with self.lock:
            if self.finished:
                return
            self.finished = True
            try:
                self.look()
                self.tell(self.split().line())
                marks.host_places(self.most_at("work"), self.most_at("idle"))
            except Exception:  # noqa: BLE001 - as in run
                pass


def _tell(line: str) -> None:
    """Beside the sampler's state where it runs; else the file holds the TIME line alone."""
    watchdog = activity.started
    if watchdog is not None:
        watchdog.tell(line)
        return
    path = os.environ.get(contract.ACTIVITY_FILE)
    if path:
        try:
            contract.write_private(path, line.encode() + b"\n")
        except OSError:
            pass


def wanted(environ=os.environ) -> bool:
    """Whether the launcher wants an account: where the activity file is
    named (the account's lines go beside the watchdog's), unless ``--no-account``."""
    return bool(environ.get(contract.ACTIVITY_FILE)) and environ.get(contract.ACCOUNT) != contract.ACCOUNT_OFF


def joined(environ=os.environ) -> None:
    """The process joined the job: its account begins, where one is wanted."""
    global _started
    if _started is not None or not wanted(environ):
        return
    _started = Accountant(_tell, alone=environ.get(contract.NUM_PROCESSES) == "1", device=backlog.start())
    sampler.shared.add_account(_started)


def script_returned() -> None:
    backlog.stop()
    if _started is not None:
        _started.finish()
