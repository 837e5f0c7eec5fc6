"""What each example in examples/ must print: the guide's stated outcomes, per layout.

Each ``check_NAME(layout, out)`` receives the layout it ran under and the
console output split per rank, and asserts what the guide says: which
devices hold which shards, the result values, the shardings, and which
processes hold data at all.  The checks are written for any P x D layout, so
the same function verifies the second layouts too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest


class Layout(NamedTuple):
    processes: int
    devices: int  # per process

    @property
    def total(self) -> int:
        return self.processes * self.devices

    def __str__(self) -> str:
        return f"{self.processes}x{self.devices}"


def device_id(process: int, i: int) -> int:
    # JAX numbers each CPU process's devices from process_index * 2048.
    return process * 2048 + i


def local_ids(layout: Layout, process: int) -> list[int]:
    return [device_id(process, i) for i in range(layout.devices)]


def owner(device: str) -> int:
    return int(device.removeprefix("cpu:")) // 2048


def per_rank(stdout: str) -> dict[int, list[str]]:
    """{rank: [lines without the "[rank] " prefix]} from jaxrun's console output."""
    found: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        m = re.match(r"\[(\d+)\] (.*)", line)
        if m:
            found.setdefault(int(m[1]), []).append(m[2])
    return found


def matches(lines: list[str], pattern: str) -> list[re.Match]:
    return [m for m in (re.fullmatch(pattern, line) for line in lines) if m]


def one(lines: list[str], pattern: str) -> re.Match:
    found = matches(lines, pattern)
    assert len(found) == 1, f"expected one line matching {pattern!r}, got {len(found)} in {lines}"
    return found[0]


def ranks(layout: Layout) -> range:
    return range(layout.processes)


# --- the examples -----------------------------------------------------------


# The toy's result as the plain launch prints it.  Processes that join build JAX's
# CPU collectives with gloo; a job of one process builds none, as a bare python's
# (issue 71: it opens no internet socket), and 8 local devices then reduce in
# another order: the last digits differ.
TOY_RESULT = {False: r"-0\.12398731708526611", True: r"-0\.12398737668991089"}


def check_toy(layout, out):
    data = np.arange(32).reshape(4, 8)
    blocks = {str(data[i:i + 1, 4 * j:4 * j + 4].tolist()) for i in range(4) for j in range(2)}
    seen = []
    for p in ranks(layout):
        rows = matches(out[p], r"device (cpu:\d+) has local data (\[\[.*\]\])")
        assert sorted(owner(m[1]) for m in rows) == [p] * layout.devices, rows
        seen += [str(ast.literal_eval(re.sub(r"(\d)\s+(?=\d)", r"\1, ", m[2]))) for m in rows]
        one(out[p], rf"process={p} got result: {TOY_RESULT[layout.processes == 1]}")
    assert sorted(seen) == sorted(blocks)
    if layout == (4, 2):  # the guide's printed layout: process p holds 8p..8p+7
        for p in ranks(layout):
            got = [m[2] for m in matches(out[p], r"device cpu:\d+ has local data (\[\[(.*)\]\])")]
            assert [list(map(int, g.split())) for g in got] == [list(range(8 * p, 8 * p + 4)),
                                                              list(range(8 * p + 4, 8 * p + 8))]


def check_devices(layout, out):
    everyone = ", ".join(f"CpuDevice(id={d})" for p in ranks(layout) for d in local_ids(layout, p))
    for p in ranks(layout):
        one(out[p], rf"process id = {p}")
        one(out[p], re.escape(f"global devices = [{everyone}]"))
        mine = ", ".join(f"CpuDevice(id={d})" for d in local_ids(layout, p))
        one(out[p], re.escape(f"local devices = [{mine}]"))
        one(out[p], rf"{layout.devices} of {layout.total} devices are addressable by this process")


def check_matmul(layout, out):
    zero = out[0]
    assert "spec=P('a',)" in one(zero, r"z\.sharding = NamedSharding\(.*\)")[0]
    one(zero, r"sharded along a, replicated along b, i\.e\. P\('a', None\): True")
    one(zero, r"Explicit axes: ShardingTypeError: Contracting dimensions are sharded.*out_sharding.*")
    one(zero, r"Explicit axes with out_sharding: float32\[256@a,256\], spec P\('a', None\)")
    holders: dict[tuple[int, int], list[str]] = {}
    for p in ranks(layout):
        rows = matches(out[p], r"device (cpu:\d+) holds z\[(\d+):(\d+), :\], values \[128\.0\]")
        assert sorted(owner(m[1]) for m in rows) == [p] * layout.devices, out[p]
        for m in rows:
            holders.setdefault((int(m[2]), int(m[3])), []).append(m[1])
    # Split along "a" (total/2 row blocks), each block on the 2 devices along "b".
    step = 256 // (layout.total // 2)
    assert sorted(holders) == [(i, i + step) for i in range(0, 256, step)]
    assert all(len(devs) == 2 for devs in holders.values()), holders


def check_fetch(layout, out):
    x = np.arange(16 * 8, dtype=np.float32).reshape(16, 8) - 64
    z = np.maximum(x @ np.ones((8, 16), np.float32), 0)
    one(out[0], r"np\.asarray\(z\) raised RuntimeError: Fetching value for `jax\.Array` that spans "
                r"non-addressable .*")
    one(out[0], re.escape("repr(z) = Array(shape=(16, 16), dtype=float32)"))
    one(out[0], re.escape(f"replicated then fetched on process 0: shape (16, 16), sum {z.sum()}"))
    assert not any("replicated then fetched" in line for p in ranks(layout) if p for line in out[p])
    step = 16 // (layout.total // 2)
    for p in ranks(layout):
        one(out[p], re.escape(f"process_allgather(z, tiled=True): shape (16, 16), sum {z.sum()}"))
        shards = matches(out[p], r"device (cpu:\d+) holds z\[(\d+):(\d+), :\], sum (\S+)")
        assert len(shards) == layout.devices
        for m in shards:
            lo, hi = int(m[2]), int(m[3])
            assert owner(m[1]) == p and hi - lo == step
            assert float(m[4]) == z[lo:hi].sum()


def check_subset(layout, out):
    half = layout.total // 2
    data = np.arange(64).reshape(8, 8)
    rows_seen = []
    for p in ranks(layout):
        one(out[p], re.escape(f"Devices attached to process {p}: [")
            + ", ".join(f"CpuDevice\\(id={d}\\)" for d in local_ids(layout, p)) + r"\]")
        in_mesh = sum(1 for i in range(layout.devices) if p * layout.devices + i >= half)
        one(out[p], rf"process {p} holds {in_mesh} shards")
        shards = matches(out[p], r"device (cpu:\d+) has local data rows (\d+):(\d+): (\[.*\])")
        assert len(shards) == in_mesh
        for m in shards:
            lo, hi = int(m[2]), int(m[3])
            assert ast.literal_eval(m[4]) == data[lo:hi].ravel().tolist()
            rows_seen.append((lo, hi))
        result = one(out[p], rf"process={p} got result: (.*)")[1]
        if in_mesh:
            value = float(re.fullmatch(r"Array\((\S+), dtype=float32\)", result)[1])
            assert value == pytest.approx(0.0965857, abs=2e-7)  # the guide's TPU: 0.09658563
        else:
            assert result == "Array(shape=(), dtype=float32)"
    assert sorted(rows_seen) == [(r, r + 8 // half) for r in range(0, 8, 8 // half)]
    if layout == (4, 2):  # the guide: only processes 2 and 3 take part
        assert [p for p in ranks(layout) if "holds 0 shards" not in " ".join(out[p])] == [2, 3]


def check_pipeline(layout, out):
    half = layout.total // 2
    for p in ranks(layout):
        in_second = sum(1 for i in range(layout.devices) if p * layout.devices + i >= half)
        one(out[p], rf"part 1: process {p} holds {in_second} shards of g\(f\(x\)\) on the second half")
    last = 3
    values = [float(((k + 1) * 2 + 1) * 2) for k in range(6)]
    one(out[last], re.escape(f"part 2: results on cpu:{device_id(last, 0)} (process {last}): {values}"))
    for p in ranks(layout):
        if p != last:
            one(out[p], rf"part 2: process {p} holds no result \(they live on cpu:{device_id(last, 0)}\)")


def check_process_local(layout, out):
    per_process, per_device = 64 // layout.processes, 64 // layout.total
    for p in ranks(layout):
        one(out[p], re.escape(f"process {p} loaded rows {p * per_process}:{(p + 1) * per_process} of (64, 4, 2)"))
        shards = matches(out[p], r"device (cpu:\d+) holds rows (\d+):(\d+), values (\[.*\])")
        assert [m[1] for m in shards] == [f"cpu:{d}" for d in local_ids(layout, p)]
        for i, m in enumerate(shards):
            lo = p * per_process + i * per_device
            assert (int(m[2]), int(m[3])) == (lo, lo + per_device)
            assert ast.literal_eval(m[4]) == [float(r) for r in range(lo, lo + per_device)]


def check_single_device(layout, out):
    everything = np.arange(layout.total).reshape(layout.processes, layout.devices).tolist()
    for p in ranks(layout):
        mine = [p * layout.devices + i for i in range(layout.devices)]
        one(out[p], re.escape(f"part 1: process {p} put {mine}; gathered {everything}"))
        held = layout.devices if p in (0, 1) else 0
        one(out[p], re.escape(f"part 2: process {p} holds {held} shards of (2, {layout.devices}) int32"))


def check_data_parallel(layout, out):
    rows = 16 * layout.processes // layout.total
    for p in ranks(layout):
        for step in range(3):
            element = step * layout.processes + p
            one(out[p], re.escape(f"step {step}: process {p} loaded element {element}; "
                                  f"its {layout.devices} devices hold {rows} rows each"))
            mean = step * layout.processes + (layout.processes - 1) / 2
            one(out[p], re.escape(f"step {step}: global batch ({16 * layout.processes}, 3), mean {mean}"))


def check_replica_in_process(layout, out):
    one(out[0], r"replicas within processes: True; with the transposed layout: False")
    replicas = layout.total // 2
    rows = 16 * layout.processes // replicas
    for p in ranks(layout):
        shards = matches(out[p], r"device (cpu:\d+) holds rows (\d+):(\d+) \(value (\S+)\)")
        got = sorted((int(m[1][4:]), int(m[2]), int(m[3]), float(m[4])) for m in shards)
        want = []
        for i, d in enumerate(local_ids(layout, p)):
            replica = p * layout.devices // 2 + i // 2  # two neighbouring local devices per replica
            want.append((d, replica * rows, (replica + 1) * rows, float(p)))
        assert got == want
        one(out[p], re.escape(f"process {p}: global batch ({16 * layout.processes}, 3), replicas identical"))


def check_replica_across(layout, out):
    half = layout.processes // 2
    blocks_per_stream = layout.devices  # each stream feeds one process's devices' replicas
    rows = 8 // blocks_per_stream
    for p in ranks(layout):
        stream = p % half
        blocks = list(range(stream * blocks_per_stream, (stream + 1) * blocks_per_stream))
        one(out[p], re.escape(f"process {p} reads stream {stream} of {half} "
                              f"(replica blocks {blocks}): replicas identical"))
        shards = matches(out[p], r"device (cpu:\d+) holds rows (\d+):(\d+) \(value (\S+)\)")
        got = sorted((int(m[1][4:]), int(m[2]), int(m[3]), float(m[4])) for m in shards)
        # Local device d of process p holds block d of its stream's batch.
        assert got == [(device_id(p, d), d * rows + stream * 8, (d + 1) * rows + stream * 8, float(stream))
                       for d in range(layout.devices)], got


def fails_replica_across(layout, err):
    """Loading by process index gives the two halves of a replica (on processes
    p and p + half) different data: jaxrun's default check ends the job at the
    line that built the batch, naming the slice and the pair."""
    half = layout.processes // 2
    rows = 8 // layout.devices  # one replica's rows of the global batch
    script = (Path(__file__).resolve().parents[2] / "examples" / "replica_across.py").read_text().splitlines()
    (line,) = [i for i, text in enumerate(script, 1) if "wrong = jaxrun.make_global_batch" in text]
    headline = re.search(r"ReplicaMismatchError: (.*)", err)
    assert headline, err
    m = re.fullmatch(rf"replicas differ at replica_across.py:{line} \(make_array_from_callback, call 1 there\): "
                     r"slice \[(\d+):(\d+), 0:3\] of the global array: "
                     r"checksum \w{8} on cpu:(\d+) \(process (\d+)\); checksum \w{8} on cpu:(\d+) \(process (\d+)\)",
                     headline[1])
    assert m, headline[1]
    replica, p, q = int(m[1]) // rows, int(m[4]), int(m[6])
    assert int(m[2]) - int(m[1]) == rows and int(m[1]) % rows == 0, headline[1]
    # Replica r is local device r % D of process r // D and of that process + half.
    assert (p, q) == (replica // layout.devices, replica // layout.devices + half), headline[1]
    assert (int(m[3]), int(m[5])) == (device_id(p, replica % layout.devices), device_id(q, replica % layout.devices))
    # The process that found it failed first, or (a loaded machine: the scripts
    # returned before the board's look) at teardown.
    assert re.search(r"process \d+ failed first: exit code 1|then process \d+ failed at teardown: exit code 1",
                     err), err


def check_resume(layout, out):
    for p in ranks(layout):
        one(out[p], rf"process {p} of {layout.processes}: starting at step 0 at [\d.]+")
        assert len(matches(out[p], r"step \d+ of 12")) == 12, out[p]
        one(out[p], r"result 4309189")


def check_recoverable(layout, out):
    for p in ranks(layout):
        one(out[p], rf"process {p} run 0 joined: {layout.total} devices, {layout.devices} local")
        one(out[p], rf"process {p} done: total 5040000 \(jaxrun.process_id\(\) = {p}\)")


CHECKS = {name.removeprefix("check_"): fn for name, fn in dict(globals()).items() if name.startswith("check_")}
# The examples that end with exit 1 on purpose, and what their stderr must say.
FAILS = {name.removeprefix("fails_"): fn for name, fn in dict(globals()).items() if name.startswith("fails_")}
