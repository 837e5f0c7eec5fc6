"""local_device_ids=[0] narrows the visible devices, as initialize documents."""
import sys

import jax

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid, local_device_ids=[0])
print("cuda visible devices", repr(jax.config.read("jax_cuda_visible_devices")))
print("rocm visible devices", repr(jax.config.read("jax_rocm_visible_devices")))
print("process", jax.process_index(), "of", jax.process_count())
