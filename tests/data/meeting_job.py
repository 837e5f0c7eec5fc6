"""Jobs for the meeting before a program's first run (tests/e2e/test_meeting.py,
bench/meeting.py): a user's training loop, a data mesh over every process's
CPU devices, batches from ``jax.make_array_from_process_local_data``, a jitted
train step, and at step PART one of the commonest multi-controller mistakes,
or a healthy job that looks like one.

    meeting_job.py eval          process 0 alone runs a jitted evaluation over
                                 the global arrays (a program that spans every process)
    meeting_job.py element       at the last step process 0 alone evaluates (op by
                                 op: a product, an element of it by indexing, a
                                 sum, each read back) while the others finish
    meeting_job.py all-but-0     every process but 0 evaluates
    meeting_job.py skip          process 1 skips step PART
    meeting_job.py healthy       every process evaluates; process 0 evaluates its
                                 own local data; process 0 alone compiles a spanning
                                 program ahead and never runs it (its memory and cost
                                 analysis); process 0 compiles one ahead (a warm-up)
                                 that every process runs later; a thread pool compiles two
                                 programs in another order on each process; a
                                 background thread reads the weights' shards back and
                                 runs programs on them while the main thread trains

Each process prints "process R parts at T" (the script's clock) just before
step PART, "process R step S loss L" after each step, "process R done" at its end.
"""

import concurrent.futures
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

what = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
PART = STEPS - 1 if what == "element" else 3
rank, count = jax.process_index(), jax.process_count()
mesh = Mesh(np.array(jax.devices()), ("b",))
data = NamedSharding(mesh, P("b"))
rows = len(jax.local_devices()) * 2
w = jax.device_put(jnp.full((4,), 0.5, jnp.float32), NamedSharding(mesh, P()))


def batch(step):
    local = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 100 + rank + step
    return jax.make_array_from_process_local_data(data, local)


@jax.jit
def train_step(w, x):
    loss = jnp.mean((x @ w) ** 2)  # the mean over the global batch: an all-reduce every process joins
    return w - 0.01 * jax.grad(lambda v: jnp.mean((x @ v) ** 2))(w), loss


@jax.jit
def evaluate(w, x):
    return jnp.mean(x @ w)


@jax.jit
def evaluate_later(w, x):
    return jnp.max(x @ w)


@jax.jit
def pooled(w, x):
    return jnp.min(x @ w)


@jax.jit
def warmed(w, x):
    return jnp.sum(x @ w) / 3


@jax.jit
def never_run(w, x):
    return jnp.sum(jnp.abs(x @ w))


def background(stop, seen):
    """As an asynchronous checkpoint does: read the weights' shards back, and run programs on them."""
    while not stop.is_set():
        for shard in w.addressable_shards:
            host = np.asarray(shard.data)  # a transfer of this process's own shard
            seen.append(float(jnp.sum(shard.data * 2)) + float(host.sum()))  # a program on one device
        time.sleep(0.05)


if what == "healthy":
    pool = concurrent.futures.ThreadPoolExecutor(2)
    x0 = batch(0)
    order = [evaluate_later, pooled] if rank % 2 else [pooled, evaluate_later]
    ahead = [pool.submit(lambda f=f: f.lower(w, x0).compile()) for f in order]  # another order on each process
    later = dict(zip(order, [f.result() for f in ahead]))
    if rank == 0:
        alone = never_run.lower(w, x0).compile()  # compiled ahead, never run
        print("analysis", alone.memory_analysis() is not None, bool(alone.cost_analysis()), flush=True)
        warmed.lower(w, x0).compile()  # a warm-up: every process runs it later
    stop, seen = threading.Event(), []
    saver = threading.Thread(target=background, args=(stop, seen), daemon=True)
    saver.start()

for step in range(STEPS):
    if step == PART:
        print(f"process {rank} parts at {time.time():.3f}", flush=True)
    if what == "skip" and rank == 1 and step == PART:
        continue
    x = batch(step)
    w, loss = train_step(w, x)
    loss = float(loss)  # every process waits here for the step's collective
    if step == PART and what == "eval" and rank == 0:
        print("eval", float(evaluate(w, x)), flush=True)  # process 0 alone evaluates
    if step == PART and what == "all-but-0" and rank != 0:
        print("eval", float(evaluate(w, x)), flush=True)  # every process but 0 evaluates
    if step == PART and what == "element" and rank == 0:
        e = x * 2  # op by op, with no collective: each process's own shards
        print("element", float(e[0, 0]), float(jnp.sum(e[1])), flush=True)  # process 0 alone reads an element
    if what == "healthy" and step == PART:
        print("eval", float(evaluate(w, x)), flush=True)  # every process evaluates
        mine = jax.device_put(np.arange(8, dtype=np.float32), jax.local_devices()[0])
        if rank == 0:
            print("local", float(jnp.sum(mine * 3)), flush=True)  # process 0 alone, its own data
        print("later", float(later[evaluate_later](w, x)), float(later[pooled](w, x)), flush=True)  # pool's
        print("warmed", float(warmed(w, x)), flush=True)  # process 0 compiled it ahead
    print(f"process {rank} step {step} loss {loss:.4f}", flush=True)

if what == "healthy":
    stop.set()
    saver.join()
    print(f"process {rank} background {len(seen)}", flush=True)
print(f"process {rank} done", flush=True)
