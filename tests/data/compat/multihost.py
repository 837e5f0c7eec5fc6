"""multihost_utils collectives across the two controllers."""
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid)
print("allgather", multihost_utils.process_allgather(np.array([pid, pid + 100])).tolist())
multihost_utils.sync_global_devices("compat")
print("synced")
print("broadcast", multihost_utils.broadcast_one_to_all(np.array([pid + 7])).tolist())
