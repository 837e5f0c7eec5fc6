"""initialize() without an address: JAX reads JAX_COORDINATOR_ADDRESS itself.

JAX has no variable for the process id and count, so those are still given.
"""
import sys

import jax

n, pid = int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(num_processes=n, process_id=pid)
print("initialized", jax.distributed.is_initialized())
print("process", jax.process_index(), "of", jax.process_count())
jax.distributed.shutdown()
print("after shutdown", jax.distributed.is_initialized())
