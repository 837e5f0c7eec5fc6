"""Issue 68: the commonest first mistake.  Each process device_puts its own
per-process array with a sharding that spans every process; JAX's assertion
holds the whole array, and every process raises it."""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((jax.device_count(),), ("i",))
local = np.arange(1024, dtype=np.float32).reshape(32, 32) + jax.process_index()
x = jax.device_put(local, NamedSharding(mesh, P("i")))  # the mistake: per-process data, one global sharding
print(x.shape)
