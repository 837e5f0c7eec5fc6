"""The cost of the stall watchdog (--stall-timeout, on by default).

    python bench/stall.py [--rounds 5] [--steps 200] [-n 2] [--width 416] [--looks 2000] [--parked 300]

Each process runs a data-parallel MLP step (one jitted program, a gradient
all-reduce across processes) and waits for its loss every step; the width
is chosen so that a step takes about 16 ms here.  Each round runs three
jobs in turn: the watchdog off (``--stall-timeout 0``), at its default
(600 s: one look every 5 s) and at a harsh 1 s (one look every 0.1 s).  The
table shows each one's median step time over the rounds (process 0's, after
a warm-up) and its ratio to the watchdog off.  The goal: at most 1% at the
default.

The watchdog hooks nothing: its whole cost is one look per interval in a
thread of each process.  So a probe also times a look itself (in one process
with jax imported and its threads running: CPU time, I/O counters, the main
thread's stack, the children's CPU, each thread's CPU when the process
used some) and says what share of one core it takes at the default interval:
a quiet look (the process used no CPU: no thread read one by one) and a full
one (every thread's CPU and wait read), in a process with jax's threads alone
and with ``--parked`` more native threads that wait for good, as a large
host's XLA and NCCL pools do.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import alternate, bench_script, median, step_ms, table  # noqa: E402

TRAIN = textwrap.dedent(
    """
    import sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    steps, width = int(sys.argv[1]), int(sys.argv[2])
    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    rows, replicated = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    layers = [jax.device_put(rng.standard_normal((width, width), np.float32) / width ** 0.5, replicated)
              for _ in range(3)]
    x = jax.make_array_from_process_local_data(rows, rng.standard_normal((width // 2, width), np.float32))

    def loss(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    @jax.jit
    def train_step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return [w - 0.01 * g for w, g in zip(params, grads)], value

    for _ in range(5):
        layers, value = train_step(layers, x)
        value.block_until_ready()
    took = []
    for _ in range(steps):
        start = time.perf_counter()
        layers, value = train_step(layers, x)
        value.block_until_ready()
        took.append(time.perf_counter() - start)
    if jax.process_index() == 0:
        print(f"STEP_MS {np.median(took) * 1000:.3f}", flush=True)
    """
)

LOOK = textwrap.dedent(
    """
    import ctypes, os, statistics, sys, time
    import jax, jax.numpy as jnp
    from jaxrun.child.watch import activity

    looks, parked = int(sys.argv[1]), int(sys.argv[2])
    libc = ctypes.CDLL(None)
    for _ in range(parked):  # native threads that wait for good in pause(), as a large host's pools
        thread = ctypes.c_ulong()
        libc.pthread_create(ctypes.byref(thread), None, ctypes.cast(libc.pause, ctypes.c_void_p), None)
    jnp.ones(4).block_until_ready()  # jax's backend and its threads are up
    threads = len(os.listdir("/proc/self/task"))
    for name, cpu in (("quiet", lambda: 0.0), ("full", time.process_time)):
        # "quiet": a process that used no CPU (each thread is not read); "full": the
        # looks' own CPU counted, so that every look reads each thread's CPU and
        # wait, as in a process that works or spins.
        live = activity.Sampler("/dev/null", activity.MAX_INTERVAL, cpu=cpu)
        took = []
        for _ in range(looks):
            start = time.perf_counter()
            live.judge()
            took.append(time.perf_counter() - start)
        print(f"LOOK_US {name} {threads} {statistics.median(took) * 1e6:.1f}", flush=True)
    """
)

MODES = {"off": "0", "default (600 s)": "600", "harsh (1 s)": "1"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("-n", type=int, default=2)
    parser.add_argument("--width", type=int, default=416)
    parser.add_argument("--looks", type=int, default=2000)
    parser.add_argument("--parked", type=int, default=300, help="native threads parked beside jax's for the looks")
    args = parser.parse_args()
    script = bench_script("stall", "train.py", TRAIN)
    print(f"{args.n} processes, width {args.width}, {args.steps} steps a run, {args.rounds} rounds")
    times = alternate({name: (lambda t=t: step_ms(["--stall-timeout", t], script, args.steps, args.width,
                                                  processes=args.n))
                       for name, t in MODES.items()}, args.rounds,
                      log=lambda line: print(re.sub(r"(\d)s\b", r"\1 ms", line), flush=True))
    base = median(times["off"])
    rows = [[name, f"{median(ms):.2f}", f"{median(ms) / base:.3f}"] for name, ms in times.items()]
    print(table(rows, ("--stall-timeout", "median step ms", "vs off")))
    look = bench_script("stall", "look.py", LOOK)
    for parked in sorted({0, args.parked}):
        proc = subprocess.run([sys.executable, look, str(args.looks), str(parked)], capture_output=True, text=True,
                              timeout=300)
        found = re.findall(r"LOOK_US (\w+) (\d+) ([\d.]+)", proc.stdout)
        if not found:
            raise RuntimeError(proc.stderr[-1500:])
        for name, threads, us in found:
            print(f"one look, {name} ({threads} threads): {float(us):.1f} us (median of {args.looks}); at the "
                  f"default interval ({5:g} s) {float(us) / 5e6 * 100:.4f}% of one core, at 0.8 s "
                  f"(--stall-timeout 8) {float(us) / 0.8e6 * 100:.3f}%")


if __name__ == "__main__":
    main()
