"""initialization_timeout=2 bounds the wait for a peer that never joins.

Rank 1 ends without calling initialize.  Rank 0's initialize waits for it to
register and must give up (JAX aborts the process) a few seconds after its
2 s timeout, not after the default 300 s.
"""
import sys

import _watchdog
import jax

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if pid == 1:
    print("not joining")
    sys.exit(0)
_watchdog.start(30)
print("joining", flush=True)
jax.distributed.initialize(coord, n, pid, initialization_timeout=2)
print("connected")
