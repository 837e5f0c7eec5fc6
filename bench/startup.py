"""Start-to-finish wall time: jaxrun against the bash loop, mpirun and one process.

    python bench/startup.py [--rounds 5] [--part toy|scaling|all] [--plot bench/scaling.png]

toy:      the guide's toy, 4 processes x 2 CPU devices, for jaxrun (preloading,
          the default), jaxrun --no-preload, the guide's bash loop, mpirun (when
          installed) and one process with 8 devices (the guide's command, which still calls
          initialize(); and the same without that call).
scaling:  N = 1, 2, 4, 8, 16 processes with 1 CPU device each, jaxrun vs the bash loop.

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
    print(f"targets: jaxrun <= 0.5x bash loop (got {med['jaxrun'] / med['bash loop']:.2f}), "
          f"<= 1.3x one process (got {med['jaxrun'] / med['one process, 8 devices']:.2f})")


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
    parser.add_argument("--part", choices=["toy", "scaling", "all"], default="all")
    parser.add_argument("--plot", help="write the scaling curve to this PNG")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "job.py")
        with open(script, "w") as f:
            f.write(BARE_JOB)
        if args.part in ("toy", "all"):
            toy(script, args.rounds)
        if args.part in ("scaling", "all"):
            scaling(script, max(3, args.rounds // 2 + 1), args.plot)


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
