"""The cost of the time account and the straggler rule (on by default).

    python bench/account.py [--rounds 5] [--steps 200] [-n 2] [--width 416] [--looks 2000]

The job is ``bench/stall.py``'s: each process runs a data-parallel MLP step
(one jitted program, a gradient all-reduce across processes) and waits for
its loss every step; the width makes a step about 16 ms here.  Each round
runs it twice, in turn: with the account off (``--no-account``) and on (the
default: a look at the main thread every 20 ms, the split home every 10 s).
The table shows each one's median step time over the rounds (process 0's,
after a warm-up) and its ratio to the account off.  The goal: at most 1%.

The account hooks nothing: its whole cost is one look per tick in a thread
of each process.  So a probe also times a look itself, in a process with
jax imported whose main thread is inside a jitted call (the frames walked,
the CPU clock, the main thread's ``schedstat``, the CPU group's
``cpu.stat``), and says what share of one core it takes at its tick.
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
from stall import TRAIN  # noqa: E402

LOOK = textwrap.dedent(
    """
    import statistics, sys, threading, time
    import jax, jax.numpy as jnp
    from jaxrun.child.watch import accounting

    looks = int(sys.argv[1])
    step = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((256, 256))
    step(x).block_until_ready()
    stop = threading.Event()

    def work():  # the main thread's stand-in: jitted calls, back to back
        while not stop.is_set():
            step(x).block_until_ready()

    main = threading.Thread(target=work)
    main.start()
    account = accounting.Accountant(lambda line: None, main=main.ident)
    took, cpu = [], []
    for _ in range(looks):
        start, used = time.perf_counter(), time.thread_time()
        account.look()
        took.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - used)
        time.sleep(0.001)
    stop.set()
    main.join()
    print(f"LOOK_US {statistics.median(took) * 1e6:.1f} {statistics.mean(cpu) * 1e6:.1f}", flush=True)
    """
)

# The same step in one process, its blocks of steps alternating with the
# accountant's thread running and not: no launch, no other process, so the
# rounds differ far less than whole jobs do on a shared machine.
ALONE = textwrap.dedent(
    """
    import statistics, sys, threading, time
    import jax, jax.numpy as jnp, numpy as np
    from jaxrun.child.watch import accounting

    rounds, steps, width = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(0)
    layers = [jnp.asarray(rng.standard_normal((width, width), np.float32) / width ** 0.5) for _ in range(3)]
    x = jnp.asarray(rng.standard_normal((width // 2, width), np.float32))

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
    for _ in range(rounds):
        for mode in ("off", "on"):
            account = accounting.Accountant(lambda line: None) if mode == "on" else None
            if account is not None:
                threading.Thread(target=account.run, daemon=True).start()
            took = []
            for _ in range(steps):
                start = time.perf_counter()
                layers, value = train_step(layers, x)
                value.block_until_ready()
                took.append(time.perf_counter() - start)
            if account is not None:
                account.finish()
            print(f"ALONE {mode} {statistics.median(took) * 1000:.3f}", flush=True)
    """
)

MODES = {"off (--no-account)": ["--no-account"], "on (default)": []}


def main() -> None:
    from jaxrun.child.watch.accounting import TICK

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("-n", type=int, default=2)
    parser.add_argument("--width", type=int, default=416)
    parser.add_argument("--looks", type=int, default=2000)
    parser.add_argument("--alone-width", type=int, default=720, help="one process's width for a 16 ms step here")
    args = parser.parse_args()
    script = bench_script("account", "train.py", TRAIN)
    print(f"{args.n} processes, width {args.width}, {args.steps} steps a run, {args.rounds} rounds")
    times = alternate({name: (lambda flags=flags: step_ms(flags, script, args.steps, args.width, processes=args.n))
                       for name, flags in MODES.items()}, args.rounds,
                      log=lambda line: print(re.sub(r"(\d)s\b", r"\1 ms", line), flush=True))
    base = median(times["off (--no-account)"])
    rows = [[name, f"{median(ms):.2f}", f"{median(ms) / base:.3f}"] for name, ms in times.items()]
    print(table(rows, ("account", "median step ms", "vs off")))
    alone = bench_script("account", "alone.py", ALONE)
    proc = subprocess.run([sys.executable, alone, str(args.rounds * 2), "150", str(args.alone_width)],
                          capture_output=True, text=True, timeout=600)
    blocks = re.findall(r"ALONE (\w+) ([\d.]+)", proc.stdout)
    if not blocks:
        raise RuntimeError(proc.stderr[-1500:])
    off = median([float(ms) for mode, ms in blocks if mode == "off"])
    on = median([float(ms) for mode, ms in blocks if mode == "on"])
    print(f"one process, width {args.alone_width}, {len(blocks) // 2} blocks of 150 steps each way: median step "
          f"{off:.2f} ms off, {on:.2f} ms on: {on / off:.3f}")
    look = bench_script("account", "look.py", LOOK)
    proc = subprocess.run([sys.executable, look, str(args.looks)], capture_output=True, text=True, timeout=300)
    found = re.search(r"LOOK_US ([\d.]+) ([\d.]+)", proc.stdout)
    if not found:
        raise RuntimeError(proc.stderr[-1500:])
    wall, cpu = float(found[1]), float(found[2])
    print(f"one look: {cpu:.1f} us of CPU (mean of {args.looks}; {wall:.1f} us from its start to its end, the "
          f"wait for the GIL included); at one look every {TICK * 1000:g} ms, {cpu / (TICK * 1e6) * 100:.2f}% "
          f"of one core")


if __name__ == "__main__":
    main()
