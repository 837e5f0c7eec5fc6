"""shutdown_timeout_seconds=3 bounds the shutdown barrier when a peer left early.

Rank 1 leaves without shutting down; rank 0's shutdown barrier must give up
after 3 s (JAX then aborts the process), not after the default 300 s.
"""
import os
import sys

import _watchdog
import jax
from jax.experimental import multihost_utils

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(
    coord, n, pid, initialization_timeout=30, heartbeat_timeout_seconds=60, shutdown_timeout_seconds=3
)
multihost_utils.sync_global_devices("both connected")
if pid == 1:
    print("leaving without shutdown", flush=True)
    os._exit(0)
_watchdog.start(15)
print("shutting down", flush=True)
# Which of JAX's threads reports the failed barrier first, and so the words
# of the final abort message, is a race in JAX itself: the message goes to a
# file of its own, which the test only searches.
log = os.open(os.path.join(os.environ["COMPAT_SCRATCH"], f"shutdown-{pid}.log"), os.O_WRONLY | os.O_CREAT)
os.dup2(log, 2)
jax.distributed.shutdown()
print("shutdown returned")
