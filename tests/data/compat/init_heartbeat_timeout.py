"""heartbeat_timeout_seconds=3 notices a vanished peer within seconds.

Rank 1 vanishes; the coordination service must declare it dead after about
3 s and stop rank 0, long before the default 100 s.
"""
import os
import sys
import time

import _watchdog
import jax
from jax.experimental import multihost_utils

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(
    coord, n, pid, initialization_timeout=30, heartbeat_timeout_seconds=3, shutdown_timeout_seconds=60
)
multihost_utils.sync_global_devices("both connected")
if pid == 1:
    print("vanishing", flush=True)
    os._exit(0)
_watchdog.start(20)
print("waiting for the heartbeat timeout", flush=True)
while True:
    time.sleep(1)
