"""What a restart pays for its compiles, with the attempts' shared compile cache and without.

    python bench/compile_cache.py [--rounds 3] [-n 2] [--steps 3000]

Each job runs under ``jaxrun --max-restarts 1``.  Every process compiles one
straight-line program of ``--steps`` sin/cos steps (a few seconds of XLA's
time on CPU), and times ``.compile()`` alone (tracing and lowering, which no
cache saves, are printed apart).  In attempt 0 the processes then meet at a
barrier and process 0 raises, so the job restarts, and attempt 1 compiles
the same program again.  Two contenders, run alternately: jaxrun's default
(the attempts share a cache in the run's log folder), and the same run with
JAX's cache turned off (``-x JAX_ENABLE_COMPILATION_CACHE=false``).

The table shows, per contender, the median over the rounds of each
attempt's compile and of the ratio restart/first: for process 0, which
writes the cache and so can hit it, and for the others (their median), which
on CPU never hit it (the key holds the device assignment; on GPU it does
not, and they hit too).  The goal: process 0's restart compile at most half
its first.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import JAXRUN, median, table  # noqa: E402

PROGRAM = textwrap.dedent(
    """
    import os, sys, time
    import jax, jax.numpy as jnp
    from jax.experimental import multihost_utils

    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)

    steps = int(sys.argv[1])

    def chain(x):
        for i in range(steps):
            x = jnp.sin(x) * 0.999 + jnp.cos(x * (1 + i % 5))
        return x

    attempt, rank = int(os.environ["JAXRUN_RESTART_COUNT"]), jax.process_index()
    x = jnp.ones((16,), jnp.float32)
    start = time.perf_counter()
    lowered = jax.jit(chain).lower(x)
    traced = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    compiled(x).block_until_ready()
    print(f"COMPILE attempt={attempt} process={rank} compile={done - traced:.3f} lower={traced - start:.3f} "
          f"hit={len(hits)}", flush=True)
    if attempt == 0:
        multihost_utils.sync_global_devices("compiled")  # every process has timed its compile
        if rank == 0:
            raise RuntimeError("attempt 0 fails after its compile, as a fault would")
    """
)

CONTENDERS = {
    "shared cache": (),
    "no cache": ("-x", "JAX_ENABLE_COMPILATION_CACHE=false"),
}
LINE = re.compile(r"COMPILE attempt=(\d+) process=(\d+) compile=([\d.]+) lower=([\d.]+) hit=(\d+)")


def run_job(script: str, folder: str, n: int, steps: int, extra: tuple[str, ...]) -> dict[tuple[int, int], tuple]:
    """One job of two attempts: (attempt, process) -> (compile s, lower s, hits)."""
    logs = tempfile.mkdtemp(prefix="logs-", dir=folder)
    cmd = [*JAXRUN, "-n", str(n), "--cpu-devices", "1", "--max-restarts", "1",
           "--log-dir", logs, *extra, script, str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = {(int(a), int(p)): (float(c), float(lo), int(h)) for a, p, c, lo, h in LINE.findall(proc.stdout)}
    if len(found) != 2 * n or proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}, {len(found)} timings:\n{proc.stderr[-2000:]}")
    shutil.rmtree(logs, ignore_errors=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    if args.n < 2:
        parser.error("-n must be at least 2: process 0 and the others are compared")
    folder = tempfile.mkdtemp(prefix="jaxrun-bench-cache-")
    script = os.path.join(folder, "chain.py")
    with open(script, "w") as f:
        f.write(PROGRAM)
    print(f"{args.n} processes x 1 CPU device, {args.steps} steps, {args.rounds} rounds", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    for r in range(args.rounds):
        for name, extra in CONTENDERS.items():
            runs[name].append(run_job(script, folder, args.n, args.steps, extra))
            t = runs[name][-1]
            print(f"  round {r + 1}/{args.rounds} {name}: process 0 {t[0, 0][0]:.2f}s -> {t[1, 0][0]:.2f}s "
                  f"(hits {t[1, 0][2]}), process 1 {t[0, 1][0]:.2f}s -> {t[1, 1][0]:.2f}s", flush=True)
    rows = []
    for name, jobs in runs.items():
        others = range(1, args.n)
        first0, again0 = median([j[0, 0][0] for j in jobs]), median([j[1, 0][0] for j in jobs])
        ratio0 = median([j[1, 0][0] / j[0, 0][0] for j in jobs])
        first_o = median([median([j[0, p][0] for p in others]) for j in jobs])
        again_o = median([median([j[1, p][0] for p in others]) for j in jobs])
        ratio_o = median([median([j[1, p][0] / j[0, p][0] for p in others]) for j in jobs])
        lower = median([j[a, p][1] for j in jobs for a in (0, 1) for p in range(args.n)])
        rows.append([name, f"{first0:.2f}", f"{again0:.2f}", f"{ratio0:.2f}", f"{first_o:.2f}", f"{again_o:.2f}",
                     f"{ratio_o:.2f}", f"{lower:.2f}"])
    print(table(rows, ("contender", "p0 first s", "p0 restart s", "p0 restart/first", "others first s",
                       "others restart s", "others restart/first", "lowering s")))
    shared = median([j[1, 0][0] / j[0, 0][0] for j in runs["shared cache"]])
    print(f"process 0's restart compile / first, shared cache: {shared:.2f} (goal: at most 0.50) "
          f"{'PASS' if shared <= 0.5 else 'FAIL'}")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
