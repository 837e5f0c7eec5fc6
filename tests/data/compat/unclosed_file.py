"""A module-level file never closed: interpreter shutdown flushes it."""
import os
import sys

import jax

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid)
f = open(os.path.join(os.environ["COMPAT_SCRATCH"], f"unclosed-{pid}.txt"), "w")  # noqa: SIM115 - left open on purpose
f.write("data")
print("written, not closed")
