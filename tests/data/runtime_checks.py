"""Child script for tests/test_runtime.py: many runtime checks in one multi-process run.

Every process prints one ``CHECK {json}`` line per check, so a single launch
(a few seconds of jax start-up) covers many cases.  Checks are deterministic
and every process runs them in the same order: a check that fails, fails the
same way everywhere, so later collectives stay in step.
"""

import json
import math
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxrun

ME = jax.process_index()


def report(name, ok, **detail):
    print("CHECK " + json.dumps({"check": name, "process": ME, "ok": bool(ok), **detail}), flush=True)


GROUPS = {"general": [], "mesh": []}


def check(fn=None, group="general"):
    if fn is None:
        return lambda f: check(f, group)
    GROUPS[group].append(fn)
    return fn


def run(fn):
    try:
        detail = fn() or {}
        report(fn.__name__, True, **detail)
    except Exception as e:  # noqa: BLE001 - a failed check is data for the test
        report(fn.__name__, False, error=f"{type(e).__name__}: {e}", tb=traceback.format_exc())


# --- an oracle independent of JAX's indices map -----------------------------

def expected_slices(mesh, spec, shape):
    """Distinct global slices this process's devices hold, from mesh coordinates alone."""
    names = list(mesh.axis_names)
    found = set()
    for coords in np.ndindex(mesh.devices.shape):
        device = mesh.devices[coords]
        if device.process_index != ME:
            continue
        index = []
        for d, dim in enumerate(shape):
            entry = spec[d] if d < len(spec) else None
            axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
            block, count = 0, 1
            for a in axes:  # major to minor
                size = mesh.shape[a]
                block, count = block * size + coords[names.index(a)], count * size
            step = dim // count
            index.append((block * step, (block + 1) * step))
        found.add(tuple(index))
    return sorted(found)


LAYOUT_SPECS = [
    ((16,), P("i")),
    ((16,), P(("i", "j"))),
    ((16,), P("j")),  # partially replicated, 1-D
    ((8, 12), P("i", "j")),
    ((8, 12), P("j", "i")),
    ((8, 12), P(None, "j")),  # partially replicated
    ((8, 12), P("j")),  # partially replicated
    ((8, 12), P()),  # fully replicated
]


def layouts():
    for mesh_shape in ((4, 2), (2, 4)):
        mesh = jax.make_mesh(mesh_shape, ("i", "j"), devices=jax.devices())
        for shape, spec in LAYOUT_SPECS:
            yield mesh, shape, spec


@check
def local_slices_match_oracle():
    cases = 0
    for mesh, shape, spec in layouts():
        sharding = NamedSharding(mesh, spec)
        got = [tuple((s.start, s.stop) for s in idx) for idx in jaxrun.local_slices(sharding, shape)]
        want = expected_slices(mesh, spec, shape)
        assert got == want, f"mesh {dict(mesh.shape)} spec {spec} shape {shape}: got {got}, want {want}"
        cases += 1
    return {"cases": cases}


@check
def make_global_array_loads_each_slice_once():
    cases = 0
    for mesh, shape, spec in layouts():
        sharding = NamedSharding(mesh, spec)
        full = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
        calls = []

        def load(index, calls=calls, full=full):  # this layout's, not the loop's last
            calls.append(tuple((s.start, s.stop) for s in index))
            return full[index]

        arr = jaxrun.make_global_array(sharding, shape, load)
        where = f"mesh {dict(mesh.shape)} spec {spec}"
        assert sorted(calls) == expected_slices(mesh, spec, shape), f"{where}: loaded {calls}"
        assert len(set(calls)) == len(calls), f"{where}: a slice was loaded twice: {calls}"
        for shard in arr.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), full[shard.index], err_msg=where)
        np.testing.assert_array_equal(multihost_utils.process_allgather(arr, tiled=True), full, err_msg=where)
        cases += 1
    return {"cases": cases}


@check
def make_global_array_rejects_wrong_shape():
    sharding = NamedSharding(jax.make_mesh((jax.device_count(),), ("d",)), P("d"))
    shape = (jax.device_count() * 2,)
    mine = ["[" + ", ".join(f"{s.start}:{s.stop}" for s in i) + "]" for i in jaxrun.local_slices(sharding, shape)]
    try:
        jaxrun.make_global_array(sharding, shape, lambda idx: np.zeros(3))
    except ValueError as e:  # JAX raises one of its own too: the test checks the message
        return {"message": str(e), "slices": mine}
    raise AssertionError("a loader returning the wrong shape was accepted")


def guide_replica_mesh():
    """The guide's layout: 4 replicas, each one device of process p and one of p+2."""
    n = jax.process_count()
    rows = []
    for p in range(n // 2):
        for d in range(jax.local_device_count()):
            rows.append([jax.local_devices(process_index=p)[d], jax.local_devices(process_index=p + n // 2)[d]])
    return jax.sharding.Mesh(np.array(rows), ("model_replicas", "data_parallelism"))


@check
def replica_input_index_follows_replicas():
    sharding = NamedSharding(guide_replica_mesh(), P("model_replicas"))
    stream = jaxrun.replica_input_index(sharding, batch_axis=0)
    # Each stream's batch: rows the "dataset" gives to stream k, here a pure function of k.
    per_stream = 4
    batch = np.arange(per_stream * 3, dtype=np.float32).reshape(per_stream, 3) + 1000 * stream.index
    global_batch = jaxrun.make_global_batch(sharding, batch)
    jaxrun.assert_replicas_identical(global_batch)
    want = np.concatenate([np.arange(per_stream * 3, dtype=np.float32).reshape(per_stream, 3) + 1000 * k
                           for k in range(stream.count)])
    np.testing.assert_array_equal(multihost_utils.process_allgather(global_batch, tiled=True), want)
    return {"index": stream.index, "count": stream.count, "blocks": list(stream.blocks),
            "num_blocks": stream.num_blocks}


def replica_input_index_rejects_overlapping_streams():
    dev = lambda p, d: jax.local_devices(process_index=p)[d]  # noqa: E731
    # Processes 0 and 1 share replica 1 but not replicas 0 and 2: no stream split exists.
    rows = [[dev(0, 0), dev(2, 0)], [dev(0, 1), dev(1, 0)], [dev(1, 1), dev(3, 0)], [dev(2, 1), dev(3, 1)]]
    mesh = jax.sharding.Mesh(np.array(rows), ("replica", "model"))
    try:
        jaxrun.replica_input_index(NamedSharding(mesh, P("replica")))
    except ValueError as e:
        return {"message": str(e)}
    raise AssertionError("overlapping replica groups were accepted")


# Its mesh names processes 0-3 one by one; the test expects it only from 4-process runs.
if jax.process_count() == 4:
    check(replica_input_index_rejects_overlapping_streams)


@check
def replica_input_index_pure_data_parallel():
    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    stream = jaxrun.replica_input_index(NamedSharding(mesh, P("batch")))
    return {"index": stream.index, "count": stream.count}


@check
def replicas_identical_passes():
    mesh = jax.make_mesh((4, 2), ("i", "j"))
    x = jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("i")))
    jaxrun.assert_replicas_identical(x)
    jaxrun.assert_replicas_identical(jax.device_put(np.ones(5), NamedSharding(mesh, P())))


@check
def replicas_identical_catches_mismatch():
    sharding = NamedSharding(guide_replica_mesh(), P("model_replicas"))
    shape = (4, 2)
    # Each device gets its own process id: the two copies of every replica differ.
    arrays = [jax.device_put(np.full((1, 2), ME, np.int32), d) for d in jax.local_devices()]
    bad = jax.make_array_from_single_device_arrays(shape, sharding, arrays)
    try:
        jaxrun.assert_replicas_identical(bad)
    except jaxrun.ReplicaMismatchError as e:
        return {"message": str(e)}
    raise AssertionError("differing replicas were not detected")


@check
def same_across_processes():
    jaxrun.assert_same_across_processes({"lr": 0.1, "seed": 3, "w": np.arange(4)}, what="config")
    try:
        jaxrun.assert_same_across_processes(ME % 2, what="seed")
    except jaxrun.ProcessMismatchError as e:
        return {"message": str(e)}
    raise AssertionError("differing seeds were not detected")


@check
def allgather_keeps_the_store_small():
    from jax._src import distributed

    for step in range(5):
        jaxrun.assert_same_across_processes(step, what="step")
    client = distributed.global_state.client
    jaxrun.assert_same_across_processes("sync", what="sync")
    # Only the last round or two may still be stored.
    left = client.key_value_dir_get("jaxrun/same/")
    assert len(left) <= 2 * jax.process_count(), left
    return {"left": len(left)}


@check
def guide_cross_process_transfer():
    num_devices = jax.device_count() // 2
    explicit = (jax.sharding.AxisType.Explicit,)
    first = jax.make_mesh((num_devices,), ("a",), devices=jax.devices()[:num_devices], axis_types=explicit)
    second = jax.make_mesh((num_devices,), ("a",), devices=jax.devices()[num_devices:], axis_types=explicit)
    data = np.arange(64).reshape((8, 8))
    x = jax.device_put(data, NamedSharding(first, P("a")))
    y = jax.jit(lambda v: v * 2)(x)
    z = jax.device_put(y, NamedSharding(second, P("a")))
    result = jax.jit(lambda v: v + 1)(z)
    for shard in result.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), (data * 2 + 1)[shard.index])
    return {"shards": len(result.addressable_shards)}


def guide_pipeline_transfer():
    stages = [lambda v: v + 1, lambda v: v * 2] * 2
    stages = [jax.jit(s) for s in stages]
    devices = [jax.local_devices(process_index=i)[0] for i in range(len(stages))]
    results = []
    for k in range(3):
        mb = np.full((16, 16), k, np.float32)
        for d, s in zip(devices, stages):
            mb = s(jax.device_put(mb, d))
        results.append(mb)
    if ME == 3:  # the last stage's device belongs to process 3
        got = [float(np.asarray(r)[0, 0]) for r in results]
        assert got == [((k + 1) * 2 + 1) * 2 for k in range(3)], got


if jax.process_count() >= 4:  # one stage per process
    check(guide_pipeline_transfer)


@check(group="mesh")
def global_mesh_installed():
    m = jaxrun.mesh()
    result = {"shape": dict(m.shape), "axis_types": [str(t) for t in m.axis_types]}
    if tuple(m.axis_names) == ("i", "j"):
        # The guide's toy, minus its mesh code: raw specs resolve against the installed mesh.
        x = jax.device_put(np.arange(32).reshape((4, 8)), P("i", "j"))
        result["sum"] = float(jnp.sum(jnp.sin(x)))
        result["shards"] = sorted(np.asarray(s.data).tolist() for s in x.addressable_shards)
    return result


@check(group="mesh")
def hybrid_mesh_leading_axis_spans_processes():
    from jaxrun import meshspec
    from jaxrun.child.join import mesh as _mesh_setup

    m = _mesh_setup.build_mesh(meshspec.parse("i=4,j=2"), None, multi_host=True)
    procs = [[d.process_index for d in row] for row in m.devices]
    # Moving along the leading axis changes process; the inner axis stays within one.
    assert all(len(set(row)) == 1 for row in procs) or jax.process_count() < 4, procs
    assert sorted(d.id for d in m.devices.flat) == sorted(d.id for d in jax.devices())
    return {"processes": procs}


def main(groups):
    for group in groups:
        if group == "general":
            # Checks below build meshes of their own in other device orders;
            # under an installed global mesh jit would reject them.
            jax.set_mesh(None)
        for fn in GROUPS[group]:
            run(fn)


if __name__ == "__main__":
    main(sys.argv[1:] or ["general"])
