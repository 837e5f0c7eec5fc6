"""Two collectives issued in different orders: the job hangs, on purpose.

    jaxrun -n 4 --cpu-devices 2 --timeout 10 examples/hang.py

Process 2 checks the config before the training step; the others check it
after.  The step's all-reduce waits for process 2, which waits at the config
check's barrier for the others: nobody can move.  JAX does not detect this.
With --timeout, jaxrun dumps every process's stack, stops the job (exit 124)
and its summary shows where each process was:

    jaxrun:   process 2 was at .../hang.py:LINE in check_config: jaxrun.assert_same_across_processes(...)
    jaxrun:   process 0 was at .../hang.py:LINE in train_step: return float(jnp.sum(x * x))

Without --timeout, jaxrun's stall watchdog stops it once no process has moved
for --stall-timeout (600 s by default; try --stall-timeout 5): exit 125, and
the summary names process 2 as the one that stands out, at check_config.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxrun

mesh = jax.make_mesh((jax.device_count(),), ("batch",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("batch")))
config = {"lr": 3e-4, "steps": 1}


def train_step(x):
    # A cross-process all-reduce: every process must reach it.
    return float(jnp.sum(x * x))


def check_config(config):
    # Also a collective: it waits at a barrier until every process arrives.
    jaxrun.assert_same_across_processes(config, what="config")


print(f"process {jax.process_index()} starts", flush=True)
if jax.process_index() == 2:
    # The bug: a process-dependent branch that reorders collectives.
    check_config(config)
    loss = train_step(x)
else:
    loss = train_step(x)
    check_config(config)
print(f"loss {loss}")  # never reached
