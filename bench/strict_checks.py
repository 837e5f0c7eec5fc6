"""How often ``--checks strict`` stops a short job whose processes' programs
differ in their body only (a per-process constant): it must be every time.

    python bench/strict_checks.py [--runs 50] [--at-once 5] [--overload 4]

The job is the test's own (``tests/data/checks_programs_job.py constant``,
2 processes of 2 CPU devices, a few seconds): its one program differs, and
the job ends right after it.  The runs go ``--at-once`` at a time, beside
``--overload`` busy loops (0: none).  It prints how many runs stopped with
exit 1 and named the program, and each other exit status seen.  The verdict
must never depend on how the processes' ends fall (issue 69: 11 of 12 beside
other jobs, before the board read a finished peer's entry again).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from common import JAXRUN, ROOT

JOB = ROOT / "tests" / "data" / "checks_programs_job.py"


def one(_: int) -> tuple[int, bool]:
    run = subprocess.run([*JAXRUN, "-n", "2", "--cpu-devices", "2", "--checks", "strict", str(JOB), "constant"],
                         capture_output=True, text=True, timeout=300)
    return run.returncode, "ProgramMismatchError: program 1 of processes 0,1 differs (body)" in run.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--at-once", type=int, default=5)
    parser.add_argument("--overload", type=int, default=0, help="busy loops beside the runs")
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.overload)]
    try:
        with ThreadPoolExecutor(args.at_once) as pool:
            results = list(pool.map(one, range(args.runs)))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    stopped = sum(1 for code, named in results if code == 1 and named)
    others = collections.Counter(code for code, named in results if not (code == 1 and named))
    print(f"stopped and named: {stopped} of {args.runs} (at once {args.at_once}, busy loops {args.overload})")
    if others:
        print("otherwise: " + ", ".join(f"exit {code} x{n}" for code, n in sorted(others.items())))
    print("goal (every run stopped): " + ("met" if stopped == args.runs else "not met"))


if __name__ == "__main__":
    main()
