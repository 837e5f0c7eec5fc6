"""The parting check under repetition (issue 68): healthy jobs never stopped,
and each mistake named, and how soon.

    python bench/parting.py [--runs 20] [--shapes healthy,eval,all-but-0,skip,gather,columns]

Runs tests/data/parting_job.py SHAPE with 4 processes x 2 CPU devices and the
default flags (--checks on, the 600 s stall timeout), one job at a time,
``--runs`` times per shape.  ``healthy`` (a sub-mesh program at two lines and
a process-local program on process 0 beside the global steps, once each
holding a host callback that sleeps 5 s) must exit 0
with no parting said; every other shape must stop with PartedProgramError,
or (where Gloo aborts: ``columns``) with a summary whose first line is the
parting.  For those, the time from the last process's part (the script's clock) to the
first failing process's end (jaxrun's report) is shown: median and worst.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import JAXRUN, ROOT, median  # noqa: E402

SCRIPT = ROOT / "tests" / "data" / "parting_job.py"


def one(shape: str, folder: str) -> tuple[bool, float | None, str]:
    """(as expected, seconds from the part to the stop, what went wrong)."""
    report = os.path.join(folder, "report.json")
    proc = subprocess.run([*JAXRUN, "-n", "4", "--cpu-devices", "2", "--report", report, "--log-dir",
                           os.path.join(folder, "logs"), str(SCRIPT), shape], capture_output=True, text=True,
                          timeout=300, cwd=folder)
    said = "PartedProgramError" in proc.stderr  # stopped by the check
    aborted = "\njaxrun: the processes parted: " in proc.stderr  # Gloo aborted: the summary says it first
    if shape == "healthy":
        ok = proc.returncode == 0 and not said and not aborted
        return ok, None, "" if ok else f"exit {proc.returncode}: {proc.stderr[-600:]}"
    if not (proc.returncode == 1 and said or proc.returncode == 134 and aborted):
        return False, None, f"exit {proc.returncode}, parting said: {said}: {proc.stderr[-600:]}"
    parted = max(float(t) for t in re.findall(r"process \d parts at ([\d.]+)", proc.stdout))
    first = json.loads(open(report).read())["root_cause"]["process_id"]
    ended = json.loads(open(report).read())["processes"][first]["ended_at"]
    return True, ended - parted, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--shapes", default="healthy,eval,all-but-0,skip,gather,columns")
    args = parser.parse_args()
    print(f"{'shape':<10} {'runs':>4} {'as expected':>11} {'median s':>9} {'worst s':>8}")
    for shape in args.shapes.split(","):
        good, took = 0, []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="jaxrun-bench-parting-") as folder:
                ok, seconds, why = one(shape, folder)
            good += ok
            if seconds is not None:
                took.append(seconds)
            if not ok:
                print(f"  {shape}: {why}", file=sys.stderr)
        times = f"{median(took):>9.1f} {max(took):>8.1f}" if took else f"{'-':>9} {'-':>8}"
        print(f"{shape:<10} {args.runs:>4} {good:>11} {times}", flush=True)


if __name__ == "__main__":
    main()
