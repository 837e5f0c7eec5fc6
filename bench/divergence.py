"""The cost of --flight-recorder and --check-divergence on a small training loop.

    python bench/divergence.py [--rounds 5] [--steps 100] [-n 2] [--width 384]

Each process runs a data-parallel MLP step (one jitted program, a gradient
all-reduce across processes) and waits for its loss every step, as a loop
that logs its loss does: the worst case, where no host-side cost hides behind
the device's work.  The script times each of its steps after a warm-up and
reports their median, so start-up and the odd stall are not counted.

Each round runs the three modes in turn.  The table shows, side by side, each
mode's median step time and its slowdown against the plain run of the same
round, and the time spent in the call itself (JAX's dispatch, plus the
mode's work: every mode's cost is host time there) with what the mode adds
to it, as a share of the plain step; medians over the rounds.  On a shared
machine the step times wander by several percent between runs; the time in
the call much less.  The goal for the flight recorder: at most 5% on steps
of 10 ms or more.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import JAXRUN, median, table  # noqa: E402

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
    local = rng.standard_normal((width // 2 * jax.local_device_count(), width), np.float32)
    x = jax.make_array_from_process_local_data(rows, local)

    def loss(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    @jax.jit
    def train_step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return [w - 0.01 * g for w, g in zip(params, grads)], value

    for _ in range(5):  # compile, warm up
        layers, value = train_step(layers, x)
        value.block_until_ready()
    step, host = [], []
    for _ in range(steps):
        start = time.perf_counter()
        layers, value = train_step(layers, x)
        dispatched = time.perf_counter()
        value.block_until_ready()  # the loop logs its loss
        step.append(time.perf_counter() - start)
        host.append(dispatched - start)
    if jax.process_index() == 0:
        print(f"STEP_MS {np.median(step) * 1000:.3f} {np.median(host) * 1000:.3f}", flush=True)
    """
)

MODES = {
    "plain": (),
    "--flight-recorder": ("--flight-recorder",),
    "--check-divergence": ("--check-divergence",),
}


def step_ms(script: str, flags: tuple[str, ...], processes: int, steps: int, width: int) -> tuple[float, float]:
    """One run's median step time and median time in the call itself (JAX's
    dispatch, and whatever a mode adds to it), in ms, as process 0 measured them."""
    cmd = [*JAXRUN, "-n", str(processes), "--cpu-devices", "1", *flags, script, str(steps), str(width)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, start_new_session=True)
    found = re.search(r"STEP_MS ([\d.]+) ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return float(found[1]), float(found[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three modes (default 5)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run (default 100)")
    parser.add_argument("-n", "--processes", type=int, default=2, help="processes, one CPU device each (default 2)")
    parser.add_argument("--width", type=int, default=384,
                        help="MLP width, which sets the step time (default 384: 10-20 ms on 2 shared cores)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "train.py")
        with open(script, "w") as f:
            f.write(TRAIN)
        print(f"{args.processes} processes x 1 CPU device, {args.steps} steps per run, {args.rounds} rounds")
        times: dict[str, list[float]] = {name: [] for name in MODES}
        hosts: dict[str, list[float]] = {name: [] for name in MODES}
        for r in range(args.rounds):  # the modes in turn, so that drift in load hits them alike
            for name, flags in MODES.items():
                took, host = step_ms(script, flags, args.processes, args.steps, args.width)
                times[name].append(took)
                hosts[name].append(host)
            print(f"  round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {t[-1]:.2f} ms (call {h[-1]:.2f})" for (n, t), h in zip(times.items(), hosts.values())),
                flush=True)
    base, base_host = median(times["plain"]), median(hosts["plain"])
    rows = []
    for name in MODES:
        # Paired with the plain run of the same round, so that drift in the
        # machine's load between rounds cancels out; on a shared machine the
        # step times still wander by several percent, the time in the call less.
        ratio = median([v / p for v, p in zip(times[name], times["plain"])])
        added = median(hosts[name]) - base_host
        rows.append((name, f"{median(times[name]):.2f}", f"{(ratio - 1) * 100:+.1f}%", f"{median(hosts[name]):.3f}",
                     f"{added * 1000:+.0f}", f"{added / base * 100:+.1f}%"))
    print()
    print(table(rows, ("mode", "step (ms)", "slowdown", "in the call (ms)", "added (us)", "added / plain step")))


if __name__ == "__main__":
    main()
