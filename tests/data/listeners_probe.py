"""Moves an array between processes, gathers one, then reports the addresses
this process listens on (every socket JAX opened by then is open).

    jaxrun -n 4 --cpu-devices 2 tests/data/listeners_probe.py
"""

import jax
import numpy as np
import psutil
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

ranks = multihost_utils.process_allgather(np.array([jax.process_index()]))  # collectives (gloo)
explicit = (jax.sharding.AxisType.Explicit,)
half = jax.device_count() // 2
first = NamedSharding(jax.make_mesh((half,), ("a",), devices=jax.devices()[:half], axis_types=explicit), P("a"))
second = NamedSharding(jax.make_mesh((half,), ("a",), devices=jax.devices()[half:], axis_types=explicit), P("a"))
data = np.arange(64).reshape((8, 8))
# As examples/pipeline.py: every process runs the step on the first half,
# even one with no device there, then the result moves to the second half.
y = jax.jit(lambda a: a + 1)(jax.device_put(data, first))
moved = jax.device_put(y, second)  # a cross-process device_put
for shard in moved.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), (data + 1)[shard.index])
listening = sorted({c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN})
print(f"process {jax.process_index()} moved {len(moved.addressable_shards)} shards, "
      f"allgather {ranks.ravel().tolist()}, listening on {' '.join(listening)}", flush=True)
# No collective after the transfer: in jax 0.10.2 on CPU, a gloo collective
# that follows a cross-process device_put waits for a context that processes
# outside the transfer never create (seen here as a 30 s GetKeyValue timeout).
