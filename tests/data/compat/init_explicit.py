"""initialize() with every argument given by keyword, then shutdown()."""
import sys

import jax

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coordinator_address=coord, num_processes=n, process_id=pid)
print("initialized", jax.distributed.is_initialized())
print("process", jax.process_index(), "of", jax.process_count())
print("devices", jax.device_count())
jax.distributed.shutdown()
print("after shutdown", jax.distributed.is_initialized())
