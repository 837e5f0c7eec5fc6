"""The guide's toy example, written for jaxrun.

    jaxrun -n 4 --cpu-devices 2 examples/toy.py

jaxrun has already called jax.distributed.initialize() by the time this runs,
so there is no initialize() call and no argv parsing.  Every process prints
the shards it holds and the same global result, -0.12398731708526611.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

assert jax.device_count() == 8
mesh = jax.make_mesh((4, 2), ("i", "j"))
global_data = np.arange(32).reshape((4, 8))
sharding = NamedSharding(mesh, P("i", "j"))
global_array = jax.device_put(global_data, sharding)
assert global_array.shape == global_data.shape

for shard in global_array.addressable_shards:
    print(f"device {shard.device} has local data {shard.data}")

global_result = jnp.sum(jnp.sin(global_array))
print(f"process={jax.process_index()} got result: {global_result}")
