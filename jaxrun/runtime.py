"""Runtime helpers for scripts started by jaxrun: ``import jaxrun`` in the child.

They cover what multi-controller users most often get wrong: which slices of
the data this process must load, whether replicas really hold the same bytes,
printing from one process, and the global mesh.

Helpers marked *collective* exchange data with every other process: like a JAX
collective, every process must call them, in the same order.  They also work
in a plain single-process ``python script.py``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrun.child.checks.replicas import ReplicaMismatchError as ReplicaMismatchError  # --checks raises it too
from jaxrun.child.join import mesh as child_mesh
from jaxrun.child.join.bootstrap import allgather_json
from jaxrun.child.watch.activity import alive as alive  # the stall watchdog's: see --stall-timeout
from jaxrun.child.watch.marks import (
    checkpoint_saved as checkpoint_saved,  # the run's goodput: see docs/runtime.md
    checkpointing as checkpointing,
    step as step,
)

# How long a collective helper waits for the slowest process before giving up.
DEFAULT_TIMEOUT_S = 300.0


# --- who am I ---------------------------------------------------------------

def process_id() -> int:
    """This controller's rank, 0 .. num_processes()-1 (``jax.process_index()``)."""
    return jax.process_index()


def num_processes() -> int:
    """How many controllers the job has (``jax.process_count()``)."""
    return jax.process_count()


def is_coordinator() -> bool:
    """True in process 0, the one that hosts the coordination service."""
    return jax.process_index() == 0


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` in process 0 only; the other processes print nothing."""
    if jax.process_index() == 0:
        print(*args, **kwargs)


def mesh() -> jax.sharding.Mesh:
    """The global mesh built from ``jaxrun --mesh SPEC``, also installed with ``jax.set_mesh``.

    It spans every device of the job; across hosts its leading axis spans the
    processes.  Being installed, raw ``PartitionSpec``s resolve against it.
    ``jax.set_mesh`` is thread-local (the main thread has it), and while it is
    in force ``jax.jit`` rejects arrays that live on a mesh over other
    devices: wrap such code in ``with jax.set_mesh(other_mesh):``.

    Raises RuntimeError when the job was started without ``--mesh``.
    """
    if child_mesh.installed is None:
        raise RuntimeError("no global mesh: start the job with jaxrun --mesh SPEC (e.g. --mesh data=-1)")
    return child_mesh.installed


# --- which data this process loads ------------------------------------------

Index = tuple  # a tuple of slice objects, one per array dimension


def normalize_index(index: Sequence[slice], global_shape: Sequence[int]) -> Index:
    """``slice(None)`` and friends become concrete ``slice(start, stop)``."""
    out = []
    for s, dim in zip(index, global_shape):
        start, stop, step = s.indices(dim)
        if step != 1:
            raise ValueError(f"strided shard index {s} is not supported")
        out.append(slice(start, stop))
    # Trailing dimensions the sharding does not mention are whole.
    out.extend(slice(0, dim) for dim in global_shape[len(out):])
    return tuple(out)


def _key(index: Index) -> tuple[tuple[int, int], ...]:
    # slice objects are unhashable before Python 3.12.
    return tuple((s.start, s.stop) for s in index)


def format_index(index: Index) -> str:
    """``[0:2, 0:8]``: a slice tuple as numpy would write it."""
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in index) + "]"


def local_slices(sharding: jax.sharding.Sharding, global_shape: Sequence[int]) -> list[Index]:
    """The global index ranges this process must supply, each once.

    Returns a list of tuples of ``slice(start, stop)`` (concrete integers, one
    slice per dimension), sorted, with duplicates removed: two local devices
    that hold the same replica share one entry.  ``global_array[idx]`` for
    each ``idx`` is exactly what this process's devices need.
    """
    global_shape = tuple(global_shape)
    seen = {}
    for index in sharding.addressable_devices_indices_map(global_shape).values():
        norm = normalize_index(index, global_shape)
        seen.setdefault(_key(norm), norm)
    return [seen[k] for k in sorted(seen)]


def make_global_array(
    sharding: jax.sharding.Sharding,
    global_shape: Sequence[int],
    load: Callable[[Index], Any],
    dtype=None,
) -> jax.Array:
    """Build the global ``jax.Array`` from ``load(index)``, called once per distinct slice.

    ``index`` is one entry of :func:`local_slices` (concrete slices), so
    ``load`` can read exactly ``full_data[index]`` from a file or a dataset.
    Local devices that hold the same slice share one call.  The returned
    shape is checked against the slice, because a wrong one would otherwise
    surface far from the loader.
    """
    global_shape = tuple(global_shape)
    loaded: dict = {}

    def fetch(index):
        norm = normalize_index(index, global_shape)
        key = _key(norm)
        if key not in loaded:
            data = np.asarray(load(norm))
            want = tuple(s.stop - s.start for s in norm)
            if data.shape != want:
                raise ValueError(
                    f"load({format_index(norm)}) returned shape {data.shape}, expected {want}"
                )
            loaded[key] = data if dtype is None else data.astype(dtype, copy=False)
        return loaded[key]

    return jax.make_array_from_callback(global_shape, sharding, fetch)


class InputStream(NamedTuple):
    """Which input stream a process reads; see :func:`replica_input_index`.

    ``index`` of ``count`` streams.  ``blocks`` are the positions, in
    ascending order, of the global batch's ``num_blocks`` equal blocks (along
    the batch axis) that this stream supplies.
    """

    index: int
    count: int
    blocks: tuple[int, ...]
    num_blocks: int


def replica_input_index(
    sharding: jax.sharding.Sharding, batch_axis: int = 0, *, ndim: int | None = None
) -> InputStream:
    """The input stream this process must read, when replicas may span processes.

    Returns ``InputStream(index, count, blocks, num_blocks)``.  Partition the
    input pipeline into ``count`` streams and read stream ``index`` (for
    example ``dataset.shard(count, index)``).  Processes that hold devices of
    the same model replicas get the same ``index`` and must read identical
    batches in the same order; with pure data parallelism every process gets
    its own stream and ``count == num_processes()``.  A stream's batch is the
    concatenation, along ``batch_axis``, of the global batch's ``blocks``
    (out of ``num_blocks`` equal blocks); :func:`make_global_batch` assembles
    the global array from it.

    ``ndim`` is the array's rank; it defaults to what a NamedSharding's spec
    implies.  Raises ValueError when processes need overlapping but unequal
    sets of blocks, since no stream partition can feed them.
    """
    ndim = ndim if ndim is not None else max(len(getattr(sharding, "spec", ())), batch_axis + 1)
    # Every dimension as long as the device count: divisible by any shard count.
    probe = (len(sharding.device_set),) * ndim
    starts: dict[int, set[int]] = {}
    for device, index in sharding.devices_indices_map(probe).items():
        start = normalize_index(index, probe)[batch_axis].start
        starts.setdefault(device.process_index, set()).add(start)
    all_starts = sorted(set().union(*starts.values()))
    position = {s: i for i, s in enumerate(all_starts)}
    blocks_of = {p: tuple(sorted(position[s] for s in ss)) for p, ss in starts.items()}
    streams = sorted(set(blocks_of.values()))
    def owners(blocks):
        return sorted(p for p, v in blocks_of.items() if v == blocks)

    for a, b in itertools.combinations(streams, 2):
        if set(a) & set(b):
            raise ValueError(
                f"processes {owners(a)} need batch blocks {list(a)} and processes {owners(b)} "
                f"need blocks {list(b)}: they overlap without being equal, so the input "
                "cannot be split into per-replica streams"
            )
    me = jax.process_index()
    if me not in blocks_of:
        raise ValueError(f"process {me} holds no device of this sharding and reads no input")
    mine = blocks_of[me]
    return InputStream(streams.index(mine), len(streams), mine, len(all_starts))


def make_global_batch(sharding: jax.sharding.Sharding, stream_batch: Any, batch_axis: int = 0) -> jax.Array:
    """Assemble the global batch from this process's stream batch (see :func:`replica_input_index`)."""
    stream_batch = np.asarray(stream_batch)
    stream = replica_input_index(sharding, batch_axis, ndim=stream_batch.ndim)
    block = stream_batch.shape[batch_axis] // len(stream.blocks)
    if block * len(stream.blocks) != stream_batch.shape[batch_axis]:
        raise ValueError(
            f"stream batch of {stream_batch.shape[batch_axis]} rows does not split into "
            f"{len(stream.blocks)} equal blocks"
        )
    global_shape = list(stream_batch.shape)
    global_shape[batch_axis] = block * stream.num_blocks
    offset = {b: i * block for i, b in enumerate(stream.blocks)}

    def load(index):
        rows = index[batch_axis]
        first = offset[rows.start // block] + rows.start % block
        local = list(index)
        local[batch_axis] = slice(first, first + rows.stop - rows.start)
        return stream_batch[tuple(local)]

    return make_global_array(sharding, global_shape, load)


# --- consistency checks -----------------------------------------------------

class ProcessMismatchError(AssertionError):
    """Processes that should agree on a value do not."""


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def assert_replicas_identical(array: jax.Array, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """*Collective*: check that every device holding the same slice holds identical bytes.

    Each process checksums its own shards and the checksums are compared
    across processes.  JAX cannot see this mistake itself: a replicated
    sharding whose copies differ (say, two processes loaded different batches
    for one model replica) computes silently wrong results.  Raises
    :class:`ReplicaMismatchError` naming the slice, the devices and the
    processes that disagree.
    """
    shape = array.shape
    mine = []
    for shard in array.addressable_shards:
        index = normalize_index(shard.index, shape)
        mine.append([_key(index), shard.device.id, str(shard.device), _digest(np.asarray(shard.data).tobytes())])
    everyone = allgather_json("replicas", mine, timeout_s)
    by_slice: dict = {}
    for proc, entries in everyone.items():
        for key, _, device, digest in entries:
            by_slice.setdefault(tuple(map(tuple, key)), {}).setdefault(digest, []).append((device, proc))
    problems = []
    for key in sorted(by_slice):
        groups = by_slice[key]
        if len(groups) < 2:
            continue
        where = format_index(tuple(slice(a, b) for a, b in key))
        parts = []
        for digest, holders in sorted(groups.items(), key=lambda g: min(p for _, p in g[1])):
            devices = ", ".join(d for d, _ in holders)
            procs = sorted({p for _, p in holders})
            parts.append(f"checksum {digest[:8]} on {devices} (process{'es' if len(procs) > 1 else ''} "
                         f"{', '.join(map(str, procs))})")
        problems.append(f"slice {where}: " + "; ".join(parts))
    if problems:
        raise ReplicaMismatchError(
            "replicas differ, devices that share a slice hold different data:\n  " + "\n  ".join(problems)
        )


def _fingerprint(value: Any) -> Any:
    """A JSON-able, order-stable stand-in for value (arrays hashed)."""
    if isinstance(value, dict):
        return {"dict": sorted(([_fingerprint(k), _fingerprint(v)] for k, v in value.items()), key=repr)}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_fingerprint(v) for v in value]}
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        arr = np.asarray(value)
        return {"array": [str(arr.dtype), list(arr.shape), _digest(arr.tobytes())]}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return [type(value).__name__, value]
    return [type(value).__qualname__, repr(value)]


def assert_same_across_processes(value: Any, what: str = "value", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """*Collective*: check that every process passes an equal ``value`` (config, seed, step).

    Dicts compare regardless of key order; numpy and jax arrays by dtype,
    shape and bytes; other objects by ``repr``.  Raises
    :class:`ProcessMismatchError` that shows each distinct value and the
    processes that hold it.
    """
    fp = json.dumps(_fingerprint(value), sort_keys=True, default=repr)
    shown = repr(value)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    everyone = allgather_json("same", [_digest(fp.encode()), shown], timeout_s)
    groups: dict[str, list[int]] = {}
    shows: dict[str, str] = {}
    for proc, (digest, text) in sorted(everyone.items()):
        groups.setdefault(digest, []).append(proc)
        shows.setdefault(digest, text)
    if len(groups) > 1:
        parts = [f"{shows[d]} on process{'es' if len(ps) > 1 else ''} {', '.join(map(str, ps))}"
                 for d, ps in sorted(groups.items(), key=lambda g: g[1][0])]
        raise ProcessMismatchError(f"{what} differs across processes: " + "; ".join(parts))


__all__ = [
    "process_id", "num_processes", "is_coordinator", "print0", "mesh",
    "local_slices", "make_global_array", "replica_input_index", "make_global_batch",
    "InputStream", "assert_replicas_identical", "assert_same_across_processes",
    "ReplicaMismatchError", "ProcessMismatchError", "allgather_json",
]
