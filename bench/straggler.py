"""The straggler rule against real jobs: a clean job never named, the two
straggler shapes always, and the gaps the threshold (``GAP``) sits between.

    python bench/straggler.py [--clean 10] [--shaped 2] [--steps 60] [-n 4]

Every job is ``tests/data/straggler_job.py``: each step is 60 ms of Python
input work (counted in loop turns), one jitted program with a collective,
then ``block_until_ready``; ``jaxrun -n 4 --cpu-devices 1 --report``.

- clean: every process's input varies +-10% a step (``--jitter 0.1``);
- host: process 2's input is 60% longer (the others wait at the collective);
- throttled: the same input everywhere, and process 2 held from outside to a
  quarter of a core (a CPU quota on a cgroup of its own, as root).

For each job: whether the report names a straggler (and which), the gap of
each window the rule judged (how much more of their time every other process
waited than the one that waited least: the rule accuses at ``GAP``), and the
others' share of time lost.  The clean jobs' largest window gap and the
straggler jobs' smallest are what ``GAP`` must sit between.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from common import JAXRUN, ROOT, table  # noqa: E402
from fixtures.throttle import can_throttle, find_process, throttled  # noqa: E402

from jaxrun.contract import TimeSplit  # noqa: E402
from jaxrun.launcher.attempt.straggler import GAP, waiting_share  # noqa: E402

JOB = ROOT / "tests" / "data" / "straggler_job.py"


def run(shape: str, steps: int, n: int) -> dict:
    args = {"clean": [str(steps), "60", "--jitter", "0.1"], "host": [str(steps), "60", "2", "1.6"],
            "throttled": [str(steps), "60", "--turns"]}[shape]
    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, "report.json")
        proc = subprocess.Popen([*JAXRUN, "-n", str(n), "--cpu-devices", "1", "--report", report, str(JOB), *args],
                                env={**os.environ, "BENCH_STRAGGLER": folder}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            if shape == "throttled":
                with throttled(find_process(f"jaxrun: process 2/{n} ", f"BENCH_STRAGGLER={folder}", within=60), 0.25):
                    _, err = proc.communicate(timeout=600)
            else:
                _, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"{shape}: exit {proc.returncode}\n{err}")
        with open(report) as f:
            return json.load(f)


def row(shape: str, k: int, data: dict, seconds: float) -> tuple:
    attempt = data["attempts"][-1]
    gaps = [w["gap"] for w in attempt["windows"]]
    least = [w["least"] for w in attempt["windows"]]
    found = data["straggler"]
    named = "-" if found is None else f"{found['rank']} on {found['host']}"
    lost = "-" if found is None else f"{found['lost']:.0%}"
    ratios = "-" if found is None else f"{found['work_ratio']:.1f}x / {found['programs_ratio']:.1f}x"
    shares = "/".join("-" if p["time"] is None else f"{100 * waiting_share(TimeSplit(**p['time'])):.0f}"
                      for p in attempt["processes"])
    return (shape, k, f"{seconds:.0f}", named, lost, ratios, shares, len(gaps), f"{min(gaps, default=0):.3f}",
            f"{max(gaps, default=0):.3f}", "".join("-" if r is None else str(r) for r in least))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clean", type=int, default=10)
    parser.add_argument("--shaped", type=int, default=2, help="runs of each straggler shape")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("-n", type=int, default=4)
    opts = parser.parse_args()
    shapes = ["clean"] * opts.clean + ["host"] * opts.shaped
    if can_throttle():
        shapes += ["throttled"] * opts.shaped
    else:
        print("bench/straggler: not root, or no cgroup v1 cpu controller: the throttled shape is left out")
    rows, named = [], {"clean": 0, "host": 0, "throttled": 0}
    for k, shape in enumerate(shapes):
        began = time.monotonic()
        data = run(shape, opts.steps, opts.n)
        rows.append(row(shape, k, data, time.monotonic() - began))
        print("  ".join(map(str, rows[-1])), flush=True)
        found = data["straggler"]
        named[shape] += found is not None and (shape == "clean" or found["rank"] == 2)
    print(table(rows, ("shape", "run", "s", "named", "others lost", "work/programs vs others", "waiting %", "windows",
                       "least gap", "largest gap", "who waited least, each window")))
    print(f"GAP {GAP}: clean named {named['clean']} of {shapes.count('clean')}; host-shaped named process 2 "
          f"{named['host']} of {shapes.count('host')}; throttled {named['throttled']} of {shapes.count('throttled')}")


if __name__ == "__main__":
    main()
