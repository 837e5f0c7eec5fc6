"""A fault-tolerant JAX program: its processes do not share fate.

    jaxrun -n 4 --cpu-devices 2 --max-restarts 1 -x CRASH_PROCESS=3 examples/recoverable.py

JAX's pattern without collectives. Every process enables
``jax_enable_recoverability`` before it joins, then works on its own devices,
step by step. Each one says it has finished in the coordination service's
key-value store and leaves; process 0, which hosts that service, waits for the
others to have finished and left before it does (its end would end theirs).

With ``--crash P`` (or ``CRASH_PROCESS=P`` in its environment), process P
kills itself (SIGKILL) partway through its first run. jaxrun sees that every
process enabled recoverability, so it keeps the others running, and with
``--max-restarts`` it starts process P again alone, with the same id. The new
run rejoins the job, sees every device again, and finishes. Without restarts
the others still finish, and jaxrun's exit status and summary name process P.

Collectives across a failure (``multihost_utils.live_devices``) work only on
GPUs in JAX 0.10; ``bench/recoverable_gpu.py`` is that check.
"""

import argparse
import os
import signal
import time

import jax
import jax.numpy as jnp
from jax._src import distributed  # the key-value store of JAX's coordination service

import jaxrun

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--step-seconds", type=float, default=0.3)
parser.add_argument("--crash", type=int, default=os.environ.get("CRASH_PROCESS"),
                    help="this process kills itself in its first run")
parser.add_argument("--wait", type=float, default=60.0, help="how long process 0 waits for the others at the end")
args = parser.parse_args()

jax.config.update("jax_enable_recoverability", True)
jax.distributed.initialize(heartbeat_timeout_seconds=5)  # jaxrun gives the coordinator, id and count

me, count = jax.process_index(), jax.process_count()
restarted = int(os.environ.get("JAXRUN_PROCESS_RESTARTS", "0"))
print(f"process {me} run {restarted} joined: {jax.device_count()} devices, {jax.local_device_count()} local",
      flush=True)

total = 0
for step in range(args.steps):
    if args.crash == me and restarted == 0 and step == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # a fault: no error record, no goodbye
    x = jnp.arange(1000, dtype=jnp.int32) + step  # on this process's own devices: no collective
    total += int(x.sum())
    time.sleep(args.step_seconds)

client = distributed.global_state.client
client.key_value_set(f"example/done/{me}", str(total))
if me != 0:
    jax.distributed.shutdown()  # leave now, while process 0 still hosts the service
else:
    deadline, finished = time.monotonic() + args.wait, [0]
    for other in range(1, count):
        left_ms = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            client.blocking_key_value_get(f"example/done/{other}", left_ms)
            finished.append(other)
        except Exception:  # noqa: BLE001 -- it never finished: it failed for good
            print(f"process 0: process {other} did not finish within {args.wait:g} s", flush=True)
    # Then wait for those to have left: process 0's end ends the service they leave through.
    while len(client.get_live_nodes(finished)) > 1 and time.monotonic() < deadline + 10:
        time.sleep(0.05)
print(f"process {me} done: total {total} (jaxrun.process_id() = {jaxrun.process_id()})", flush=True)
