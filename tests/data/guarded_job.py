"""A job that waits to be looked at: every process joins and runs one
collective, says so in its file ``READY_DIR/ready-RANK``, waits for the file
``GO``, then runs three more collectives and prints its result.

    jaxrun -n 3 --cpu-devices 1 tests/data/guarded_job.py READY_DIR GO
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

ready_dir, go = sys.argv[1], sys.argv[2]
rank = jax.process_index()
multihost_utils.process_allgather(jnp.array([rank]))  # every listener of the job is open now
open(os.path.join(ready_dir, f"ready-{rank}"), "w").close()
while not os.path.exists(go):
    time.sleep(0.05)
for _ in range(3):
    gathered = multihost_utils.process_allgather(jnp.array([rank]))
print(f"process {rank} done, allgather {gathered.ravel().tolist()}", flush=True)
