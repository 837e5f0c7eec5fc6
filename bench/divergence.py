"""The cost of --flight-recorder and --check-divergence on a small training loop.

    python bench/divergence.py [--rounds 5] [--steps 100] [-n 2] [--width 384] [--probe-calls 300]

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
the call much less.  So each round also runs one job that installs the
recorder's hook itself and runs plain and hooked steps in turn (the same
step, jitted twice: once before the hook, keeping JAX's C++ fast path, once
after), and reports the median ratio of each hooked step to the plain step
just before: both share the load of the moment.  The goal for the flight recorder: at most 5%
on steps of 10 ms or more.

Then a probe, in one plain process with one CPU device, splits what the
recorder adds to a call: the same step called with JAX's C++ fast path, with
JAX's Python dispatch (the fast path off, as both modes turn it off), and with
the recorder's hook as well, whose own time is measured in place; at width 32,
where the call is nearly all host work, and at the bench's width.
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

# The step both jobs time: a small MLP's training step, jitted.
MODEL = """
def loss(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.mean(x ** 2)

@jax.jit
def train_step(params, x):
    value, grads = jax.value_and_grad(loss)(params, x)
    return [w - 0.01 * g for w, g in zip(params, grads)], value
"""


def with_model(template: str) -> str:
    """A dedented job script with the model's definitions where it says {model}."""
    assert template.count("\n{model}\n") == 1
    return template.replace("\n{model}\n", MODEL)


TRAIN = with_model(textwrap.dedent(
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

    {model}

    for _ in range(5):  # compile, warm up
        layers, value = train_step(layers, x)
        value.block_until_ready()
    if sys.argv[3:] == ["paired"]:
        # Plain and hooked steps in turn, in this one job, so that both share
        # the machine's load of the moment, which between runs wanders by more
        # than the difference measured.  The recorder's hook is installed here
        # as --flight-recorder installs it.  train_step got its C++ fast path
        # above, before the hook, and keeps it; hooked_step, the same step
        # jitted anew, never gets one, so every call of it goes through the hook.
        from jaxrun.child.checks import flight

        flight._flight = flight.Flight(jax.process_index(), jax.process_count(), 64, None)
        flight._flight.flags = "--flight-recorder"
        flight._install(jax)
        hooked_step = jax.jit(lambda params, x: train_step.__wrapped__(params, x))
        for _ in range(3):  # compile, warm up
            layers, value = hooked_step(layers, x)
            value.block_until_ready()
        warm = flight._flight.runs
        took = {train_step: [], hooked_step: []}
        for i in range(steps):
            f = hooked_step if i % 2 else train_step
            start = time.perf_counter()
            layers, value = f(layers, x)
            value.block_until_ready()
            took[f].append(time.perf_counter() - start)
        assert flight._flight.runs - warm == steps // 2, "the plain steps must not pass the hook"
        plain, hooked = np.array(took[train_step][: steps // 2]), np.array(took[hooked_step])
        if jax.process_index() == 0:
            print(f"PAIRED_MS {np.median(plain) * 1000:.3f} {np.median(hooked) * 1000:.3f} "
                  f"{np.median(hooked / plain):.4f}", flush=True)
        sys.exit(0)
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
))

# One process, one CPU device, no jaxrun launch: the step's call with JAX's
# C++ fast path, then through JAX's Python dispatch, then with the recorder's
# hook installed as --flight-recorder installs it, timing the hook in place.
PROBE = with_model(textwrap.dedent(
    """
    import statistics, sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax._src import pjit
    from jax._src.interpreters import pxla
    from jaxrun.child.checks import flight

    calls, width = int(sys.argv[1]), int(sys.argv[2])
    rng = np.random.default_rng(0)
    layers = [jnp.asarray(rng.standard_normal((width, width), np.float32) / width ** 0.5) for _ in range(3)]
    x = jnp.asarray(rng.standard_normal((width // 2, width), np.float32))

    {model}

    def in_the_call():
        train_step.clear_cache()  # a fast path handed out before a patch would be kept
        jax.block_until_ready(train_step(layers, x))
        took = []
        for _ in range(calls):
            start = time.perf_counter()
            out = train_step(layers, x)
            took.append(time.perf_counter() - start)
            jax.block_until_ready(out)
        return statistics.median(took) * 1e6

    fast = in_the_call()
    pjit._get_fastpath_data = flight._no_fast_path
    pxla.MeshExecutable.create_cpp_call = flight._no_cpp_call
    python = in_the_call()
    recorder = flight._flight = flight.Flight(0, 1, 64, None)
    recorder.flags = "--flight-recorder"
    hook = []

    def timed(executable, args, run=flight.Flight.before_execution, clock=time.perf_counter):
        start = clock()
        run(recorder, executable, args)
        hook.append(clock() - start)

    recorder.before_execution = timed  # _install takes it from here
    flight._install(jax)
    hooked = in_the_call()
    assert recorder.runs == calls + 1 and recorder.ring[-1][4] == __file__, recorder.ring[-1]
    print(f"PROBE_US {fast:.1f} {python:.1f} {hooked:.1f} {statistics.median(hook) * 1e6:.2f}", flush=True)
    """
))

PROBE_WIDTH = 32

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


def paired_ms(script: str, processes: int, steps: int, width: int) -> tuple[float, float, float]:
    """One job's median step time without and with the recorder's hook, the
    steps in turn, in ms; and the median ratio of each hooked step to the
    plain step just before it."""
    cmd = [*JAXRUN, "-n", str(processes), "--cpu-devices", "1", script, str(steps), str(width), "paired"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, start_new_session=True)
    found = re.search(r"PAIRED_MS ([\d.]+) ([\d.]+) ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return float(found[1]), float(found[2]), float(found[3])


def probe_us(script: str, calls: int, width: int) -> tuple[float, float, float, float]:
    """Median µs in the step's call: C++ fast path, Python dispatch, with the
    hook; and the hook's own time per execution."""
    proc = subprocess.run([sys.executable, script, str(calls), str(width)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    found = re.search(r"PROBE_US ([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"the probe exited {proc.returncode}: {proc.stderr[-1500:]}")
    return float(found[1]), float(found[2]), float(found[3]), float(found[4])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three modes (default 5)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run (default 100)")
    parser.add_argument("-n", "--processes", type=int, default=2, help="processes, one CPU device each (default 2)")
    parser.add_argument("--width", type=int, default=384,
                        help="MLP width, which sets the step time (default 384: 10-20 ms on 2 shared cores)")
    parser.add_argument("--probe-calls", type=int, default=300,
                        help="timed calls per setting in the one-process probe (default 300; 0: no probe)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script, probe = os.path.join(tmp, "train.py"), os.path.join(tmp, "probe.py")
        with open(script, "w") as f:
            f.write(TRAIN)
        with open(probe, "w") as f:
            f.write(PROBE)
        print(f"{args.processes} processes x 1 CPU device, {args.steps} steps per run, {args.rounds} rounds")
        times: dict[str, list[float]] = {name: [] for name in MODES}
        hosts: dict[str, list[float]] = {name: [] for name in MODES}
        paired: list[tuple[float, float, float]] = []
        for r in range(args.rounds):  # the modes in turn, so that drift in load hits them alike
            for name, flags in MODES.items():
                took, host = step_ms(script, flags, args.processes, args.steps, args.width)
                times[name].append(took)
                hosts[name].append(host)
            paired.append(paired_ms(script, args.processes, 2 * args.steps, args.width))
            print(f"  round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {t[-1]:.2f} ms (call {h[-1]:.2f})" for (n, t), h in zip(times.items(), hosts.values()))
                + f"; one job, hook off/on: {paired[-1][0]:.2f}/{paired[-1][1]:.2f} ms "
                  f"(x{paired[-1][2]:.3f} step by step)", flush=True)
        # The probe at a width where the call is nearly all host work (the fast
        # path's call takes some 20 us there), then at the bench's width, where
        # part of the device's work shows in the call too, and the hook runs
        # right after it with cold caches.
        widths = (PROBE_WIDTH, args.width) if args.probe_calls else ()
        probed = {w: [probe_us(probe, args.probe_calls, w) for _ in range(3)] for w in widths}
    base, base_host = median(times["plain"]), median(hosts["plain"])
    rows = []
    for name in MODES:
        # Paired with the plain run of the same round, so that drift in the
        # machine's load between rounds cancels out; on a shared machine the
        # step times still wander by several percent, the time in the call less.
        ratio = median([v / p for v, p in zip(times[name], times["plain"])])
        added = median(hosts[name]) - base_host
        rows.append((name, f"{median(times[name]):.2f}", f"{ratio:.3f} ({(ratio - 1) * 100:+.1f}%)",
                     f"{median(hosts[name]):.3f}", f"{added * 1000:+.0f}", f"{added / base * 100:+.1f}%"))
    print()
    print(table(rows, ("mode", "step (ms)", "ratio to plain (slowdown)", "in the call (ms)", "added (us)",
                       "added / plain step")))
    plain_in_job, hooked_in_job = median([p[0] for p in paired]), median([p[1] for p in paired])
    ratio_in_job = median([p[2] for p in paired])
    print()
    print(f"Plain and hooked steps in turn within one job ({2 * args.steps} steps per job, one job per round; "
          f"medians over the rounds; the ratio pairs each hooked step with the plain step just before):")
    print(table([("hook off (plain)", f"{plain_in_job:.2f}", "1.000"),
                 ("hook on (--flight-recorder)", f"{hooked_in_job:.2f}",
                  f"{ratio_in_job:.3f} ({(ratio_in_job - 1) * 100:+.1f}%)")],
                ("in one job", "step (ms)", "ratio to plain (slowdown)")))
    if base < 10 or plain_in_job < 10:
        print(f"(the plain step took {min(base, plain_in_job):.1f} ms, under the 10 ms the goal is stated for: "
              f"raise --width)")
    if probed:
        cells = {w: [median([p[i] for p in runs]) for i in range(4)] for w, runs in probed.items()}
        print()
        print(f"Where the recorder's time goes: the step's call in one process with one CPU device, in us "
              f"(medians of {args.probe_calls} calls, median of 3 runs):")
        labels = ("JAX's C++ fast path (what both modes turn off)", "JAX's Python dispatch",
                  "Python dispatch and the recorder's hook", "  the hook itself, timed in place")
        print(table([(label, *(f"{cells[w][i]:.1f}" if i < 3 else f"{cells[w][i]:.2f}" for w in cells))
                     for i, label in enumerate(labels)], ("", *(f"width {w}" for w in cells))))


if __name__ == "__main__":
    main()
