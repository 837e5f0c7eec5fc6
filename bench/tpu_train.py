"""A bf16 MLP training loop on whatever JAX sees; prints its own step times as one JSON line.

    python bench/tpu_train.py [STEPS]   (HANG_AT=K parks the process at step K, for the stall watchdog)

STAGE=numpy or STAGE=sleep puts a host stage of STAGE_MS (20) ms before each step: numpy
computing the next batch (an input pipeline), or a ``time.sleep`` (a host parked outside
JAX); ``stage_s`` is its sum by the script's clock.  EVERY=N waits for the chip every N
steps (0: only after the last), not every step: then ``steps_s`` is the time outside the
stage, dispatch and waits together.

The TPU host's script of issue 71 (../shared/tpu/train.py), kept here so that it
travels with the tree; bench/tpu_smoke.sh runs it.  ``steps_s`` is the sum of its
own step times (the first step, with its compile, apart: ``first_s``).
"""
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
hang_at = int(os.environ.get("HANG_AT", "-1"))
stage, stage_s = os.environ.get("STAGE", ""), float(os.environ.get("STAGE_MS", "20")) / 1e3
every = int(os.environ.get("EVERY", "1"))
d, b = int(os.environ.get("TPU_HOST_D", "4096")), 8192  # smaller: to try the loops on a CPU
k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
params = {"w1": jax.random.normal(k1, (d, d), jnp.bfloat16) * 0.02,
          "w2": jax.random.normal(k2, (d, d), jnp.bfloat16) * 0.02}
x = jax.random.normal(k3, (b, d), jnp.bfloat16)


def loss(p, x):
    h = jnp.tanh(x @ p["w1"])
    return jnp.mean((h @ p["w2"] - x).astype(jnp.float32) ** 2)


@jax.jit
def step(p, x):
    value, g = jax.value_and_grad(loss)(p, x)
    return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g), value




def next_batch(seconds):
    """The host's input stage: numpy work for ``seconds`` (its own CPU, outside JAX)."""
    a, end = np.linspace(0.0, 1.0, 4096), time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = np.tanh(a * 1.0001 + 0.5)
    return a


def rest(seconds):
    time.sleep(seconds)  # the host parked outside JAX


t0 = time.perf_counter()
params, value = step(params, x)
value.block_until_ready()
first = time.perf_counter() - t0
times, staged = [], 0.0
for i in range(steps):
    if i == hang_at:
        print(f"parking at step {i}", flush=True)
        while True:
            time.sleep(1)
    if stage:
        t = time.perf_counter()
        next_batch(stage_s) if stage == "numpy" else rest(stage_s)
        staged += time.perf_counter() - t
    t = time.perf_counter()
    params, value = step(params, x)
    if every == 1 or (every > 1 and (i + 1) % every == 0) or i == steps - 1:
        value.block_until_ready()
    times.append(time.perf_counter() - t)
total = sum(times)
times.sort()
med = times[len(times) // 2]
print(json.dumps({"platform": jax.devices()[0].platform, "kind": jax.devices()[0].device_kind,
                  "devices": jax.device_count(), "processes": jax.process_count(),
                  "first_s": round(first, 3), "median_ms": round(med * 1e3, 3),
                  "p10_ms": round(times[len(times) // 10] * 1e3, 3), "steps_s": round(total, 3),
                  "loss": float(value), "tflops": round(6 * 2 * b * d * d / med / 1e12, 1),
                  "stage": stage, "stage_s": round(staged, 3), "every": every}), flush=True)
