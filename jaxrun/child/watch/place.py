"""Where a process's main thread stands, as the stall watchdog
(``child.watch.activity``) and the time account (``child.watch.accounting``)
read it at the one sampler's looks (``child.watch.sampler``): its stack as
(code, instruction) pairs, compared look to look, and whether it is inside
JAX (a compile, a join, a program executing or awaited).

The one list of JAX's files and waits both read is here, and the one
reader of a call site's bytecode (what a parked frame calls).  The watchdog
also asks whether the main thread is parked in a wait of Python's own
(``parked_in_python``): the evidence that a wait every process shares is no
program of JAX's running on an accelerator."""

from __future__ import annotations

import _signal as signal  # not signal's enums: contract.STOP_SIGNALS says why
import builtins
import opcode
import os
import select
import sys
import threading
import time
import types

from jaxrun.child.watch import dumps

# Frames of JAX's that are work, or a wait that JAX bounds itself.
COMPILER_FILES = (os.sep + os.path.join("jax", "_src", "compiler.py"),)
JOIN_FILE = os.sep + os.path.join("jax", "_src", "distributed.py")
# Where the main thread is inside JAX: a program executing or awaited.
JAX_FOLDERS = (os.sep + os.path.join("jax", "_src") + os.sep, os.sep + "jaxlib" + os.sep)
# Calls of jaxlib's that wait for a program and have no Python frame of their own.
JAX_WAITS = frozenset({"block_until_ready"})
# The runtime's start: JAX making its first backend (finding its plugins, opening the
# devices: about 10 s on a TPU host), which a script's first JAX call runs, often
# inside a trace or a compile.  It is start-up, neither the script's compile nor its work.
RUNTIME_FILE = os.sep + os.path.join("jax", "_src", "xla_bridge.py")
RUNTIME_STARTS = frozenset({"_init_backend", "_discover_and_register_pjrt_plugins"})
# Where a code object stands: the script's own (or any code outside JAX), JAX's,
# JAX's compiler, the runtime's start (the greater wins on one stack).
OUTSIDE, INSIDE, COMPILER, STARTING = 0, 1, 2, 3


def code_place(code) -> int:
    name = code.co_filename
    if name.endswith(RUNTIME_FILE) and code.co_name in RUNTIME_STARTS:
        return STARTING
    if name.endswith(COMPILER_FILES):
        return COMPILER
    if JAX_FOLDERS[0] in name or JAX_FOLDERS[1] in name:
        return INSIDE
    return OUTSIDE


def main_stack(main: int, frames=sys._current_frames) -> tuple:
    """The main thread's frames as (code, instruction) pairs, innermost
    first: a loop on one line moves its instruction, a parked call does not.

    jaxrun's signal handler (``dumps.HANDLER``) and what it calls are left
    out: each dump a stall's probe asked for looked like the script moving.
    The walk reads another thread's frames while that thread runs on, which
    CPython does not promise to be safe: once, a frame's ``f_back`` was a
    str (Python 3.11, a controller over SSH on a loaded machine), and the
    exception ended the sampler.  The walk stops at anything not a frame."""
    frame = frames().get(main)
    stack = []
    while isinstance(frame, types.FrameType):
        if frame.f_code is dumps.HANDLER:
            stack.clear()
        else:
            stack.append((frame.f_code, call_offset(frame.f_code, frame.f_lasti)))
        frame = frame.f_back
    return tuple(stack)


_PRECALL, CACHE = opcode.opmap.get("PRECALL"), opcode.opmap.get("CACHE", 0)  # PRECALL: Python 3.11 only


def call_offset(code, offset: int) -> int:
    """The instruction a frame is at, read as its call where it is inside one.

    Python 3.11 splits a call into PRECALL and CALL, and its specializing
    interpreter, once a code object has warmed up (about eight jumps back
    of its loops), makes a builtin's call from the PRECALL itself: a frame
    parked in ``while True: time.sleep(1)`` moves from the CALL's offset to
    the PRECALL's a few seconds after it parked, without a step of its own.
    The sampler took that once for progress (issue 59: every CPU-shaped stall
    found a quarter-timeout late).  A PRECALL's offset is read as the CALL
    that follows it (after its inline caches)."""
    if _PRECALL is None:
        return offset
    raw = code.co_code  # 3.11 keeps it (the code before specializing), so this costs no copy
    if offset >= len(raw) or raw[offset] != _PRECALL:
        return offset
    after = offset + 2
    while after < len(raw) and raw[after] == CACHE:
        after += 2
    return after


def busy_place(stack: tuple) -> bool:
    """Inside JAX's compiler, the runtime's start, or JAX's ``initialize()``
    (waiting for the others to join): each bounded by JAX itself."""
    for code, _ in stack:
        name = code.co_filename
        if code_place(code) >= COMPILER or (name.endswith(JOIN_FILE) and code.co_name == "initialize"):
            return True
    return False


def inside_jax(stack: tuple) -> bool:
    """The main thread is in JAX's code: whatever CPU the process uses is a
    program executing (or awaited), JAX's work.  Either a frame of JAX's
    Python, or a call from the script straight into JAX's native code that
    waits for a program: ``y.block_until_ready()`` (a method of jaxlib's,
    no Python frame of its own)."""
    if any(code_place(code) for code, _ in stack):
        return True
    return bool(stack) and called_name(*stack[0]) in JAX_WAITS


def called_name(code, offset: int) -> str | None:
    """The name of what the call at ``offset`` of ``code`` calls (the
    attribute's, for ``y.block_until_ready()``), as ``callee_recipe`` reads it."""
    recipe = callee_recipe(code, offset)
    return None if recipe is None else recipe[-1]


# Where a name a call site loads lives: True, the frame's own variables; False, its globals (and builtins).
_LOADS = {"LOAD_NAME": False, "LOAD_GLOBAL": False, "LOAD_FAST": True, "LOAD_DEREF": True}
_ATTRS = ("LOAD_ATTR", "LOAD_METHOD")
_CALLS = ("PRECALL", "CALL")
_recipes: dict[tuple, tuple | None] = {}


def callee_recipe(code, offset: int) -> tuple | None:
    """How to find what the call at ``offset`` calls: ``(own, name)`` for
    a name, ``(own, owner, attribute)`` for an attribute of a name (``own``:
    the name is one of the frame's own variables, else a global; an
    attribute of anything else, ``f(x).block_until_ready()``, is
    ``(True, None, attribute)``), None for anything else (or no call there).  Read from the bytecode once per
    call site: back from the call over its arguments (by their stack
    effects) to the instruction that pushed the callable."""
    key = (code, offset)
    if key in _recipes:
        return _recipes[key]
    import dis  # here: once per call site, in the sampler's thread

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
                elif last.opname in _ATTRS:  # of what a call or an expression made: never read
                    found = (True, None, last.argval)
    except (ValueError, TypeError, IndexError):
        found = None
    if len(_recipes) > 4096:
        _recipes.clear()
    _recipes[key] = found
    return found


def site_offset(code, lasti: int) -> int:
    """The call a frame stands at: a PRECALL read as its CALL
    (``call_offset``), and the last inline cache of a CALL (where 3.11
    leaves a frame that called a Python function) as the CALL itself."""
    offset = call_offset(code, lasti)
    raw = code.co_code
    while 0 < offset < len(raw) and raw[offset] == CACHE:
        offset -= 2
    return offset


# The standard library's own code (not what is installed beside it): a
# main thread whose innermost frame is there waits in Python's own
# primitives (a queue, an event, a lock, a subprocess, a selector).
STDLIB = os.path.dirname(os.__file__) + os.sep
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
# Python's own blocking calls, by identity: the script's frame parked in one
# of them waits on something other than JAX.
_PYTHON_WAITS = frozenset(id(f) for f in (time.sleep, select.select, builtins.input, getattr(os, "waitpid", None),
                                          getattr(os, "wait", None), getattr(signal, "pause", None)) if f)
_OWN_THREADS = "jaxrun-"


def is_stdlib(filename: str) -> bool:
    return filename.startswith(STDLIB) and not any(part in filename for part in _INSTALLED)


_JAXRUN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def is_scripts(filename: str) -> bool:
    """Whether a frame's file is the script's own code: not the standard
    library's, not an installed package's (numpy, JAX), not jaxrun's, not
    Python's frozen modules.  The account names the line where the host
    spends its time by the innermost such frame (``train.py:40 in next_batch``)."""
    if filename.startswith(("<frozen", _JAXRUN)) or any(part in filename for part in _INSTALLED):
        return False
    return not filename.startswith(STDLIB)


def parked_in_python(main: int, frames=sys._current_frames) -> bool:
    """Whether the main thread (``main``: its ident) waits in a wait of
    Python's own, outside JAX, while no other thread of the script's is
    inside JAX: its innermost frame is the standard library's (a queue's
    ``get``, an event's ``wait``, a subprocess), or the script's own frame
    calls one of Python's blocking calls (``time.sleep``, ``select``,
    ``input``, ...) by a global name.

    Only then is a process with no CPU and no I/O known to wait on no
    program: one running on an accelerator leaves the CPU idle while the
    main thread waits inside JAX, or in a call into jaxlib's native code
    with no Python frame (``np.asarray(y)``, ``y.block_until_ready()``),
    and a program another thread of the script's runs makes that thread
    JAX's.  Anything else (a native library's wait, a call this cannot
    name) is not known to be parked.  Reads frames and dicts only: no code
    of the script's runs here."""
    current = frames()
    stack = _frames(current.get(main))
    if not stack or any(code_place(f.f_code) != OUTSIDE for f in stack):
        return False
    own = {t.ident for t in threading.enumerate() if t.name.startswith(_OWN_THREADS)}
    for ident, frame in current.items():
        if ident != main and ident not in own and any(code_place(f.f_code) != OUTSIDE for f in _frames(frame)):
            return False  # another thread of the script's is inside JAX: its program, perhaps
    return is_stdlib(stack[0].f_code.co_filename) or calls_python_wait(stack[0])


def calls_python_wait(frame) -> bool:
    """Whether the script's ``frame`` stands at a call of one of Python's
    blocking calls (``time.sleep``, ``select``, ``input``, ...) by a global
    name or a module's attribute (a local's is not read from another thread)."""
    code = frame.f_code
    recipe = callee_recipe(code, site_offset(code, frame.f_lasti))
    if recipe is None or recipe[0]:
        return False
    found = frame.f_globals.get(recipe[1], _MISSING)
    if found is _MISSING and len(recipe) == 2:
        found = vars(builtins).get(recipe[1], _MISSING)
    if len(recipe) == 3:
        found = vars(found).get(recipe[2], _MISSING) if isinstance(found, types.ModuleType) else _MISSING
    return id(found) in _PYTHON_WAITS


_MISSING = object()


def _frames(frame) -> list:
    """A thread's frames, innermost first, those of jaxrun's dump handler
    and what it called left out (as ``main_stack`` does); it stops at
    anything not a frame."""
    found = []
    while isinstance(frame, types.FrameType):
        if frame.f_code is dumps.HANDLER:
            found.clear()
        else:
            found.append(frame)
        frame = frame.f_back
    return found
