"""Process 0 exits 3 while the others wait in a collective (issue 74): as the
coordination service goes away with process 0, each other process aborts on
its own and prints JAX's fatal-error page (the service's fatal lines, the
check's C++ stack)."""

import sys

import jax
from jax.experimental import multihost_utils

jax.distributed.initialize()
if jax.process_index() == 0:
    sys.exit(3)
multihost_utils.sync_global_devices("wait")
