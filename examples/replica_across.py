"""Data + model parallelism with model replicas that span processes.

    jaxrun -n 4 --cpu-devices 2 examples/replica_across.py

Each of the 4 replicas pairs a device of process p with one of process p+2,
as in the guide.  Processes 0 and 2 must then load the same batches (for
replicas 0 and 1), and processes 1 and 3 the same other batches.  Splitting
the input by process index, as pure data parallelism does, would give the
two halves of one replica different data, and JAX would not notice.

jaxrun.replica_input_index(sharding) says which input stream this process
must read; jaxrun.make_global_batch assembles the global array from it
(via jax.make_array_from_callback), and jaxrun.assert_replicas_identical
proves the replicas hold the same bytes.

Then the wrong way: the batch read by process index.  JAX builds the array
without a word, and a loss computed from it would differ between the two
halves of each replica.  jaxrun's default check (--checks) compares the
slices that processes share, and ends the job at the line that built it:

    jaxrun: process 2 failed first: exit code 1 (pid 4531)
    jaxrun:   ReplicaMismatchError: replicas differ at replica_across.py:73
      (make_array_from_callback, call 1 there): slice [0:4, 0:3] of the global
      array: checksum d1ac3476 on cpu:0 (process 0); checksum aa855430 on
      cpu:4096 (process 2)

(one line; any process of a pair that differs may be the one that finds it),
and jaxrun exits 1.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxrun

me = jax.process_index()
n = jax.process_count()
half = n // 2
# Replica rows: device d of process p together with device d of process p + n/2.
rows = [
    [jax.local_devices(process_index=p)[d], jax.local_devices(process_index=p + half)[d]]
    for p in range(half)
    for d in range(jax.local_device_count())
]
mesh = jax.sharding.Mesh(np.array(rows), ("model_replicas", "data_parallelism"))
sharding = NamedSharding(mesh, P("model_replicas"))

# Element i of the dataset is an (8, 3) batch full of i.
dataset = [np.ones((8, 3), np.float32) * i for i in range(100)]

# Right: split the input by replica stream, not by process.
stream = jaxrun.replica_input_index(sharding)
batch = dataset[stream.index::stream.count][0]
global_batch = jaxrun.make_global_batch(sharding, batch)
jaxrun.assert_replicas_identical(global_batch)
print(f"process {me} reads stream {stream.index} of {stream.count} "
      f"(replica blocks {list(stream.blocks)}): replicas identical")
for shard in global_batch.addressable_shards:
    r = shard.index[0]
    print(f"device {shard.device} holds rows {r.start}:{r.stop} (value {float(shard.data[0, 0])})", flush=True)
# Every process has shown the right way before any goes on to the wrong one.
multihost_utils.sync_global_devices("the right way shown")

# Wrong: split by process index.  Both halves of a replica now load different
# elements; JAX builds the array without a word, and the two halves of a replica
# would compute different losses.  jaxrun's default check stops the job at the
# line that built it, usually before the first loss is printed.
loss = jax.jit(lambda x: jnp.sum(x * x))
for step in range(5):
    wrong = jaxrun.make_global_batch(sharding, dataset[me::n][step])
    print(f"process {me} step {step}: loss {float(loss(wrong)):.0f}")
