"""A job whose collectives come late: every process joins (Gloo's listener
opens with the backend), says so in its file ``READY_DIR/ready-RANK``, waits
for the file ``GO``, and only then runs three gathers and prints the result.

    jaxrun -n 3 --cpu-devices 1 tests/data/late_gather_job.py READY_DIR GO
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

ready_dir, go = sys.argv[1], sys.argv[2]
rank = jax.process_index()
jax.devices()  # the backend, and with it Gloo's listener; no pair is connected yet
open(os.path.join(ready_dir, f"ready-{rank}"), "w").close()
while not os.path.exists(go):
    time.sleep(0.05)
for _ in range(3):
    gathered = multihost_utils.process_allgather(jnp.array([rank]))
print(f"process {rank} done, allgather {gathered.ravel().tolist()}", flush=True)
