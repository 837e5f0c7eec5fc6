"""A bf16 MLP training loop on whatever JAX sees; prints its own step times as one JSON line.

    python bench/tpu_train.py [STEPS]   (HANG_AT=K parks the process at step K, for the stall watchdog)

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

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
hang_at = int(os.environ.get("HANG_AT", "-1"))
d, b = 4096, 8192
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


t0 = time.perf_counter()
params, value = step(params, x)
value.block_until_ready()
first = time.perf_counter() - t0
times = []
for i in range(steps):
    if i == hang_at:
        print(f"parking at step {i}", flush=True)
        while True:
            time.sleep(1)
    t = time.perf_counter()
    params, value = step(params, x)
    value.block_until_ready()
    times.append(time.perf_counter() - t)
total = sum(times)
times.sort()
med = times[len(times) // 2]
print(json.dumps({"platform": jax.devices()[0].platform, "kind": jax.devices()[0].device_kind,
                  "devices": jax.device_count(), "processes": jax.process_count(),
                  "first_s": round(first, 3), "median_ms": round(med * 1e3, 3),
                  "p10_ms": round(times[len(times) // 10] * 1e3, 3), "steps_s": round(total, 3),
                  "loss": float(value), "tflops": round(6 * 2 * b * d * d / med / 1e12, 1)}), flush=True)
