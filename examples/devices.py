"""Global, local and addressable devices, as in the guide's GPU example.

    jaxrun -n 4 --cpu-devices 2 examples/devices.py

jaxrun has already called jax.distributed.initialize(), so the guide's
coordinator address and rank arguments are gone.  Every process sees the same
8 global devices but only its own 2 local ones: process 0 has cpu:0 and
cpu:1, process 1 has cpu:2048 and cpu:2049, and so on (on CPU, JAX numbers
each process's devices from process_index * 2048).
"""

import jax

print("process id =", jax.process_index())
print("global devices =", jax.devices())
print("local devices =", jax.local_devices())

# "Addressable" means the same as "local" here: the devices this process can
# send data to and launch work on without the others taking part.
mine = [d for d in jax.devices() if d.process_index == jax.process_index()]
assert mine == jax.local_devices()
assert all(d in jax.devices() for d in jax.local_devices())
print(f"{jax.local_device_count()} of {jax.device_count()} devices are addressable by this process")
