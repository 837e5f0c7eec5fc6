"""Pure data parallelism: each process reads its own shard of a dataset stream.

    jaxrun -n 4 --cpu-devices 2 examples/data_parallel.py

The guide uses tf.data; here the "dataset" is a list of numpy batches and
dataset[index::num_shards] is what tf.data's shard(num_shards, index) keeps.
Element i is a (16, 3) batch full of the value i, so at step k process p
loads element k * 4 + p and the global batch's mean is k * 4 + 1.5 (under
4 processes).  Which replica gets which process batch does not matter in pure
data parallelism: every replica runs the same computation.
"""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

me = jax.process_index()
dataset = [np.ones((16, 3)) * i for i in range(100)]
stream = iter(dataset[jax.process_index()::jax.process_count()])

mesh = jax.make_mesh((jax.device_count(),), ("batch",))
sharding = NamedSharding(mesh, P("batch"))


@jax.jit
def mean(batch):
    return batch.mean()  # an all-reduce across every process


for step in range(3):
    per_process_batch = next(stream)
    global_batch_array = jax.make_array_from_process_local_data(sharding, per_process_batch)
    shards = global_batch_array.addressable_shards
    print(f"step {step}: process {me} loaded element {int(per_process_batch[0, 0])}; "
          f"its {len(shards)} devices hold {shards[0].data.shape[0]} rows each")
    # Every process gets the same replicated scalar, so every process may print it.
    print(f"step {step}: global batch {global_batch_array.shape}, mean {float(mean(global_batch_array))}")
