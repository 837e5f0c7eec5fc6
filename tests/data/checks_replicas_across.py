"""The guide's replicas across processes, for the default replica check.

    jaxrun -n 4 --cpu-devices 2 checks_replicas_across.py [--via local|devices] [--wrong-at K]

Each replica pairs a device of process p with one of process p+2, so
processes 0 and 2 must load the same batches.  Every step builds the global
batch at one line (``--via local``: make_array_from_process_local_data;
``--via devices``: make_array_from_single_device_arrays from arrays already
on the devices); at call ``--wrong-at`` process 2 reads by process index
instead of by replica stream.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

parser = argparse.ArgumentParser()
parser.add_argument("--via", choices=["local", "devices"], default="local")
parser.add_argument("--wrong-at", type=int, default=0)
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()

me, n = jax.process_index(), jax.process_count()
half = n // 2
rows = [[jax.local_devices(process_index=p)[d], jax.local_devices(process_index=p + half)[d]]
        for p in range(half) for d in range(jax.local_device_count())]
mesh = jax.sharding.Mesh(np.array(rows), ("model_replicas", "data_parallelism"))
sharding = NamedSharding(mesh, P("model_replicas"))
local_rows = 2 * jax.local_device_count()


def batch_of(stream: int, step: int) -> np.ndarray:
    return np.arange(local_rows * 3, dtype=np.float32).reshape(local_rows, 3) + 1000 * stream + step


def build(local: np.ndarray) -> jax.Array:
    if args.via == "local":
        return jax.make_array_from_process_local_data(sharding, local)
    shape = (local_rows * half, 3)
    arrays = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        start = index[0].start % local_rows
        arrays.append(jax.device_put(local[start:start + 2], device))
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


loss = jax.jit(lambda x: jnp.sum(x * x))
for step in range(1, args.steps + 1):
    stream = me % half
    if step == args.wrong_at and me == 2:
        stream = me  # the mistake: process 2 reads by process index
    batch = build(batch_of(stream, step))
    print(f"step {step} loss {float(loss(batch)):.0f}", flush=True)
    time.sleep(0.2)
print("done", flush=True)
