"""What one execution is, as the flight recorder (``checks.flight``) writes
it and the divergence check compares it: the function's name, its inputs'
shapes, the compiled program's fingerprint, and whether it spans processes."""

from __future__ import annotations

import re

# An entry names at most this many inputs, then how many more there were.
MAX_INPUTS = 8
_JIT_NAME = re.compile(r"^(?:jit|pjit|pmap|xla_pmap)\((.*)\)$")
_DTYPE_WORDS = (("bfloat", "bf"), ("complex", "c"), ("float", "f"), ("uint", "u"), ("int", "i"))


def function_name(executable_name: str) -> str:
    """"jit(train_step)" -> "train_step", without spaces (the block is split on them)."""
    m = _JIT_NAME.match(executable_name or "")
    name = m[1] if m else executable_name
    return re.sub(r"\s+", "_", name) or "?"


def input_text(args) -> str:
    """"f32[8,4],i32[],+3": shapes and dtypes of the first MAX_INPUTS inputs."""
    parts = []
    for a in args[:MAX_INPUTS]:
        dtype, shape = getattr(a, "dtype", None), getattr(a, "shape", None)
        if dtype is None or shape is None:
            parts.append(type(a).__name__)  # a Python scalar
            continue
        name = str(dtype)
        for word, short in _DTYPE_WORDS:
            if name.startswith(word):
                name = short + name[len(word):]
                break
        parts.append(f"{name}[{','.join(map(str, shape))}]")
    if len(args) > MAX_INPUTS:
        parts.append(f"+{len(args) - MAX_INPUTS}")
    return ",".join(parts)


def fingerprint(xla_executable) -> str:
    """A short name for the compiled program, the same in every process that
    compiled the same program.  Taken from the optimized HLO printed without
    metadata: XLA's own ``fingerprint`` covers the source locations too, so
    one program called from another line, or a script at another path on
    another host, would look like a different program."""
    import hashlib

    try:
        options = _print_options().fingerprint()
        text = "\n".join(_NAMELESS.sub("HloModule", m.to_string(options), count=1)
                         for m in xla_executable.hlo_modules())
        raw = text.encode()
    except Exception:  # noqa: BLE001 - an older jaxlib: XLA's fingerprint, with its locations
        raw = getattr(xla_executable, "fingerprint", None)
        if not raw:
            return "?"
        if isinstance(raw, str):
            raw = raw.encode()
    return hashlib.blake2b(raw, digest_size=6).hexdigest()


def _print_options():
    """HloPrintOptions, wherever this jaxlib keeps it."""
    try:
        from jax._src.lib import hlo

        return hlo.HloPrintOptions
    except ImportError:
        from jax._src.lib import xla_client

        return xla_client._xla.HloPrintOptions


# The module's name (jit_train_step, perhaps with a suffix) is no part of the program.
_NAMELESS = re.compile(r"^HloModule \S+")


def spans_processes(executable) -> bool:
    """Whether the program's devices belong to more than this process: only
    such a program takes part in collectives that can hang or mismatch.
    Unknown counts as yes."""
    ins = getattr(getattr(executable, "in_handler", None), "in_shardings", None) or ()
    outs = getattr(getattr(executable, "out_handler", None), "out_shardings", None) or ()
    shardings = [*ins, *outs]
    if not shardings:
        return True
    return not all(getattr(s, "is_fully_addressable", False) is True for s in shardings)
