"""make_array_from_process_local_data: each process loads only its part of a batch.

    jaxrun -n 4 --cpu-devices 2 examples/process_local.py

A data-parallel batch of 64 rows over 8 devices: each process loads its 16
rows and each device ends up with 8.  Row r of the global batch holds the
value r, so every shard shows where it came from.
"""

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

me = jax.process_index()
batch_size = 64  # the guide uses 1024 rows of (2048, 42) random numbers: ~700 MB
per_process_batch_size = batch_size // jax.process_count()
per_device_batch_size = batch_size // jax.device_count()

mesh = jax.make_mesh((jax.device_count(),), ("batch",))
sharding = NamedSharding(mesh, P("batch"))
first_row = me * per_process_batch_size
rows = np.arange(first_row, first_row + per_process_batch_size, dtype=np.float32)
process_batch = np.broadcast_to(rows[:, None, None], (per_process_batch_size, 4, 2)).copy()

global_batch = jax.make_array_from_process_local_data(sharding, process_batch)
assert global_batch.shape[0] == batch_size
assert process_batch.shape[0] == per_process_batch_size
assert global_batch.addressable_shards[0].data.shape[0] == per_device_batch_size

print(f"process {me} loaded rows {first_row}:{first_row + per_process_batch_size} of {global_batch.shape}")
for shard in global_batch.addressable_shards:
    r = shard.index[0]
    print(f"device {shard.device} holds rows {r.start}:{r.stop}, values {np.asarray(shard.data)[:, 0, 0].tolist()}")

# The process batches tile the global batch in process order, since the mesh
# lists every process's devices together.
everything = multihost_utils.process_allgather(global_batch, tiled=True)
np.testing.assert_array_equal(everything[:, 0, 0], np.arange(batch_size))
