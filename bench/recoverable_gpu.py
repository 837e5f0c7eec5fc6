"""JAX's fault tolerance with collectives, under jaxrun, on a machine with GPUs.

    python bench/recoverable_gpu.py [--processes 4] [--steps 30]

The check that CPU cannot make (docs/restarts.md, "Fault-tolerant JAX
programs"): each of N processes owns one GPU (``--devices-per-process 1``),
enables ``jax_enable_recoverability``, and every step sums one value per
device over the devices that ``multihost_utils.live_devices`` says are live
(an all-reduce over a mesh of those devices).  Process N-1 kills itself
(SIGKILL) in its first run; with ``--max-restarts 1`` jaxrun starts it again
alone, and it rejoins.

What it prints, from each process's step lines: the steps the survivors ran
with every device, with one fewer while the process was gone, and with every
device again once it rejoined; the steps that raised; and jaxrun's exit
status.  A PASS needs jaxrun to exit 0, the survivors never to stop, and the
survivors' last steps to see every device again.  It needs at least two GPUs
(NCCL refuses two processes on one device); with fewer it says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import os, signal, sys, time
import jax, jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

jax.config.update("jax_enable_recoverability", True)
jax.distributed.initialize(heartbeat_timeout_seconds=5)
me, count = jax.process_index(), jax.process_count()
rerun = int(os.environ.get("JAXRUN_PROCESS_RESTARTS", "0"))
steps, victim = int(sys.argv[1]), count - 1
print(f"RUN process={me} run={rerun} devices={jax.device_count()}", flush=True)
step = 0
while step < steps:
    if me == victim and rerun == 0 and step == steps // 3:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        with multihost_utils.live_devices(jax.devices()) as devices:
            mesh = Mesh(np.array(devices), ("d",))
            mine = [d for d in devices if d.process_index == me]
            x = jax.make_array_from_single_device_arrays(
                (len(devices),), NamedSharding(mesh, P("d")),
                [jax.device_put(jnp.ones((1,), jnp.float32), d) for d in mine])
            total = float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x))
        print(f"STEP process={me} step={step} live={len(devices)} sum={total:g}", flush=True)
        step += 1
    except Exception as e:  # a device died while the step ran: try the step again
        print(f"FAILED process={me} step={step} {type(e).__name__}: {str(e)[:200]}", flush=True)
        time.sleep(1)
    time.sleep(0.5)
from jax._src import distributed  # process 0 hosts the service: it leaves last
client = distributed.global_state.client
client.key_value_set(f"bench/done/{me}", "1")
if me == 0:
    for other in range(1, count):
        client.blocking_key_value_get(f"bench/done/{other}", 120_000)
print(f"DONE process={me}", flush=True)
'''


def gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=None, help="default: one per GPU, at most 4")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    found = gpus()
    if found < 2:
        print(f"recoverable_gpu: needs at least 2 GPUs, found {found}; nothing was run")
        return 2
    count = args.processes or min(found, 4)
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "live.py"
        script.write_text(SCRIPT)
        argv = [sys.executable, "-m", "jaxrun", "-n", str(count), "--devices-per-process", "1", "--max-restarts", "1",
                "--log-dir", str(Path(folder) / "logs"), str(script), str(args.steps)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    out = done.stdout
    print(done.stderr[-3000:], file=sys.stderr)
    lives: dict[int, list[int]] = {}
    for process, _step, live in re.findall(r"STEP process=(\d+) step=(\d+) live=(\d+)", out):
        lives.setdefault(int(process), []).append(int(live))
    failed = re.findall(r"FAILED process=(\d+) step=(\d+) (.*)", out)
    runs = re.findall(r"RUN process=(\d+) run=(\d+)", out)
    for process in sorted(lives):
        seen = lives[process]
        print(f"process {process}: {len(seen)} steps; live devices per step: {' '.join(map(str, seen))}")
    print(f"steps that raised: {len(failed)}" + "".join(f"\n  process {p} step {s}: {e}" for p, s, e in failed[:8]))
    print(f"runs: {sorted((int(p), int(r)) for p, r in runs)}; jaxrun exit status {done.returncode}")
    survivors = list(range(count - 1))
    ok = (done.returncode == 0 and all(len(lives.get(p, [])) == args.steps for p in survivors)
          and all(lives[p][-1] == count for p in survivors) and any(count - 1 in lives.get(p, []) for p in survivors))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
