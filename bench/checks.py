"""The cost of the default checks (--checks on: programs and replicas agree).

    python bench/checks.py [--rounds 5] [--steps 200] [-n 2] [--width 384] [--calls 200]

Each process runs a training step (one jitted program, a gradient all-reduce
across processes) on a batch it builds every step from per-process data
(``jax.make_array_from_process_local_data``, from a pool of host batches),
and waits for its loss; the width is chosen so that a step takes about 16 ms
here.  The mesh is the guide's replicas across processes: each replica pairs
a device of every process, so every slice of the batch is held by all
processes and each sampled call is compared.  Each round runs two jobs in
turn, which one first alternating: ``--checks off`` and the default (``on``).  The table shows each one's
median step time over the rounds (process 0's, after a warm-up; the batch's
build is inside the step) and the ratio to off.  The goal: at most 1%.

The replica check costs a lookup of the call site and a count per call, and
on the sampled calls (1, 2, 3, 4, 8, 16, ...) a hash of the slices (host
data) or a checksum on the device (device-resident data).  A probe times
them in one process, where a loaded machine's drift between jobs does not
reach: an unsampled call's own cost, and on a batch of the step's size the
host hash, the on-device checksum's dispatch on the calling thread and its
result read back.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_script, checks_on_off, median, step_ms  # noqa: E402

TRAIN = textwrap.dedent(
    """
    import sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    steps, width = int(sys.argv[1]), int(sys.argv[2])
    n, local = jax.process_count(), jax.local_device_count()
    # Replica r pairs local device r of every process: each slice on every process.
    rows = [[jax.local_devices(process_index=p)[d] for p in range(n)] for d in range(local)]
    mesh = jax.sharding.Mesh(np.array(rows), ("replica", "data"))
    batch_rows, replicated = NamedSharding(mesh, P("replica")), NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    layers = [jax.device_put(rng.standard_normal((width, width), np.float32) / width ** 0.5, replicated)
              for _ in range(3)]
    pool = [rng.standard_normal((width // 2, width), np.float32) for _ in range(8)]

    def loss(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    @jax.jit
    def train_step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return [w - 0.01 * g for w, g in zip(params, grads)], value

    def step(i):
        x = jax.make_array_from_process_local_data(batch_rows, pool[i % len(pool)])
        return train_step(layers, x)

    for i in range(5):
        layers, value = step(i)
        value.block_until_ready()
    took = []
    for i in range(steps):
        start = time.perf_counter()
        layers, value = step(i)
        value.block_until_ready()
        took.append(time.perf_counter() - start)
    if jax.process_index() == 0:
        print(f"STEP_MS {np.median(took) * 1000:.3f}", flush=True)
    """
)

PROBE = textwrap.dedent(
    """
    import statistics, sys, time
    import jax, numpy as np
    from jaxrun.child.checks import replicas_prints

    calls, width = int(sys.argv[1]), int(sys.argv[2])
    host = np.random.default_rng(0).standard_normal((width // 2, width), np.float32)
    device = jax.device_put(host, jax.devices()[0])
    for _ in range(5):  # compiled, warm
        replicas_prints.device_print(device, "cpu:0")()

    def timed(fn):
        took = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            took.append(time.perf_counter() - start)
        return statistics.median(took) * 1e6

    class Board:  # posts nothing: the unsampled path never reaches it
        rank = 0

        def post(self, *args, **kwargs):
            pass

    from jaxrun.child.checks import replicas
    check = replicas.ReplicaCheck(Board(), False, replicas_prints)
    wrapped = check.wrap("make_array_from_process_local_data", lambda *a: None)
    for _ in range(100):  # past the sample's dense start
        wrapped(1, 2)
    bare = statistics.median(timed(lambda: None) for _ in range(5))
    print(f"CALL_US {statistics.median(timed(lambda: wrapped(1, 2)) for _ in range(5)) - bare:.2f}")
    pending = []
    print(f"HOST_US {timed(lambda: replicas_prints.host_print(host)):.1f}")
    print(f"DISPATCH_US {timed(lambda: pending.append(replicas_prints.device_print(device, 'cpu:0'))):.1f}")
    print(f"ROUND_US {timed(lambda: replicas_prints.device_print(device, 'cpu:0')()):.1f}")
    print(f"BYTES {host.nbytes}", flush=True)
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("-n", type=int, default=2)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    script = bench_script("checks", "train.py", TRAIN)
    print(f"{args.n} processes x 2 devices, width {args.width}, {args.steps} steps a run, {args.rounds} rounds")
    times = checks_on_off(lambda checks: step_ms(["--checks", checks], script, args.steps, args.width,
                                                 processes=args.n, cpu_devices=2), args.rounds, "a step")
    probe = bench_script("checks", "probe.py", PROBE)
    proc = subprocess.run([sys.executable, probe, str(args.calls), str(args.width)], capture_output=True,
                          text=True, timeout=300)
    found = dict(re.findall(r"(\w+) ([\d.]+)", proc.stdout))
    if "ROUND_US" not in found:
        raise RuntimeError(proc.stderr[-1500:])
    size = int(float(found["BYTES"]))
    call_us = float(found["CALL_US"])
    print(f"an unsampled call's own cost (in one process, median of 5 x {args.calls}): {call_us:.2f} us, "
          f"{100 * call_us / 1e3 / median(times['off']):.4f}% of the median step off")
    print(f"a sampled call's fingerprint of one {size / 1024:.0f} KiB slice (median of {args.calls}): "
          f"host blake2b {float(found['HOST_US']):.1f} us; on-device checksum {float(found['DISPATCH_US']):.1f} us "
          f"to dispatch on the script's thread, {float(found['ROUND_US']):.1f} us with its result read back "
          f"(on the board's thread)")


if __name__ == "__main__":
    main()
