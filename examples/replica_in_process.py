"""Data + model parallelism with each model replica inside one process.

    jaxrun -n 4 --cpu-devices 2 examples/replica_in_process.py

Each model replica spans 2 devices of one process, and the batch is split
by replica and replicated across a replica's devices (PartitionSpec
"model_replicas" says nothing about the second axis).  Since a replica never
leaves its process, each process can keep reading its own data stream, as in
pure data parallelism.  The guide's mesh assertion checks that premise.

The guide fixes 2 replicas per process with 4 devices each; here the
replica is fixed at 2 devices, so the example also runs under 4x2.
"""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import jaxrun

me = jax.process_index()
dataset = [np.ones((16, 3)) * i for i in range(100)]
per_process_batch = dataset[jax.process_index()::jax.process_count()][0]

devices_per_replica = 2
num_model_replicas_per_process = jax.local_device_count() // devices_per_replica
num_model_replicas_total = num_model_replicas_per_process * jax.process_count()


def replicas_within_processes(mesh_devices):
    """The guide's check: every row of the mesh (one replica) is in one process."""
    return all(len({d.process_index for d in row}) == 1 for row in mesh_devices)


# Rows are built from each process's own devices, so each row is one process's.
mesh_devices = np.array([jax.local_devices(process_idx) for process_idx in range(jax.process_count())])
mesh_devices = mesh_devices.reshape(num_model_replicas_total, -1)
assert replicas_within_processes(mesh_devices)

# A layout that looks similar but is not: rows taken down the columns of the
# global device list pair devices of different processes.  Process-local
# loading would then give one replica two different batches, silently.
crossing = np.array(jax.devices()).reshape(devices_per_replica, -1).T
jaxrun.print0(f"replicas within processes: {replicas_within_processes(mesh_devices)}; "
              f"with the transposed layout: {replicas_within_processes(crossing)}")

mesh = jax.sharding.Mesh(mesh_devices, ["model_replicas", "data_parallelism"])
sharding = jax.sharding.NamedSharding(mesh, P("model_replicas"))
global_batch_array = jax.make_array_from_process_local_data(sharding, per_process_batch)

# The devices of each replica really hold the same rows (a collective check).
jaxrun.assert_replicas_identical(global_batch_array)
for shard in global_batch_array.addressable_shards:
    r = shard.index[0]
    print(f"device {shard.device} holds rows {r.start}:{r.stop} (value {float(shard.data[0, 0])})")
print(f"process {me}: global batch {global_batch_array.shape}, replicas identical")
