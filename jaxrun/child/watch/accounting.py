"""Where this process's time goes, from its join on: its own work, its
programs, and its waits for the other processes (on unless ``--no-account``).

A thread of the shim's looks at the main thread every ``TICK`` seconds and
gives the time since its last look to one part of a ``contract.TimeSplit``:

- ``work``: the main thread is outside JAX (the script's own Python, its
  input pipeline, numpy, a sleep of its own);
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

Each look costs a walk of the main thread's frames (each code object is
judged once, then looked up), one CPU clock read, the main thread's
``schedstat`` and the CPU group's ``cpu.stat``:
``bench/account.py`` measures it against the same job with the account off.
The cumulative split goes to the launcher beside the activity line
(``contract.read_activity_file``): ``FIRST_EVERY`` seconds after the join,
then at twice the last gap up to ``EVERY``, and when the script returns; what
the launcher makes of it (who the others wait for) is in
``launcher/attempt/straggler.py``.  docs/time.md says what each part is
computed from on GPU and TPU.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from jaxrun import contract, portable
from jaxrun.child.watch import activity, place

TICK = 0.02  # seconds between looks
FIRST_EVERY = 2.0  # the first record, then 4 and 8 s after it ...
EVERY = 10.0  # ... and every 10 s
_OUTSIDE, _INSIDE, _COMPILER = 0, 1, 2

_started: Accountant | None = None
_wanted = False  # the launcher asked for an account: it begins at the join


def _code_place(code) -> int:
    name = code.co_filename
    if name.endswith(place.COMPILER_FILES):
        return _COMPILER
    if place.JAX_FOLDERS[0] in name or place.JAX_FOLDERS[1] in name:
        return _INSIDE
    return _OUTSIDE


# Where a name a call site loads lives: True, the frame's own variables; False, its globals (and builtins).
_LOADS = {"LOAD_NAME": False, "LOAD_GLOBAL": False, "LOAD_FAST": True, "LOAD_DEREF": True}
_ATTRS = ("LOAD_ATTR", "LOAD_METHOD")
_CALLS = ("PRECALL", "CALL")
_recipes: dict[tuple, tuple | None] = {}


def callee_recipe(code, offset: int) -> tuple | None:
    """How to find what the call at ``offset`` calls: ``(own, name)`` for
    a name, ``(own, owner, attribute)`` for an attribute of a name (``own``:
    the name is one of the frame's own variables, else a global), None
    for anything else (or no call there).  Read from the bytecode once per
    call site: back from the call over its arguments (by their stack
    effects) to the instruction that pushed the callable."""
    key = (code, offset)
    if key in _recipes:
        return _recipes[key]
    import dis  # here: once per call site, in the accountant's thread

    found = None
    try:
        ins = [i for i in dis.get_instructions(code) if i.offset <= offset]
        at = len(ins) - 1
        while at >= 0 and ins[at].opname in (*_CALLS, "KW_NAMES", "CACHE"):
            at -= 1
        if ins and ins[-1].opname in _CALLS and ins[-1].arg is not None:
            pushed, needed = 0, ins[-1].arg
            while at >= 0 and pushed < needed:
                pushed += dis.stack_effect(ins[at].opcode, ins[at].arg if ins[at].opcode >= dis.HAVE_ARGUMENT else None)
                at -= 1
            if at >= 0 and pushed == needed:
                last = ins[at]
                if last.opname in _LOADS:
                    found = (_LOADS[last.opname], last.argval)
                elif last.opname in _ATTRS and at > 0 and ins[at - 1].opname in _LOADS:
                    found = (_LOADS[ins[at - 1].opname], ins[at - 1].argval, last.argval)
    except (ValueError, TypeError, IndexError):
        found = None
    if len(_recipes) > 4096:
        _recipes.clear()
    _recipes[key] = found
    return found


def _is_jax(value) -> bool:
    return (getattr(type(value), "__module__", None) or "").startswith(("jax.", "jaxlib."))


def site_offset(code, lasti: int) -> int:
    """The call a frame stands at: a PRECALL read as its CALL
    (``place.call_offset``), and the last inline cache of a CALL (where
    3.11 leaves a frame that called a Python function) as the CALL itself."""
    offset = place.call_offset(code, lasti)
    raw = code.co_code
    while 0 < offset < len(raw) and raw[offset] == place.CACHE:
        offset -= 2
    return offset


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
    offset = site_offset(code, frame.f_lasti)
    if (code, offset) in sites:
        return True
    recipe = callee_recipe(code, offset)
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
                 cpu=activity.others_cpu, delay=None, frames=sys._current_frames):
        self.tell = tell  # called with each TIME line
        self.main = threading.main_thread().ident if main is None else main
        main_tid = portable.main_native_id()
        self.clock, self.cpu, self.frames = clock, cpu, frames
        throttled, main_delay = portable.Throttling(), portable.RunDelay(main_tid)
        self.delay = delay or (lambda: main_delay() + throttled())
        self.places: dict[object, int] = {}  # code object -> _OUTSIDE, _INSIDE or _COMPILER
        self.sites: set[tuple[object, int]] = set()  # (code, offset): the script's calls seen going into JAX
        self.parts = {"work": 0.0, "programs": 0.0, "waiting": 0.0, "compile": 0.0}
        self.began = wall()
        self.start = self.last_time = clock()
        self.last_cpu, self.last_delay = cpu(), self.delay()
        self.next_tell, self.gap = self.start + FIRST_EVERY, FIRST_EVERY
        self.lock = threading.Lock()
        self.finished = False

    def place(self) -> int:
        """Where the main thread is now: outside JAX, inside it, or in its
        compiler.  A frame of the script's that called into JAX (the frame
        below JAX's outermost) is a call site of JAX's, kept in ``sites``."""
        frame = self.frames().get(self.main)
        innermost, where, inner = frame, _OUTSIDE, _OUTSIDE
        places = self.places
        while frame is not None:
            code = frame.f_code
            found = places.get(code)
            if found is None:
                found = places[code] = _code_place(code)
            if found:
                where = max(where, found)
            elif inner:
                self.learn(code, frame.f_lasti)
            inner = found
            frame = frame.f_back
        if where == _OUTSIDE and innermost is not None and calls_jax(innermost, self.sites):
            return _INSIDE  # a jitted call's C++ path, y.block_until_ready(): jaxlib's, no frame of their own
        return where

    def learn(self, code, lasti: int) -> None:
        site = (code, site_offset(code, lasti))
        if site not in self.sites:
            if len(self.sites) > 4096:
                self.sites.clear()
            self.sites.add(site)

    def look(self) -> None:
        """Give the time since the last look to the part the main thread is in."""
        where = self.place()
        now, cpu, delay = self.clock(), self.cpu(), self.delay()
        seconds = max(0.0, now - self.last_time)
        wanted = max(0.0, cpu - self.last_cpu) + max(0.0, delay - self.last_delay)
        self.last_time, self.last_cpu, self.last_delay = now, cpu, delay
        if where == _OUTSIDE:
            self.parts["work"] += seconds
        elif where == _COMPILER:
            self.parts["compile"] += seconds
        else:
            ran = min(seconds, wanted)
            self.parts["programs"] += ran
            self.parts["waiting"] += seconds - ran

    def split(self) -> contract.TimeSplit:
        p = self.parts
        return contract.TimeSplit(self.began, self.last_time - self.start, p["work"], p["programs"],
                                  p["waiting"], p["compile"])

    def due(self) -> bool:
        if self.last_time < self.next_tell:
            return False
        self.gap = min(EVERY, self.gap * 2)
        self.next_tell = self.last_time + self.gap
        return True

    def run(self) -> None:
        while True:
            time.sleep(TICK)
            with self.lock:
                if self.finished:
                    return
                try:
                    self.look()
                    if self.due():
                        self.tell(self.split().line())
                except Exception:  # noqa: BLE001 - an account that fails is no failure of the job's
                    self.finished = True
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
            except Exception:  # noqa: BLE001 - as in run
                pass


def _tell(line: str) -> None:
    """Beside the sampler's state where it runs; else the file holds the TIME line alone."""
    sampler = activity.started
    if sampler is not None:
        sampler.tell(line)
        return
    path = os.environ.get(contract.ACTIVITY_FILE)
    if path:
        try:
            contract.write_private(path, line.encode() + b"\n")
        except OSError:
            pass


def start(environ=os.environ) -> None:
    """At the shim's start: whether the launcher wants an account (one
    begins at the join, ``joined``)."""
    global _wanted
    _wanted = bool(environ.get(contract.ACTIVITY_FILE)) and environ.get(contract.ACCOUNT) != contract.ACCOUNT_OFF


def joined() -> None:
    """The process joined the job: its account begins."""
    global _started
    if not _wanted or _started is not None:
        return
    _started = Accountant(_tell)
    threading.Thread(target=_started.run, name="jaxrun-account", daemon=True).start()


def script_returned() -> None:
    if _started is not None:
        _started.finish()
