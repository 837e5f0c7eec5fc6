"""Device count, x64 and platform chosen in os.environ before jax is imported."""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_ENABLE_X64"] = "1"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid)
print("local devices", jax.local_device_count())
print("global devices", jax.device_count())
print("dtype", jnp.arange(3).dtype)
print("platform", jax.devices()[0].platform)
