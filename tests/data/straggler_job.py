"""A synchronous training loop whose processes may be uneven: each step is
some Python "input" work (a fixed amount of computation, so that a process
held to a share of a core takes longer), then one jitted program with a
collective across every process, then ``block_until_ready``.

    python straggler_job.py STEPS INPUT_MS [SLOW_RANK SLOW_FACTOR] [--jitter SHARE] [--turns] [--until PATH]

SLOW_RANK's input is SLOW_FACTOR times the others' (a host-shaped straggler);
``--jitter 0.1`` gives every process's input a random +-10% each step (a
clean job's ordinary jitter).  The input is Python that burns the CPU for
INPUT_MS of wall time, as it would on a machine with a core for each process
(this one has two for four, and other jobs); with ``--turns`` it is a fixed
number of loop turns instead (``TURNS_PER_MS``, measured here), so that a
process held to a share of a core does the same work, slower.  ``--until
PATH``: the steps go on until PATH exists (STEPS at most), so that a test
can look at the job while it runs and then let it end.  Process 0 prints
the run's id first.
"""

import os
import random
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

TURNS_PER_MS = int(os.environ.get("STRAGGLER_TURNS_PER_MS", "35000"))
WIDTH = 512

turns = "--turns" in sys.argv
options = {}
args = []
words = iter(sys.argv[1:])
for word in words:
    if word in ("--jitter", "--until"):
        options[word] = next(words)
    elif word != "--turns":
        args.append(word)
jitter = float(options.get("--jitter", 0.0))
until = options.get("--until")
steps, input_ms = int(args[0]), float(args[1])
slow_rank, factor = (int(args[2]), float(args[3])) if len(args) > 3 else (-1, 1.0)

rank = jax.process_index()
if rank == 0:
    print("run", os.environ.get("JAXRUN_RUN_ID"), flush=True)
mesh = jax.make_mesh((jax.device_count(),), ("p",))
sharding = NamedSharding(mesh, PartitionSpec("p"))
rng = random.Random(rank * 7919 + 1)


def load_batch(ms: float) -> float:
    total, end = 0, time.perf_counter() + ms / 1000
    for _ in range(int(ms * TURNS_PER_MS / 100)) if turns else iter(lambda: time.perf_counter() < end, False):
        for j in range(100):
            total += j
    return float(total % 7 + 1)


# The program's own work: a few matmuls on a replicated weight (about 10 ms of
# one core here), then the collective over every process's input.
weight = jax.device_put(np.eye(WIDTH, dtype=np.float32) * 0.5, NamedSharding(mesh, PartitionSpec()))


@jax.jit
def step(x, w):
    h = w
    for _ in range(6):
        h = jnp.tanh(h @ w)
    loss = jnp.sum(x[:, 0] * 2.0) + jnp.sum(h) * 1e-6
    return loss, jnp.max(x[:, 1])  # the loss, and whether any process was told to stop


for i in range(steps):
    ms = input_ms * (factor if rank == slow_rank else 1.0)
    if jitter:
        ms *= rng.uniform(1 - jitter, 1 + jitter)
    value = load_batch(ms)
    told = 1.0 if until and os.path.exists(until) else 0.0
    local = np.tile(np.array([[value, told]], np.float32), (jax.local_device_count(), 1))
    x = jax.make_array_from_process_local_data(sharding, local)
    loss, stop = step(x, weight)
    loss.block_until_ready()
    if i % 10 == 0 or i == steps - 1:
        print(f"step {i} loss {float(loss):.0f}", flush=True)
    if float(stop):  # every process stops after the same step: none is left alone in a collective
        print(f"stopped after step {i}", flush=True)
        break
