"""Data parallelism where every process loads the same token batches.

    jaxrun -n 2 --cpu-devices 2 checks_replicas_same.py [--distinct]

The sharding gives each process its own rows of the global batch, yet every
process passes the same tokens (every host read the whole dataset): the
replica check warns once, naming the tokens' line.  The position ids (a
range along an axis) and the masks (constant, zeros and ones, or booleans) are the same in
every process too, as they should be: never flagged.  ``--distinct``: each
process reads its own tokens, and nothing is warned of.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

parser = argparse.ArgumentParser()
parser.add_argument("--distinct", action="store_true")
args = parser.parse_args()

me = jax.process_index()
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))
rows, length = 4, 16
seed = me if args.distinct else 0
rng = np.random.default_rng(seed)
score = jax.jit(lambda t, p, m, b, q: jnp.sum(t * p * m) + jnp.sum(b) + jnp.sum(q))
for step in range(6):
    tokens = rng.integers(0, 32000, (rows, length), dtype=np.int32)
    tokens = jax.make_array_from_process_local_data(sharding, tokens)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length))
    positions = jax.make_array_from_process_local_data(sharding, positions)
    mask = jax.make_array_from_process_local_data(sharding, np.ones((rows, length), np.int32))
    causal = jax.make_array_from_process_local_data(sharding, np.tril(np.ones((rows, length), bool)))
    padding = jax.make_array_from_process_local_data(sharding, np.tril(np.ones((rows, length), np.int32)))
    print(f"step {step} score {int(score(tokens, positions, mask, causal, padding))}", flush=True)
print("done", flush=True)
