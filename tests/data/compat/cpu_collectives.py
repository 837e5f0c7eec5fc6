"""Gloo chosen as the CPU collectives implementation before initialize."""
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

jax.config.update("jax_cpu_collectives_implementation", "gloo")
coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid)
print("collectives", jax.config.jax_cpu_collectives_implementation)
print("allgather", multihost_utils.process_allgather(np.array([pid * 10])).tolist())
