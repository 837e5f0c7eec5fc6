"""How often jaxrun names the right root cause when a consequence is heard first.

    python bench/root_cause.py [--runs 10] [--burners 3] [--no-preload]

Four controllers with 2 CPU devices each run ``tests/data/root_cause_job.py``:
process 3 ``os._exit(7)``s right after a collective, and process 2 fails at
once because of it (a Gloo "Connection closed by peer").  Right means
jaxrun's status is 7 and the report's root cause is process 3.  The burners
(``while True: pass``) load every core meanwhile.  A wrong run prints what
the report said of each process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "tests" / "data" / "root_cause_job.py"


def one_run(folder: Path, env: dict) -> tuple[bool, str]:
    state, report = folder / "state", folder / "report.json"
    state.mkdir()
    done = subprocess.run([sys.executable, "-m", "jaxrun", "-n", "4", "--cpu-devices", "2", "--log-dir",
                           str(folder / "logs"), "--report", str(report), str(JOB), str(state)],
                          env=env, capture_output=True, text=True, timeout=120)
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return False, f"status {done.returncode}, no report: {done.stderr[-2000:]}"
    cause = (data.get("root_cause") or {}).get("process_id")
    ends = [(p["process_id"], p["verdict"], p["exit_code"], p["signal"], p["reaped_at"]) for p in data["processes"]]
    return done.returncode == 7 and cause == 3, f"status {done.returncode}, root cause {cause}: {ends}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--burners", type=int, default=3)
    parser.add_argument("--no-preload", action="store_true")
    args = parser.parse_args()
    env = dict(os.environ)
    env.pop("JAXRUN_NO_PRELOAD", None)
    if args.no_preload:
        env["JAXRUN_NO_PRELOAD"] = "1"
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    right, began = 0, time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="jaxrun-root-cause-") as tmp:
            for run in range(args.runs):
                folder = Path(tmp) / f"run-{run}"
                folder.mkdir()
                ok, said = one_run(folder, env)
                right += ok
                if not ok:
                    print(f"run {run + 1}: wrong: {said}", flush=True)
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    mode = "--no-preload" if args.no_preload else "preload"
    print(f"{right} of {args.runs} right ({mode}, {args.burners} burners, {time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main()
