"""A training loop that saves at JAX's preemption sync point, as the
docs' recipe does (the marker file stands in for an orbax save).

    preemption_job.py OUT_DIR

Every step runs a collective; the process that reaches step 3 first says so
with OUT_DIR/running.  When jaxrun forwards SIGTERM, JAX's preemption
notifier catches it, and ``reached_preemption_sync_point`` turns True on
every process at the same step: each writes OUT_DIR/saved-RANK with that
step, and exits 0.
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

out = sys.argv[1]
rank = jax.process_index()
for step in range(100_000):
    multihost_utils.process_allgather(jnp.array([step]))
    if step == 3:
        open(os.path.join(out, f"running-{rank}"), "w").close()
    if multihost_utils.reached_preemption_sync_point(step):
        with open(os.path.join(out, f"saved-{rank}"), "w") as f:
            f.write(str(step))
        sys.exit(0)
    time.sleep(0.05)
