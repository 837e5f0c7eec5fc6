"""A prefetching loader, for the default replica check: two threads build
the batches ahead of the step, each with make_array_from_process_local_data
on a replicated sharding (P()), so every process passes batch k for batch k.
Process 1's first batch is slow, so that its two threads build the batches
in another order than process 0's, and the n-th call at the loader's line
holds another batch in each process.

    jaxrun -n 2 --cpu-devices 2 checks_replicas_prefetch.py [--batches N]
"""

import argparse
import queue
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

parser = argparse.ArgumentParser()
parser.add_argument("--batches", type=int, default=8)
args = parser.parse_args()

me = jax.process_index()
sharding = NamedSharding(jax.make_mesh((jax.device_count(),), ("b",)), P())
ready: dict[int, jax.Array] = {}
arrived = threading.Condition()
todo: queue.SimpleQueue = queue.SimpleQueue()
for k in range(args.batches):
    todo.put(k)


def load() -> None:
    while True:
        try:
            k = todo.get_nowait()
        except queue.Empty:
            return
        if me == 1 and k == 0:
            time.sleep(0.5)  # this host is slower on batch 0: its other thread builds batch 1 first
        local = np.full((4, 3), float(k), np.float32)  # batch k: the same on every host
        batch = jax.make_array_from_process_local_data(sharding, local)  # the loader's line
        with arrived:
            ready[k] = batch
            arrived.notify_all()


threads = [threading.Thread(target=load, name=f"prefetch-{i}") for i in range(2)]
for thread in threads:
    thread.start()
step = jax.jit(lambda x: jnp.sum(x))
for k in range(args.batches):
    with arrived:
        arrived.wait_for(lambda k=k: k in ready)
    print(f"batch {k} sum {float(step(ready.pop(k))):.0f}", flush=True)
for thread in threads:
    thread.join()
print("done", flush=True)
