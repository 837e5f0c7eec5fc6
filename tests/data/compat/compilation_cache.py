"""A persistent compilation cache configured before the first jit."""
import os
import sys

import jax
import jax.numpy as jnp

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# One folder per process, so that what one process finds does not depend on
# how far the other one got.
cache = os.path.join(os.environ["COMPAT_SCRATCH"], f"cache-{pid}")
jax.config.update("jax_compilation_cache_dir", cache)
# Cache even this tiny, fast program.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
jax.distributed.initialize(coord, n, pid)

result = jax.jit(lambda x: x * 2 + 1)(jnp.arange(4))
print("result", result.tolist())
print("cache entries written", bool(os.path.isdir(cache) and os.listdir(cache)))
