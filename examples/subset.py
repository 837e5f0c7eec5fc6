"""A mesh over only the second half of the devices.

    jaxrun -n 4 --cpu-devices 2 examples/subset.py

Only the processes that own those devices (2 and 3 under 4x2) hold shards
and can print the sum, Array(0.09658575, dtype=float32).  Processes 0 and 1
run the same code, get an array with no local data, and print only its shape
and dtype.  (The guide's TPU prints 0.09658563; CPU rounds differently.)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

num_devices = jax.device_count() // 2
mesh = jax.make_mesh(
    (num_devices,), ("a",),
    devices=jax.devices()[num_devices:],
    axis_types=(jax.sharding.AxisType.Explicit,),
)
sharding = NamedSharding(mesh, P("a"))
data = np.arange(64).reshape((8, 8))
x = jax.device_put(data, sharding)

if jax.process_index() == 0:
    print(x.sharding)

print(f"Devices attached to process {jax.process_index()}: {jax.local_devices()}")
print(f"process {jax.process_index()} holds {len(x.addressable_shards)} shards")
for shard in x.addressable_shards:
    rows = shard.index[0]
    print(f"device {shard.device} has local data rows {rows.start}:{rows.stop}: {shard.data.ravel().tolist()}")

# Every process may run this; only the mesh's processes compute anything.
result = jnp.sum(jnp.sin(x))
print(f"process={jax.process_index()} got result: {result!r}")
