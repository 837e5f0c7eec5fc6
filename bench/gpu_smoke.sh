#!/usr/bin/env bash
# GPU smoke check for machines with NVIDIA GPUs (a few minutes at most).
#
#   bash bench/gpu_smoke.sh
#
# 1. jaxrun -n 1 on the devices example, the toy (8 GPUs only: its mesh is 4x2) and an 8192x8192 bf16 matmul sharded over all GPUs;
# 2. with at least 2 GPUs, the same with one process per GPU
#    (jaxrun -n G --devices-per-process 1).
# Each process prints the devices it owns; the matmul prints its TFLOP/s.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "gpu_smoke: no nvidia-smi here; nothing to check"; exit 0; }
gpus=$(nvidia-smi -L | grep -c '^GPU ')
echo "gpu_smoke: $gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"

matmul=$(mktemp --suffix=.py)
trap 'rm -f "$matmul"' EXIT
cat > "$matmul" <<'PY'
import time
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
print(f"process {jax.process_index()}: owns {jax.local_devices()} of {jax.device_count()} devices")
n = 8192
mesh = jax.make_mesh((jax.device_count(),), ("d",))
a = jax.device_put(jnp.ones((n, n), jnp.bfloat16), NamedSharding(mesh, P("d", None)))
b = jax.device_put(jnp.ones((n, n), jnp.bfloat16), NamedSharding(mesh, P(None, None)))
f = jax.jit(lambda a, b: a @ b)
f(a, b).block_until_ready()
runs = 20
start = time.perf_counter()
for _ in range(runs):
    c = f(a, b)
c.block_until_ready()
seconds = (time.perf_counter() - start) / runs
if jax.process_index() == 0:
    print(f"matmul {n}x{n} bf16 over {jax.device_count()} GPU(s): {2 * n**3 / seconds / 1e12:.1f} TFLOP/s")
PY

run() { echo "+ jaxrun $*"; timeout 150 python -m jaxrun --timeout 120 "$@"; }
# The toy's mesh is 4x2, so it needs exactly 8 devices.
toy() { if [ "$gpus" -eq 8 ]; then run "$@" examples/toy.py; else echo "(toy skipped: it needs 8 GPUs, this machine has $gpus)"; fi; }
run -n 1 examples/devices.py
toy -n 1
run -n 1 "$matmul"
if [ "$gpus" -ge 2 ]; then
    run -n "$gpus" --devices-per-process 1 examples/devices.py
    toy -n "$gpus" --devices-per-process 1
    run -n "$gpus" --devices-per-process 1 "$matmul"
fi
echo "gpu_smoke: done"
