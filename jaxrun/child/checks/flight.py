"""Child side: which compiled programs this process ran (``--flight-recorder``),
and whether every process runs the same ones (``--check-divergence``).

Processes that run different programs, or the same ones in another order,
match each other's collectives wrongly or wait for each other forever; a
stack dump shows where each one waits, not which program it ran last or
where the processes parted.  So, while a mode is on, every execution of a
compiled program passes through this module first:

- the flight recorder keeps the last K executions (function, program
  fingerprint, inputs, the user's line that made the call) in a ring, and
  writes them into stderr right after each stack dump on SIGUSR1
  (``--timeout``, fail-fast, ``kill -USR1 JAXRUN_PID``), in
  ``contract.flight_block``'s format, for the launcher's summary;
- the strict check has the processes agree on each program that spans
  processes, through the coordination service's key-value store, before it
  runs; the first process that differs stops the job, naming the call.

The hook.  JAX runs a cached jitted call in C++ (``_jax.pjit``'s fast path),
which Python never sees.  C++ takes that path only for a call whose first run
handed it a ``MeshExecutableFastpathData``, and that is built in two places:
``pjit._get_fastpath_data`` (``jax.jit``, and every eager operation, which jax
runs as a jitted primitive) and ``MeshExecutable.create_cpp_call`` (an
ahead-of-time ``Compiled``).  With both saying "no fast path", every execution
takes JAX's Python path, and that path ends in one method that only executes:
``pxla.ExecuteReplicated.__call__``.  That method is the hook; it sees
exactly the executions, never a trace or a compilation.  The price is JAX's
Python dispatch on every call (bench/divergence.py measures it).  With both
modes off, this module patches nothing.

On a jax without these three names the flag stops the process with one line
naming the version, before the script runs any program.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import threading
import weakref

from jaxrun import contract
from jaxrun.child import ending, hooks
from jaxrun.child.checks.divergence import Checker
from jaxrun.child.checks.flight_text import fingerprint, function_name, input_text, spans_processes
from jaxrun.child.watch import backlog, dumps

# The jax versions these hooks were read in and tested with: 0.10.2 (what pip
# gives Python 3.11 here) by the test suite, 0.12.0.1 (Python 3.13) by hand.
TESTED_JAX = ("0.10.2", "0.12.0.1")
# (module, attribute path) of every name the hook replaces.
HOOK_POINTS = (
    ("jax._src.pjit", "_get_fastpath_data"),
    ("jax._src.interpreters.pxla", "MeshExecutable.create_cpp_call"),
    ("jax._src.interpreters.pxla", "ExecuteReplicated.__call__"),
)


@dataclasses.dataclass
class Program:
    """What one compiled program is, worked out at its first execution."""

    function: str
    fingerprint: str
    inputs: str
    spans: bool  # its devices belong to more than this process
    # This process's executions of ``function``, shared by every program of
    # that name (one function compiled for several input shapes).
    runs: list = dataclasses.field(default_factory=lambda: [0])


_flight: Flight | None = None


def prepare(environ, rank: int, count: int) -> None:
    """Install the hook if a mode is on; no jax import (it patches jax when
    the script imports it, or now if a preloading server already did)."""
    global _flight
    depth_text = environ.get(contract.FLIGHT_RECORDER, "")
    check = environ.get(contract.CHECK_DIVERGENCE) == "1" and count > 1  # alone, nothing to agree with
    if not depth_text and not check:
        return
    depth = 0
    if depth_text:
        try:
            depth = int(depth_text)
        except ValueError:
            depth = 0
        if not 1 <= depth <= contract.FLIGHT_RECORDER_MAX:
            ending.fail(ValueError(f"{contract.FLIGHT_RECORDER}={depth_text!r}: "
                                   f"not a count from 1 to {contract.FLIGHT_RECORDER_MAX}"))
    _flight = Flight(rank, count, depth, Checker(rank, count) if check else None)
    _flight.flags = " and ".join(f for f, on in (("--flight-recorder", depth), ("--check-divergence", check)) if on)
    if depth:
        _flight.listen_for_dumps()
    hooks.after_import("jax", _install)


def script_returned() -> None:
    """The shim's word that the script has returned (the process may still
    wait in JAX's shutdown for its peers)."""
    if _flight is not None:
        _flight.script_returned()


# -- the hook --------------------------------------------------------------------------

def missing_hook_points(modules) -> list[str]:
    """The HOOK_POINTS not found among ``modules`` (a name -> module mapping)."""
    missing = []
    for module_name, path in HOOK_POINTS:
        target = modules.get(module_name)
        for part in path.split("."):
            target = getattr(target, part, None)
        if not callable(target):
            missing.append(f"{module_name}.{path}")
    return missing


def _install(jax_module) -> None:
    flight = _flight
    missing = missing_hook_points(sys.modules)
    if missing:
        version = getattr(jax_module, "__version__", "of unknown version")
        ending.fail(RuntimeError(
            f"{flight.flags} cannot hook jax {version}: {', '.join(missing)} not found "
            f"(tested with jax {', '.join(TESTED_JAX)}); run without it"))
    pjit = sys.modules["jax._src.pjit"]
    pxla = sys.modules["jax._src.interpreters.pxla"]
    flight.describe_paths(jax_module)
    traceback_util = sys.modules.get("jax._src.traceback_util")
    if hasattr(traceback_util, "register_exclusion"):
        traceback_util.register_exclusion(__file__)  # JAX hides this frame as it hides its own
    real = pxla.ExecuteReplicated.__call__
    before = flight.before_execution  # looked up once: this runs on every execution

    def __call__(self, *args):
        before(self, args)
        return real(self, *args)

    pjit._get_fastpath_data = _no_fast_path
    pxla.MeshExecutable.create_cpp_call = _no_cpp_call
    pxla.ExecuteReplicated.__call__ = __call__


def _no_fast_path(*args, **kwargs):
    """No ``MeshExecutableFastpathData``: C++ hands every call back to Python."""
    return None


def _no_cpp_call(self, params):
    """A ``Compiled`` then calls through ``MeshExecutable.call`` every time."""
    return None


# -- describing an execution ---------------------------------------------------------------

_SKIP, _LIBRARY, _USER = 0, 1, 2


class Flight:
    """This process's executions: the ring, the counters, the dump.

    ``before_execution`` runs before every execution, on the dispatch path, so
    it only counts and keeps references: a program's name, fingerprint and
    inputs are worked out once per program, the caller's frame is classified
    once per code object, and the lines are written only on a dump."""

    def __init__(self, rank: int, count: int, depth: int, checker: Checker | None):
        self.rank, self.count = rank, count
        # A deque with a bound is a ring kept in C: appending costs no more than
        # a list store, and ``list(ring)`` copies it under the GIL in one go.
        self.ring: collections.deque | None = collections.deque(maxlen=depth) if depth else None
        self.checker = checker
        self.flags = ""
        self.runs = 0  # every execution
        self.calls = 0  # executions that span processes
        self.counters: dict[str, list] = {}  # function -> [its executions], shared by its programs
        # id(executable) -> (weak reference, Program).  Weakly: an executable
        # jax's caches let go of must not live on here, and its entry goes
        # with it.  By id: a lookup then costs no weak reference of its own.
        self.programs: dict[int, tuple[weakref.ref, Program]] = {}
        # id(code object) -> _SKIP/_LIBRARY/_USER.  By id: hashing a code
        # object hashes its bytecode and constants every time, nested code
        # objects included, which made JAX's long dispatch functions cost
        # microseconds each.  ``codes`` keeps each one alive, so no id is reused.
        self.kinds: dict[int, int] = {}
        self.codes: list = []
        self.returned = False
        self.skip_dirs: tuple[str, ...] = ()
        self.stdlib = ""

    def describe_paths(self, jax_module) -> None:
        """Which files are JAX's, jaxrun's or the standard library's: never the user's frame."""
        import sysconfig

        from jaxrun.child import JAXRUN_FOLDER

        dirs = [JAXRUN_FOLDER]
        for name in ("jax", "jaxlib"):
            module = jax_module if name == "jax" else sys.modules.get(name)
            if getattr(module, "__file__", None):
                dirs.append(os.path.dirname(os.path.abspath(module.__file__)))
        self.skip_dirs = tuple(d + os.sep for d in dirs)
        self.stdlib = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep

    def kind(self, filename: str) -> int:
        if filename.startswith("<") or filename.startswith(self.skip_dirs):
            return _SKIP
        if os.sep + "site-packages" + os.sep in filename or os.sep + "dist-packages" + os.sep in filename:
            return _LIBRARY
        if self.stdlib and filename.startswith(self.stdlib):
            return _SKIP
        return _USER

    def user_frame(self, frame) -> tuple[str, int]:
        """The innermost frame of the user's own code; else of any library but
        JAX; else ("?", 0).  Each code object is classified once; after that a
        frame costs one dictionary lookup by id, and the walk stops at the
        first user frame (a few of JAX's dispatch frames up)."""
        fallback = None
        kinds = self.kinds
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(id(code))
            if kind is None:
                self.codes.append(code)
                kind = kinds[id(code)] = self.kind(code.co_filename)
            if kind == _USER:
                return code.co_filename, frame.f_lineno
            if kind == _LIBRARY and fallback is None:
                fallback = (code.co_filename, frame.f_lineno)
            frame = frame.f_back
        return fallback or ("?", 0)

    def program(self, executable, args) -> Program:
        found = self.programs.get(id(executable))
        if found is not None and found[0]() is executable:
            return found[1]
        name = function_name(getattr(executable, "name", ""))
        program = Program(name, fingerprint(getattr(executable, "xla_executable", None)), input_text(args),
                          self.count > 1 and spans_processes(executable), self.counters.setdefault(name, [0]))
        programs, key = self.programs, id(executable)

        def forget(ref, key=key):
            if programs.get(key, (None,))[0] is ref:
                del programs[key]

        programs[key] = (weakref.ref(executable, forget), program)
        return program

    def before_execution(self, executable, args) -> None:
        found = self.programs.get(id(executable))
        program = found[1] if found is not None and found[0]() is executable else self.program(executable, args)
        if program.function == backlog.PROGRAM:
            return  # the account's probe of its device (child.watch.backlog): no run of the script's
        self.runs += 1
        counter = program.runs
        counter[0] += 1
        call = None
        if program.spans:
            self.calls += 1
            call = self.calls
        file, line = self.user_frame(sys._getframe(2))
        if self.ring is not None:
            self.ring.append((self.runs, call, program, counter[0], file, line))
        if self.checker is not None and call is not None:
            self.checker.agree(call, program, counter[0], file, line)

    def script_returned(self) -> None:
        self.returned = True
        if self.checker is not None:
            self.checker.script_returned(self.calls)

    # -- the block ---------------------------------------------------------------------

    def state(self) -> str:
        if not self.returned:
            return contract.IN_SCRIPT
        frame = sys._current_frames().get(threading.main_thread().ident)
        shutdown = os.path.join("jax", "_src", "distributed.py")
        settle = os.path.join("jaxrun", "child", "agreement.py")
        while frame is not None:
            code = frame.f_code
            if code.co_filename.endswith(shutdown) or (code.co_name == "settle" and code.co_filename.endswith(settle)):
                return contract.IN_SHUTDOWN  # JAX's shutdown, or the checks' wait for their peers just before it
            frame = frame.f_back
        return contract.SCRIPT_RETURNED

    def block(self) -> str:
        entries = [contract.FlightEntry(seq, call, p.function, occurrence, p.fingerprint, p.inputs, file, line)
                   for seq, call, p, occurrence, file, line in list(self.ring)]
        return contract.flight_block(self.rank, self.runs, self.state(), entries)

    def write_block(self) -> None:
        """Straight to fd 2 (``dumps.write``): the main thread may hold
        sys.stderr's lock, blocked in a collective."""
        dumps.write(self.block())

    def listen_for_dumps(self) -> None:
        """Write the block after each stack dump on SIGUSR1 (``dumps``)."""
        dumps.after_each(self.write_block)
