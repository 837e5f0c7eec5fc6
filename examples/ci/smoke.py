"""A multi-process smoke test: the guide's toy computation on a 4x2 global mesh.

    jaxrun -n 4 --cpu-devices 2 examples/ci/smoke.py

jaxrun has already called jax.distributed.initialize() in every process, so
jax.devices() lists all 8 devices of the job.  Exits non-zero on a wrong result.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

EXPECTED = -0.12398731708526611

mesh = jax.make_mesh((4, 2), ("i", "j"))
data = np.arange(32).reshape(4, 8)
x = jax.make_array_from_callback(data.shape, NamedSharding(mesh, P("i", "j")), lambda idx: data[idx])
result = float(jnp.sum(jnp.sin(x)))
print(f"process={jax.process_index()} got result: {result}")
if abs(result - EXPECTED) > 1e-6:
    raise SystemExit(f"process {jax.process_index()}: expected {EXPECTED}, got {result}")
