"""make_array_from_single_device_arrays: one array per local device.

    jaxrun -n 4 --cpu-devices 2 examples/single_device.py

Part 1: every process contributes one (1, 1) array per local device, holding
that device's global number; together they form arange(8) in a (4, 2) array.
Part 2: only processes 0 and 1 contribute; the others pass an empty list
(and a dtype, since there is no array to take it from) and hold no shards.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

me = jax.process_index()


def local_arrays_for(devices):
    return [
        jax.device_put(jnp.array([[me * jax.local_device_count() + i]]), device)
        for i, device in enumerate(devices)
    ]


# --- part 1: every process --------------------------------------------------------
shape = (jax.process_count(), jax.local_device_count())
mesh = jax.make_mesh(shape, ("i", "j"))
sharding = NamedSharding(mesh, P("i", "j"))
global_array = jax.make_array_from_single_device_arrays(
    shape=shape, sharding=sharding, arrays=local_arrays_for(jax.local_devices()),
)
# The guide calls process_allgather(global_array); this JAX only gathers a
# non-fully-addressable array with tiled=True (the array as it is, not stacked).
gathered = multihost_utils.process_allgather(global_array, tiled=True)
assert np.all(gathered == np.arange(jax.device_count()).reshape(global_array.shape))
print(f"part 1: process {me} put {[int(s.data[0, 0]) for s in global_array.addressable_shards]}; "
      f"gathered {gathered.tolist()}")

# --- part 2: only processes 0 and 1 -----------------------------------------------
num_participating_processes = 2
shape = (num_participating_processes, jax.local_device_count())
devices = jax.local_devices(process_index=0) + jax.local_devices(process_index=1)
mesh = jax.make_mesh(shape, ("i", "j"), axis_types=(jax.sharding.AxisType.Explicit,) * 2, devices=devices)
sharding = NamedSharding(mesh, P("i", "j"))

local_arrays = local_arrays_for(jax.local_devices()) if me in (0, 1) else []
array = jax.make_array_from_single_device_arrays(
    shape=shape, sharding=sharding, arrays=local_arrays, dtype=jnp.int32,
)
if me in (0, 1):
    for shard in array.addressable_shards:
        assert shard.data.size == 1
else:
    assert not array.addressable_shards
print(f"part 2: process {me} holds {len(array.addressable_shards)} shards of {array.shape} {array.dtype}")
