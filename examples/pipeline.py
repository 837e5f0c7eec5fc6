"""Cross-process device_put, and the guide's 4-stage microbatch pipeline.

    jaxrun -n 4 --cpu-devices 2 examples/pipeline.py

Part 1 moves stage one's result from the first half of the devices
(processes 0 and 1) to the second half (processes 2 and 3).  Part 2 runs the
stages [f, g, f, g] on the first local device of processes 0, 1, 2 and 3, so
each microbatch hops from process to process.  Needs at least 4 processes.

On CPU, cross-process device_put needs jax_cross_host_transfer_socket_address
set before initialize() (the guide's TPU/GPU backends do not).  jaxrun's shim
sets it for you, to a free port of each process's own; a bare JAX script
would fail with "does not support cross-host device transfers".
"""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

me = jax.process_index()
explicit = (jax.sharding.AxisType.Explicit,)
num_devices = jax.device_count() // 2
mesh_first_half = jax.make_mesh((num_devices,), ("a",), devices=jax.devices()[:num_devices], axis_types=explicit)
mesh_second_half = jax.make_mesh((num_devices,), ("a",), devices=jax.devices()[num_devices:], axis_types=explicit)
sharding_first_half = NamedSharding(mesh_first_half, P("a"))
sharding_second_half = NamedSharding(mesh_second_half, P("a"))


# The guide's stages are identities; real arithmetic shows that each one ran.
@jax.jit
def f(x):
    return x + 1


@jax.jit
def g(x):
    return x * 2


# --- part 1: two half-meshes -------------------------------------------------
data = np.arange(64).reshape((8, 8))
x = jax.device_put(data, sharding_first_half)
# Every process runs f, even one with no device in the first half: it still
# needs the reference y for the transfer below, which all processes join.
y = f(x)
z = jax.device_put(y, sharding_second_half)
result = g(z)
for shard in result.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), ((data + 1) * 2)[shard.index])
print(f"part 1: process {me} holds {len(result.addressable_shards)} shards of g(f(x)) on the second half")

# --- part 2: one stage per process ---------------------------------------------
pipeline_stages = [f, g, f, g]
assert jax.process_count() >= len(pipeline_stages), "the pipeline needs at least 4 processes"
# Chosen per process on purpose: jax.devices()[:4] would put all four stages
# on process 0's devices whenever it has four or more.
devices = [jax.local_devices(process_index=i)[0] for i in range(len(pipeline_stages))]
# The guide uses 12 microbatches of 512x512; 6 of 64x64 show the same on CPU.
microbatches = [np.full((64, 64), k, np.float32) for k in range(6)]
results = []
# Every process runs the loop, including those that own no stage's device:
# each device_put is a transfer its source and destination processes join.
for mb in microbatches:
    for d, s in zip(devices, pipeline_stages):
        mb = jax.device_put(mb, d)
        mb = s(mb)
    results.append(mb)

# The last stage ran on process 3's device, so only process 3 can read them.
last = devices[-1].process_index
if me == last:
    values = [float(np.asarray(r)[0, 0]) for r in results]
    assert values == [((k + 1) * 2 + 1) * 2 for k in range(len(microbatches))], values
    print(f"part 2: results on {devices[-1]} (process {last}): {values}")
else:
    print(f"part 2: process {me} holds no result (they live on {devices[-1]})")
