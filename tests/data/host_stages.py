"""A step loop whose host does something of its own before each step, for
tests/e2e/test_host_time.py: the time account tells the devices' time from
the host's.

    jaxrun -n 1 --cpu-devices 1 host_stages.py STAGE STEPS OUT

With several processes the array is one, sharded across them, and each step
ends in an all-reduce over it: a step's own clock then holds its programs
and its wait there for the others.

STAGE ``numpy``: STAGE_S seconds of numpy before each step (an input
pipeline, the host's own compute); ``sleep``: a ``time.sleep`` as long (the
host parked outside JAX); ``none``: nothing but the steps.  ``long``: one
step only, whose program holds a host callback that sleeps LONG_S seconds
(one long program: the main thread waits in the jitted call the whole time).
The script's own clock goes to OUT as JSON: ``steps`` (the steps' time,
the call and the wait for its result) and ``stage`` (the stage's time).
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

STAGE_S = 0.023
LONG_S = 6.0
stage, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def body(x):
    w = jnp.full((400, 400), 0.0025, jnp.float32)  # a constant of the program's: every process's
    for _ in range(6):
        x = jnp.tanh(x @ w) * 0.5 + 0.01
    return x * jnp.mean(x)  # across every process: an all-reduce where there are several


def slow(seconds):
    time.sleep(float(seconds))
    return np.float32(seconds)


def long_body(x, seconds):
    waited = jax.pure_callback(slow, jax.ShapeDtypeStruct((), jnp.float32), seconds)
    return x * waited


step = jax.jit(body)
long_step = jax.jit(long_body)


def next_batch(seconds):
    """The host's input: numpy that computes for ``seconds``."""
    a, end = np.linspace(0.0, 1.0, 2048), time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = np.sin(a * 1.0001 + 0.25)
    return a


def rest(seconds):
    time.sleep(seconds)


n = jax.process_count()
x = jnp.ones((400, 400), jnp.float32) * 0.01
if n > 1:
    from jax.sharding import NamedSharding, PartitionSpec

    rows = NamedSharding(jax.make_mesh((n,), ("p",)), PartitionSpec("p"))
    x = jax.make_array_from_callback((400 * n, 400), rows, lambda index: np.full((400, 400), 0.01, np.float32))
if stage == "long":
    long_step(x, 0.01).block_until_ready()  # its compile, and a short call
    began = time.perf_counter()
    long_step(x, LONG_S).block_until_ready()
    json.dump({"steps": time.perf_counter() - began, "stage": 0.0}, open(out, "w"))
    sys.exit(0)
step(x).block_until_ready()  # the compile
spent = {"steps": 0.0, "stage": 0.0}
for _ in range(steps):
    began = time.perf_counter()
    if stage == "numpy":
        next_batch(STAGE_S)
    elif stage == "sleep":
        rest(STAGE_S)
    ready = time.perf_counter()
    x = step(x)
    x.block_until_ready()
    spent["stage"] += ready - began
    spent["steps"] += time.perf_counter() - ready
json.dump(spent, open(f"{out}.{jax.process_index()}" if n > 1 else out, "w"))
