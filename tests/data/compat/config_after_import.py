"""Device count and x64 set through jax.config right after the import."""
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid)
print("local devices", jax.local_device_count())
print("global devices", jax.device_count())
print("dtype", jnp.arange(3).dtype)
