# toy.py
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

proc_id = int(sys.argv[1])
num_procs = int(sys.argv[2])
jax.distributed.initialize("localhost:10000", num_procs, proc_id)

assert jax.device_count() == 8
mesh = jax.make_mesh((4, 2), ("i", "j"))
global_data = np.arange(32).reshape((4, 8))
sharding = NamedSharding(mesh, P("i", "j"))
global_array = jax.device_put(global_data, sharding)
assert global_array.shape == global_data.shape

for shard in global_array.addressable_shards:
    print(f"device {shard.device} has local data {shard.data}")

global_result = jnp.sum(jnp.sin(global_array))
print(f"process={proc_id} got result: {global_result}")
