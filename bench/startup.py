"""Start-to-finish wall time: jaxrun against the bash loop, mpirun and one process.

    python bench/startup.py [--rounds 5] [--part toy|scaling|many|all] [--plot bench/scaling.png]
                            [--many-rounds 3] [--many 64,256]

toy:      the guide's toy, 4 processes x 2 CPU devices, for jaxrun (preloading,
          the default), jaxrun --no-preload, the guide's bash loop, mpirun (when
          installed) and one process with 8 devices (the guide's command, which still calls
          initialize(); and the same without that call).
scaling:  N = 1, 2, 4, 8, 16 processes with 1 CPU device each, jaxrun vs the bash loop.
many:     N = 64 and 256 processes of a script that prints a line and sleeps 1 s (no
          jax), ``jaxrun --no-preload`` (the path every Slurm, Open MPI and Ray task
          takes) vs the bash loop: what each process pays jaxrun at start-up, times N.

The goals (issue #46), on a 2-core machine: the toy at most 0.45x the bash loop and
1.15x one process; N = 64 and 256 at most 1.5x the bash loop.  Each part prints
"goal ...: met" or "not met" after its table.

Contenders run alternately, round after round; the tables give medians and
ratios, never a single run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from common import JAXRUN, PYTHON, ROOT, alternate, bash_loop, free_port, median, table, wall

# The job for every contender except jaxrun: it initializes by hand, from argv
# (bash loop), from Open MPI's environment (mpirun), or alone (one process).
BARE_JOB = """
import os, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
if "JAXRUN_PROCESS_ID" not in os.environ:
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        jax.distributed.initialize(os.environ["BENCH_COORDINATOR"], int(os.environ["OMPI_COMM_WORLD_SIZE"]),
                                   int(os.environ["OMPI_COMM_WORLD_RANK"]))
    elif "BENCH_NO_INIT" not in os.environ:
        jax.distributed.initialize(os.environ["BENCH_COORDINATOR"], int(sys.argv[2]), int(sys.argv[1]))
shape = tuple(int(v) for v in os.environ["BENCH_MESH"].split("x"))
mesh = jax.make_mesh(shape, ("i", "j")[: len(shape)])
data = np.arange(32 * jax.device_count()).reshape((shape[0] * 4, -1))
x = jax.device_put(data, NamedSharding(mesh, P(*("i", "j")[: len(shape)])))
for shard in x.addressable_shards:
    print(f"device {shard.device} has local data {shard.data}")
print(f"process={jax.process_index()} got result: {jnp.sum(jnp.sin(x))}")
"""

# The job of the "many" part: no jax, so that what is timed is the start-up of
# N Python processes, and what jaxrun adds to each.
SLEEP_JOB = """
import time
print("hello", flush=True)
time.sleep(1)
"""

TOY_GOALS = (("bash loop", 0.45), ("one process, 8 devices", 1.15))
MANY_GOAL = 1.5


def goal_line(what: str, got: float, goal: float) -> str:
    return f"goal {what} <= {goal:.2f}x: got {got:.2f}x, {'met' if got <= goal else 'not met'}"


def contenders_for(script: str, n: int, devices: int, mesh: str, with_extras: bool) -> dict:
    base = dict(os.environ, JAX_PLATFORMS="cpu", BENCH_MESH=mesh)
    base.pop("JAXRUN_NO_PRELOAD", None)

    def bare_env(count: int) -> dict:
        return dict(base, JAX_NUM_CPU_DEVICES=str(count), BENCH_COORDINATOR=f"127.0.0.1:{free_port()}")

    jaxrun_cmd = JAXRUN + ["-n", str(n), "--cpu-devices", str(devices), script]
    runs = {
        "jaxrun": lambda: wall(jaxrun_cmd, base),
        "bash loop": lambda: wall(bash_loop(script, n, {}), bare_env(devices)),
    }
    if with_extras:
        runs["jaxrun --no-preload"] = lambda: wall(JAXRUN + ["--no-preload"] + jaxrun_cmd[3:], base)
        mpirun = shutil.which("mpirun")
        if mpirun:
            cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", str(n), "-x", "BENCH_COORDINATOR",
                   "-x", "BENCH_MESH", "-x", "JAX_PLATFORMS", "-x", "JAX_NUM_CPU_DEVICES", PYTHON, script]
            runs["mpirun"] = lambda: wall(cmd, bare_env(devices))
        # The guide's "JAX_NUM_CPU_DEVICES=8 python toy.py 0 1": it still calls
        # initialize() for a one-process job.  The row after it skips that call.
        runs["one process, 8 devices"] = lambda: wall([PYTHON, script, "0", "1"], bare_env(n * devices), timeout=60)
        runs["one process, no initialize()"] = lambda: wall(
            [PYTHON, script, "0", "1"], dict(bare_env(n * devices), BENCH_NO_INIT="1"), timeout=60
        )
    return runs


def toy(script: str, rounds: int) -> None:
    print(f"toy, 4 processes x 2 CPU devices, {rounds} rounds")
    times = alternate(contenders_for(script, 4, 2, "4x2", with_extras=True), rounds)
    med = {name: median(t) for name, t in times.items()}
    rows = [
        (name, f"{m:.2f} s", f"{m / med['bash loop']:.2f}", f"{m / med['one process, 8 devices']:.2f}")
        for name, m in med.items()
    ]
    print(table(rows, ("launch", "median wall", "vs bash loop", "vs one process")))
    # The same ratios taken round by round (each round runs every contender
    # once, close together), which a drift in the machine's speed moves less.
    for against, _ in TOY_GOALS:
        ratios = sorted(j / o for j, o in zip(times["jaxrun"], times[against]))
        print(f"jaxrun vs {against}, round by round: median {median(ratios):.2f}x "
              f"(lowest {ratios[0]:.2f}x, highest {ratios[-1]:.2f}x)")
    for against, goal in TOY_GOALS:
        print(goal_line(f"jaxrun vs {against}", med["jaxrun"] / med[against], goal))


def scaling(script: str, rounds: int, plot: str | None) -> None:
    sizes = [1, 2, 4, 8, 16]
    print(f"scaling, N processes x 1 CPU device, {rounds} rounds")
    rows, series = [], {"jaxrun": [], "bash loop": []}
    for n in sizes:
        times = alternate(contenders_for(script, n, 1, f"{n}", with_extras=False), rounds, log=lambda *_: None)
        j, b = median(times["jaxrun"]), median(times["bash loop"])
        series["jaxrun"].append(j)
        series["bash loop"].append(b)
        rows.append((n, f"{j:.2f} s", f"{b:.2f} s", f"{j / b:.2f}"))
        print(f"  N={n}: jaxrun {j:.2f}s, bash loop {b:.2f}s", flush=True)
    print(table(rows, ("N", "jaxrun", "bash loop", "ratio")))
    print(f"target: at N=16 jaxrun <= 0.35x bash loop (got {series['jaxrun'][-1] / series['bash loop'][-1]:.2f})")
    if plot:
        draw(sizes, series, plot)


def many(script: str, rounds: int, sizes: list[int]) -> None:
    """N processes that print and sleep 1 s, --no-preload, against the bash loop."""
    env = dict(os.environ)
    env.pop("JAXRUN_NO_PRELOAD", None)
    print(f"many processes, a script that prints and sleeps 1 s, jaxrun --no-preload, {rounds} rounds")
    rows = []
    for n in sizes:
        runs = {
            "jaxrun --no-preload": lambda n=n: wall(JAXRUN + ["-n", str(n), "--no-preload", script], env, timeout=600),
            "bash loop": lambda n=n: wall(bash_loop(script, n, {}), env, timeout=600),
        }
        times = alternate(runs, rounds, log=lambda line, n=n: print(f"  N={n}{line[1:]}", flush=True))
        j, b = median(times["jaxrun --no-preload"]), median(times["bash loop"])
        rows.append((n, f"{j:.2f} s", f"{b:.2f} s", f"{j / b:.2f}", goal_line(f"N={n}", j / b, MANY_GOAL)))
    print(table([row[:4] for row in rows], ("N", "jaxrun --no-preload", "bash loop", "ratio")))
    for row in rows:
        print(row[4])


def draw(sizes, series, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in series.items():
        ax.plot(sizes, values, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("processes (1 CPU device each)")
    ax.set_ylabel("median wall time (s)")
    ax.set_title("Start-to-finish time on 2 cores")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--part", choices=["toy", "scaling", "many", "all"], default="all")
    parser.add_argument("--plot", help="write the scaling curve to this PNG")
    parser.add_argument("--many-rounds", type=int, default=3, help="rounds of the many part (each N=256 round ~30 s)")
    parser.add_argument("--many", default="64,256", help="the many part's process counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "job.py")
        with open(script, "w") as f:
            f.write(BARE_JOB)
        if args.part in ("toy", "all"):
            toy(script, args.rounds)
        if args.part in ("scaling", "all"):
            scaling(script, max(3, args.rounds // 2 + 1), args.plot)
        if args.part in ("many", "all"):
            sleeper = os.path.join(tmp, "sleep.py")
            with open(sleeper, "w") as f:
                f.write(SLEEP_JOB)
            many(sleeper, args.many_rounds, [int(n) for n in args.many.split(",")])


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
