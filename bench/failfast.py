"""Time from one process's death to the end of the whole job: jaxrun vs a bash loop.

    python bench/failfast.py [--runs 3] [--cap 150]

Four controllers with 2 CPU devices each.  Process 3 calls os._exit(7) right
after building its array while the others enter a cross-process sum.  A bare
launch (the guide's bash loop) only ends when JAX's heartbeat timeout fires,
so it is capped: a capped run is reported as "> cap".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

JOB = textwrap.dedent(
    """
    import os, sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    if "JAXRUN_PROCESS_ID" not in os.environ:  # bare launch: initialize by hand
        jax.distributed.initialize(sys.argv[1], int(sys.argv[3]), int(sys.argv[2]))
    rank = jax.process_index()
    mesh = jax.make_mesh((jax.device_count(),), ("i",))
    x = jax.device_put(np.arange(jax.device_count() * 4.0), NamedSharding(mesh, P("i")))
    if rank == 3:
        time.sleep(1.0)
        with open(os.environ["DEATH_FILE"], "w") as f:
            f.write(repr(time.time()))
        os._exit(7)
    print(float(jnp.sum(x)))
    """
)


def free_port() -> int:
    from jaxrun import portable

    return portable.free_port("127.0.0.1")  # below the ephemeral range, as jaxrun's own


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass


def run_jaxrun(script: str, env: dict, cap: float) -> float | None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxrun", "-n", "4", "--cpu-devices", "2", script],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    return wait_and_measure([proc], env["DEATH_FILE"], cap)


def run_bash_loop(script: str, env: dict, cap: float) -> float | None:
    env = dict(env, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2")
    addr = f"127.0.0.1:{free_port()}"
    loop = (
        f"for i in 0 1 2 3; do {sys.executable} {script} {addr} $i 4 >/dev/null 2>&1 & done; wait"
    )
    proc = subprocess.Popen(["bash", "-c", loop], env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    return wait_and_measure([proc], env["DEATH_FILE"], cap)


def wait_and_measure(procs, death_file: str, cap: float) -> float | None:
    start = time.time()
    try:
        for proc in procs:
            proc.wait(timeout=max(0.1, start + cap - time.time()))
        ended = time.time()
    except subprocess.TimeoutExpired:
        return None
    finally:
        for proc in procs:
            kill_group(proc)
    with open(death_file) as f:
        return ended - float(f.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="paired runs (default 3)")
    parser.add_argument("--cap", type=float, default=150.0, help="seconds before a run is given up (default 150)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "job.py")
        with open(script, "w") as f:
            f.write(JOB)
        env = dict(os.environ, DEATH_FILE=os.path.join(tmp, "death"))
        results: dict[str, list[float | None]] = {"jaxrun": [], "bash loop": []}
        for i in range(args.runs):
            for name, runner in (("jaxrun", run_jaxrun), ("bash loop", run_bash_loop)):
                if os.path.exists(env["DEATH_FILE"]):
                    os.unlink(env["DEATH_FILE"])
                took = runner(script, env, args.cap)
                results[name].append(took)
                shown = f"{took:.2f} s" if took is not None else f"> {args.cap:.0f} s (cap)"
                print(f"run {i + 1}: {name:9s} death -> exit {shown}", flush=True)
    print()
    print(f"{'launcher':10s} {'median death -> exit':>22s}")
    medians = {}
    for name, values in results.items():
        capped = [v if v is not None else args.cap for v in values]
        medians[name] = statistics.median(capped)
        note = " (capped)" if any(v is None for v in values) else ""
        print(f"{name:10s} {medians[name]:>20.2f} s{note}")
    print(f"ratio bash loop / jaxrun: {medians['bash loop'] / medians['jaxrun']:.0f}x"
          + (" (at least: the bash loop hit the cap)" if any(v is None for v in results["bash loop"]) else ""))


if __name__ == "__main__":
    main()
