"""A small data-parallel training loop for the divergence tests (one CPU device per process).

    divergence_train.py [--steps N] [--detour RANK] [--extra RANK]

--detour RANK: process RANK runs eval_step (a different reduction across
processes) once, at step 5, then goes on with the same loop: the guide's
rank-dependent branch around a collective.  --extra RANK: process RANK runs
one more train_step at the end, when the others have finished the script.  Without
either, every process runs the same programs; the script also runs an eager
reduction and an ahead-of-time compiled call, so every way JAX executes a
program is taken.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--detour", type=int, default=-1)
parser.add_argument("--extra", type=int, default=-1)
args = parser.parse_args()

rank = jax.process_index()
mesh = jax.make_mesh((jax.device_count(),), ("batch",))
rows = NamedSharding(mesh, P("batch"))


@jax.jit
def train_step(w, x):
    grad = jnp.sum(x * w, axis=0) / x.shape[0]  # a reduction across processes
    return w - 0.01 * grad


@jax.jit
def eval_step(x):
    return jnp.max(x)  # another reduction across processes


local = np.arange(8.0).reshape(1, 8) * (rank + 1) / 100  # this process's rows of the batch
x = jax.make_array_from_process_local_data(rows, np.repeat(local, jax.local_device_count(), axis=0))
w = jnp.ones(8)
for step in range(args.steps):
    if step == 5 and rank == args.detour:
        eval_step(x).block_until_ready()
    w = train_step(w, x)
total = float(jnp.sum(w))  # an eager operation
scaled = jax.jit(lambda v: v * 2).lower(w).compile()(w)  # an ahead-of-time compiled call
print(f"process {rank}: sum {total:.6f} scaled {float(jnp.sum(scaled)):.6f}", flush=True)
if rank == args.extra:
    train_step(w, x).block_until_ready()
