"""initialize() reached through jax._src.distributed, as some libraries do."""
import sys

import jax
from jax._src import distributed

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
distributed.initialize(coord, n, pid)
print("initialized", jax.distributed.is_initialized())
print("process", jax.process_index(), "of", jax.process_count())
print("client set", distributed.global_state.client is not None)
