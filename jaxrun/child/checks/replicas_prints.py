"""What the replica check (:mod:`jaxrun.child.checks.replicas`) compares, and when.

- ``sampled(n)``: whether the n-th call at a call site is checked; it depends
  on ``n`` alone, so every process that shares a slice checks the same calls;
- ``site_of(frame)``: the call site, the first frame outside jax and jaxrun;
- ``layout_of(sharding, shape)``: which processes hold each slice (cached);
- fingerprints: ``host_print`` (``blake2b`` of host bytes), ``device_print``
  (a few numbers computed on the slice's own device, dispatched at once and
  read back only when the board's thread publishes the entry), and
  ``batch_print`` (this process's whole batch, or None for what is never
  flagged as suspiciously the same: constants, ranges along an axis, masks
  of zeros and ones, and other than floating or integer data).

Imported only once the script has imported jax.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os

import numpy as np

FIRST = 3  # the first calls at a site are all checked; then the n-th where n is a power of two


def sampled(n: int) -> bool:
    return n <= FIRST or n & (n - 1) == 0


def skipped_folders() -> tuple[str, tuple[str, ...]]:
    """(jax's internals, every folder whose frames are not the user's call site)."""
    import jax

    own = os.path.dirname(jax.__file__) + os.sep
    from jaxrun.child import JAXRUN_FOLDER

    ours = JAXRUN_FOLDER + os.sep
    return own + "_src" + os.sep, (own, ours)


def site_of(frame, skip: tuple[str, tuple[str, ...]]) -> tuple[str, str]:
    """(the call site as every host names it, ``file.py:line`` for messages)."""
    while frame.f_back is not None and frame.f_code.co_filename.startswith(skip[1]):
        frame = frame.f_back
    base = os.path.basename(frame.f_code.co_filename)
    return f"{base}:{frame.f_lineno}:{frame.f_code.co_name}", f"{base}:{frame.f_lineno}"


# --- slices -------------------------------------------------------------------------

def key_of(index, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """A slice of the global array as (start, stop) per dimension."""
    if index is None:
        return tuple((0, d) for d in shape)
    return tuple(s.indices(d)[:2] if isinstance(s, slice) else (int(s), int(s) + 1)
                 for s, d in zip(index, shape))


def key_text(key) -> str:
    return ",".join(f"{a}:{b}" for a, b in key) or "all"


def index_text(key) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in key) + "]"


@dataclasses.dataclass(frozen=True)
class SliceOwners:
    holders: dict  # slice key -> the processes holding it, sorted
    slices_of: dict  # process -> the slice keys it holds
    differs: bool  # the processes do not all hold the same slices


@functools.lru_cache(maxsize=256)
def layout_of(sharding, shape: tuple[int, ...]) -> SliceOwners:
    holders: dict = {}
    slices_of: dict = {}
    for device, index in sharding.devices_indices_map(shape).items():
        key = key_of(index, shape)
        holders.setdefault(key, set()).add(device.process_index)
        slices_of.setdefault(device.process_index, set()).add(key)
    frozen = {p: frozenset(keys) for p, keys in slices_of.items()}
    return SliceOwners({k: tuple(sorted(v)) for k, v in holders.items()}, frozen, len(set(frozen.values())) > 1)


# --- capturing what the callback returned -------------------------------------------

def capturing(args: tuple, kwargs: dict, captures: list):
    """``make_array_from_callback``'s arguments with its callback wrapped to
    keep each slice's value (by slice key) in a new dict appended to ``captures``."""
    args = list(args)
    if len(args) >= 3:
        callback = args[2]
    elif "data_callback" in kwargs:
        callback = kwargs["data_callback"]
    else:
        return tuple(args), kwargs
    shape = tuple(args[0] if args else kwargs["shape"])
    kept: dict = {}
    captures.append(kept)

    def data_callback(index):
        value = callback(index)
        kept[key_of(index, shape)] = value
        return value

    if len(args) >= 3:
        args[2] = data_callback
    else:
        kwargs = {**kwargs, "data_callback": data_callback}
    return tuple(args), kwargs


def on_device(value) -> bool:
    import jax

    return isinstance(value, jax.Array)


# --- fingerprints -------------------------------------------------------------------

def host_print(value) -> str:
    data = np.ascontiguousarray(value)
    digest = hashlib.blake2b(f"{data.dtype}{data.shape}".encode(), digest_size=12)
    digest.update(data.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def device_print(data, device: str):
    """A callable that gives the entry, or None for a dtype the checksum cannot read.
    The checksum is dispatched now (asynchronously); reading it back waits
    for it, on the board's thread."""
    if data.dtype.itemsize not in (1, 2, 4, 8, 16):
        return None
    sums = _checksum()(data)

    def entry() -> dict:
        numbers = np.asarray(sums)
        text = f"{data.dtype}{data.shape}" + ",".join(str(int(x)) for x in numbers.reshape(-1))
        return {"fp": hashlib.blake2b(text.encode(), digest_size=12).hexdigest(), "device": device}

    return entry


@functools.lru_cache(maxsize=1)
def _checksum():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def words(x):
        if jnp.issubdtype(x.dtype, jnp.complexfloating):
            x = jnp.stack([jnp.real(x), jnp.imag(x)])
        if x.dtype == jnp.bool_:
            return x.astype(jnp.uint32).reshape(-1)
        size = x.dtype.itemsize
        if size in (1, 2):
            return lax.bitcast_convert_type(x, jnp.uint8 if size == 1 else jnp.uint16).astype(jnp.uint32).reshape(-1)
        return lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)  # 8 bytes: a trailing pair

    @jax.jit
    def checksum(x):
        w = words(x)
        i = lax.iota(jnp.uint32, w.size)
        mixed = (w ^ (i * jnp.uint32(0x9E3779B1))) * jnp.uint32(0x85EBCA6B)
        mixed = mixed ^ (mixed >> 13)
        return jnp.stack([jnp.sum(w, dtype=jnp.uint32), jnp.sum(mixed, dtype=jnp.uint32),
                          jnp.sum(mixed * (i | jnp.uint32(1)), dtype=jnp.uint32)])

    return checksum


def group_entry(parts: dict):
    """The entry for slices shared by one group of processes: each slice's
    print (by its text) and one over them all; a callable when a print is
    still on its device (the board's thread calls it)."""

    def entry() -> dict:
        slices = {key_text(k): (p() if callable(p) else p) for k, p in sorted(parts.items())}
        digest = hashlib.blake2b(digest_size=12)
        for text, part in slices.items():
            digest.update(f"{text}={part['fp']};".encode())
        return {"fp": digest.hexdigest(), "slices": slices}

    return entry if any(callable(p) for p in parts.values()) else entry()


def batch_print(captured: dict, mine, hashed: dict) -> str | None:
    """This process's batch (its slices in order), or None when it is never
    flagged: not floating or integer, or every slice a constant, a range
    along an axis (position ids) or zeros and ones (masks).  ``hashed``:
    the slices' host prints already taken for the replica check."""
    import jax.numpy as jnp

    keys = [k for k in sorted(mine) if k in captured]
    values = [np.asarray(captured[k]) for k in keys]
    if not values or any(v.dtype == object for v in values):
        return None
    if not (jnp.issubdtype(values[0].dtype, jnp.floating) or jnp.issubdtype(values[0].dtype, jnp.integer)):
        return None
    if all(_never_flagged(v[tuple(slice(0, 4) for _ in v.shape)]) and _never_flagged(v) for v in values):
        return None
    digest = hashlib.blake2b(digest_size=12)
    for k, v in zip(keys, values):
        digest.update((hashed.get(k) or host_print(v)).encode())
    return digest.hexdigest()


def _never_flagged(v: np.ndarray) -> bool:
    """(Tried first on a corner of the batch, where a token batch fails at once.)"""
    return _constant(v) or _mask(v) or _ranged(v)


def _constant(v: np.ndarray) -> bool:
    return v.size == 0 or bool((v == v.reshape(-1)[0]).all())


def _mask(v: np.ndarray) -> bool:
    return bool(((v == 0) | (v == 1)).all())


def _ranged(v: np.ndarray) -> bool:
    for axis in range(v.ndim):
        if v.shape[axis] < 2:
            continue
        steps = np.diff(v, axis=axis)
        first = steps.reshape(-1)[0]
        if first != 0 and bool((steps == first).all()):
            return True
    return False
