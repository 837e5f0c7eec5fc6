"""A synchronous training loop whose processes may be uneven: each step is
some Python "input" work (a fixed amount of computation, so that a process
held to a share of a core takes longer), then one jitted program with a
collective across every process, then ``block_until_ready``.

    python straggler_job.py STEPS INPUT_MS [SLOW_RANK SLOW_FACTOR] [--jitter SHARE]

SLOW_RANK's input is SLOW_FACTOR times the others' (a host-shaped straggler);
``--jitter 0.1`` gives every process's input a random +-10% each step (a
clean job's ordinary jitter).  The work is counted in loop turns, calibrated
once (``TURNS_PER_MS``, measured on an idle core of the CI machine), never in
wall time: a throttled process does the same work, slower.
"""

import os
import random
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

TURNS_PER_MS = int(os.environ.get("STRAGGLER_TURNS_PER_MS", "35000"))

args = [a for a in sys.argv[1:] if not a.startswith("--")]
jitter = float(sys.argv[sys.argv.index("--jitter") + 1]) if "--jitter" in sys.argv else 0.0
if jitter:
    args = [a for a in args if a != str(sys.argv[sys.argv.index("--jitter") + 1])]
steps, input_ms = int(args[0]), float(args[1])
slow_rank, factor = (int(args[2]), float(args[3])) if len(args) > 3 else (-1, 1.0)

rank = jax.process_index()
mesh = jax.make_mesh((jax.device_count(),), ("p",))
sharding = NamedSharding(mesh, PartitionSpec("p"))
rng = random.Random(rank * 7919 + 1)


def load_batch(ms: float) -> np.ndarray:
    total = 0
    for _ in range(int(ms * TURNS_PER_MS / 100)):  # 100 turns of the loop below per unit
        for j in range(100):
            total += j
    return np.full((jax.local_device_count(), 4), float(total % 7 + 1), np.float32)


@jax.jit
def step(x):
    return jnp.sum(x * 2.0)


for i in range(steps):
    ms = input_ms * (factor if rank == slow_rank else 1.0)
    if jitter:
        ms *= rng.uniform(1 - jitter, 1 + jitter)
    local = load_batch(ms)
    x = jax.make_array_from_process_local_data(sharding, local)
    loss = step(x)
    loss.block_until_ready()
    if i % 10 == 0 or i == steps - 1:
        print(f"step {i} loss {float(loss):.1f}", flush=True)
