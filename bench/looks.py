"""What the account's looks cost on their schedule, in a process asleep and
in one that runs jitted steps.

    python bench/looks.py [--rounds 3] [--seconds 5]

``bench/account.py`` times a look back to back (its caches warm).  A look on
its schedule comes after 20 ms asleep, with its thread to wake and its caches
cold; this bench measures that: each process of a 2-process job reads, for
``--seconds``, the CPU of the sampler's thread (``jaxrun-watch``, its
``schedstat``), its looks, and the whole process's CPU.  Each round runs the
job asleep (``time.sleep``) and busy (a jitted step in a loop), with the
account on (the default) and off (``--no-account``).  Run it with another
checkout's interpreter or ``PYTHONPATH`` for the figures before.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import JAXRUN, bench_script, median, table  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import jax, jax.numpy as jnp

    mode, seconds = sys.argv[1], float(sys.argv[2])
    w, x = jnp.ones((256, 256)), jnp.ones((64, 256))
    step = jax.jit(lambda w, x: jnp.tanh(x @ w).sum())
    float(step(w, x))
    looks = [0]
    try:
        from jaxrun.child.watch import accounting
        real = accounting.Accountant.look

        def look(self):
            looks[0] += 1
            return real(self)

        accounting.Accountant.look = look
    except ImportError:
        pass

    def watch_ns():
        for t in threading.enumerate():
            if t.name == "jaxrun-watch":
                with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                    return int(f.read().split()[0])
        return 0

    def measure():
        time.sleep(2.0)  # the looks' pace settled (an asleep one slows after a second)
        n0, w0, p0, t0 = looks[0], watch_ns(), time.process_time(), time.monotonic()
        time.sleep(seconds)
        n1, w1, p1, t1 = looks[0], watch_ns(), time.process_time(), time.monotonic()
        took = t1 - t0
        print(f"LOOKS {jax.process_index()} {100 * (p1 - p0) / took:.3f} {100 * (w1 - w0) / 1e9 / took:.3f} "
              f"{(n1 - n0) / took:.2f}", flush=True)
        done.set()

    done = threading.Event()
    threading.Thread(target=measure, daemon=True).start()
    while not done.is_set():
        if mode == "busy":
            float(step(w, x))
        else:
            time.sleep(0.5)
    """
)


def job(script: str, mode: str, account: bool, seconds: float) -> list[tuple[float, float, float]]:
    cmd = [*JAXRUN, "-n", "2", "--cpu-devices", "1", *([] if account else ["--no-account"]), script, mode,
           str(seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, start_new_session=True)
    found = re.findall(r"LOOKS \d+ ([\d.]+) ([\d.]+) ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or len(found) != 2:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return [tuple(map(float, f)) for f in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    script = bench_script("looks", "looked_at.py", SCRIPT)
    print(f"2 processes x 1 CPU device, {args.seconds:g} s measured a job, {args.rounds} rounds ({sys.executable})")
    seen: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    for r in range(args.rounds):
        for mode in ("asleep", "busy"):
            for account in (True, False) if r % 2 == 0 else (False, True):
                seen.setdefault((mode, account), []).extend(job(script, mode, account, args.seconds))
        print(f"  round {r + 1}/{args.rounds} done", flush=True)
    rows = []
    for mode in ("asleep", "busy"):
        off = median([s[0] for s in seen[(mode, False)]])
        on = seen[(mode, True)]
        looks = median([s[2] for s in on])
        watch = median([s[1] for s in on])
        rows.append([mode, f"{off:.2f}", f"{median([s[0] for s in on]):.2f}", f"{watch:.2f}", f"{looks:.1f}",
                     f"{10_000 * watch / looks:.0f}" if looks else "-"])
    print(table(rows, ("main thread", "process CPU % off", "on", "sampler thread % (on)", "looks/s",
                       "us of CPU a look")))


if __name__ == "__main__":
    main()
