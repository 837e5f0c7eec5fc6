"""A process whose main thread waits inside JAX while using no CPU, as a
host waits for its chip: a program whose host callback sleeps 0.5 s, four
times, with block_until_ready.  Alone in its job, that is its programs' time."""

import time

import jax
import jax.numpy as jnp
import numpy as np


def slow(x):
    time.sleep(0.5)
    return np.asarray(x) + 1


@jax.jit
def step(x):
    return jax.pure_callback(slow, jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2


x = jnp.ones(4)
for _ in range(4):
    x = step(x)
    x.block_until_ready()
print("done", float(x.sum()), flush=True)
