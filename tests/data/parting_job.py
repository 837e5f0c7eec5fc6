"""Jobs for the parting check (tests/e2e/test_parting.py, bench/parting.py): a
training loop of STEPS steps over a global array on every process's CPU
devices, with one of the guide's commonest mistakes, or a healthy job that
looks like one.

    parting_job.py eval          process 0 alone evaluates at step 3 (a program
                                 that spans every process)
    parting_job.py all-but-0     every process but 0 evaluates at step 3
    parting_job.py skip          process 2 skips step 3; from there on a thread of
                                 every process computes 25 ms every 0.5 s (a metrics
                                 thread's beat) while its main thread waits
    parting_job.py columns       every process evaluates each column's mean of a wide
                                 array at step 0, then process 0 alone again at step 3:
                                 a program its peers agreed on runs with no meeting
                                 (checks.meeting), its collective's size (1 KiB) differs
                                 from the step's (4 bytes), and Gloo aborts (SIGABRT)
    parting_job.py gather        process 0 alone gathers the weights at step 3
                                 (multihost_utils.process_allgather, a checkpoint's way)
    parting_job.py healthy       a sub-mesh program (processes 0-1 apart from 2-3, at
                                 two lines) and a process-local one on process 0
                                 alone, each step, beside the global steps; at step 3
                                 each holds a host callback that sleeps SLOW s (every
                                 process waits inside JAX with no CPU, at three lines)

Each process prints "process R parts at T" (the script's clock) just before
the step where it parts.
"""

import sys
import threading
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

what = sys.argv[1]
STEPS, PART, SLOW = 6, 3, 5.0
rank, count = jax.process_index(), jax.process_count()
mesh = Mesh(np.array(jax.devices()), ("b",))
w = jax.make_array_from_callback((mesh.size, 4), NamedSharding(mesh, P("b", None)),
                                 lambda index: np.ones((mesh.size, 4), np.float32)[index])


@jax.jit
def train_step(w):
    return w * 0.5 + jnp.sum(w) / w.size  # the sum: every process's devices take part


@jax.jit
def eval_step(w):
    return jnp.mean(w * w)


@jax.jit
def eval_columns(w):
    return jnp.mean(w, axis=0)


def slow(x, seconds):
    """``x``, after a host callback that sleeps: the process waits inside JAX, with no CPU."""
    return jax.pure_callback(lambda a: (time.sleep(seconds), a)[1], jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@partial(jax.jit, static_argnums=1)
def slow_sum(v, seconds):
    return slow(jnp.sum(v), seconds)


wide = jax.make_array_from_callback((mesh.size, 256), NamedSharding(mesh, P("b", None)),
                                    lambda index: np.ones((mesh.size, 256), np.float32)[index])


def sub_mesh(ranks):
    devices = [d for d in jax.devices() if d.process_index in ranks]
    return Mesh(np.array(devices), ("s",))


def beat():
    """A thread of the process's own that computes now and then (5% of a core): the
    process still waits, though one of the account's 20 ms looks in 25 finds it busy."""
    while True:
        began = time.thread_time()
        while time.thread_time() - began < 0.025:
            pass
        time.sleep(0.5)


for step in range(STEPS):
    if step == PART:
        print(f"process {rank} parts at {time.time():.3f}", flush=True)
    if what == "skip" and step == PART:
        threading.Thread(target=beat, daemon=True).start()
    if what == "skip" and rank == 2 and step == PART:
        continue
    w = train_step(w)
    loss = float(jnp.sum(w))  # every process waits here for the step's collective
    if step == PART and what == "eval" and rank == 0:
        print("eval", float(eval_step(w)), flush=True)  # process 0 alone evaluates
    if step == 0 and what == "columns":
        float(eval_columns(wide).sum())  # every process: the program is agreed on at its first run
    if step == PART and what == "columns" and rank == 0:
        print("eval", float(eval_columns(wide).sum()), flush=True)  # process 0 alone evaluates each column
    if step == PART and what == "all-but-0" and rank != 0:
        print("eval", float(eval_step(w)), flush=True)  # every process but 0 evaluates
    if step == PART and what == "gather" and rank == 0:
        whole = multihost_utils.process_allgather(w, tiled=True)  # process 0 alone gathers a checkpoint
    if what == "healthy":
        half = [0, 1] if rank < 2 else [2, 3]
        sub = sub_mesh(half)
        local = np.full((len(sub.devices.flat), 4), float(step), np.float32)
        v = jax.make_array_from_callback(local.shape, NamedSharding(sub, P("s", None)),
                                         lambda index, local=local: local[index])
        pause = SLOW if step == PART else 0.0
        if rank < 2:
            s = float(slow_sum(v, pause))  # the sub-mesh of processes 0-1
        else:
            s = float(slow_sum(v * 2, pause))  # the sub-mesh of processes 2-3
        if rank == 0:
            mine = jax.device_put(np.ones(4, np.float32), jax.local_devices()[0])
            time.sleep(0.5)  # process 0 alone, in its own work
            s += float(slow_sum(mine * 3, pause))  # a process-local program
    print(f"process {rank} step {step} loss {loss}", flush=True)
print(f"process {rank} done", flush=True)
