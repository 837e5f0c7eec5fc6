"""Where a process's main thread stands, as the stall watchdog's sampler
(``child.watch.activity``) and the time account (``child.watch.accounting``) read it:
its stack as (code, instruction) pairs, compared look to look, and whether
it is inside JAX (a compile, a join, a program executing or awaited)."""

from __future__ import annotations

import opcode
import os
import sys
import types

from jaxrun.child.watch import dumps

# Frames of JAX's that are work, or a wait that JAX bounds itself.
COMPILER_FILES = (os.sep + os.path.join("jax", "_src", "compiler.py"),)
JOIN_FILE = os.sep + os.path.join("jax", "_src", "distributed.py")
# Where the main thread is inside JAX: a program executing or awaited.
JAX_FOLDERS = (os.sep + os.path.join("jax", "_src") + os.sep, os.sep + "jaxlib" + os.sep)


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
    """Inside JAX's compiler, or in its ``initialize()`` (waiting for the others to join)."""
    for code, _ in stack:
        name = code.co_filename
        if name.endswith(COMPILER_FILES) or (name.endswith(JOIN_FILE) and code.co_name == "initialize"):
            return True
    return False


def inside_jax(stack: tuple) -> bool:
    """The main thread is in JAX's code: whatever CPU the process uses is a
    program executing (or awaited), JAX's work.  Either a frame of JAX's
    Python, or a call from the script straight into JAX's native code that
    waits for a program: ``y.block_until_ready()`` (a method of jaxlib's,
    no Python frame of its own)."""
    if any(JAX_FOLDERS[0] in code.co_filename or JAX_FOLDERS[1] in code.co_filename for code, _ in stack):
        return True
    return bool(stack) and called_name(*stack[0]) in JAX_WAITS


JAX_WAITS = frozenset({"block_until_ready"})
_called: dict[tuple, str | None] = {}


def called_name(code, offset: int) -> str | None:
    """The name of what the instruction at ``offset`` of ``code`` calls, as
    its last load of a name or an attribute before it says (a parked frame's
    instruction is its call)."""
    key = (code, offset)
    if key not in _called:
        import dis  # here: the sampler's thread pays for it, once a native call held it

        name = None
        for instruction in dis.get_instructions(code):
            if instruction.offset >= offset:
                break
            if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST"):
                name = instruction.argval
        if len(_called) > 1024:
            _called.clear()
        _called[key] = name
    return _called[key]
