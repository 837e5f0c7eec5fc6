"""Issue 68: rank 3 sleeps in its own code at step 3 while ranks 0-2 wait in
the step's collective, reached through different lines of theirs: rank 0
prints a global value, ranks 1 and 2 fetch it with jax.device_get."""

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("i")))
total = jax.jit(lambda a: jnp.sum(a))
for step in range(10):
    if step == 3 and jax.process_index() == 3:
        time.sleep(45)  # alive, and stuck
    y = total(x * step)  # a collective: every process takes part
    if jax.process_index() == 0:
        print(float(y))
    else:
        jax.device_get(y)
