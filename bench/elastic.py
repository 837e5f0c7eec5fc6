"""How long an elastic restart takes, from a host's death to the job going on.

    python bench/elastic.py [--runs 3]

The scenario of issue #30, as tests/e2e/test_elastic.py runs it: 2 processes
on hostE and hostF with hostG spare, ``--max-restarts 1 --min-hosts 2``,
``examples/resume.py`` on 2 CPU devices per process.  Once the checkpoint has
step 6, hostF goes away (its sshd and every process on it SIGKILLed).  Each
run starts three fresh namespaced sshd hosts (needs root and OpenSSH) and
prints, from the report's clocks and the job's own line:

- noticing: from the death to the end of the failed attempt (its last
  process's end, as jaxrun recorded it);
- checking: from there to the restart's first process start (every host
  checked again over ssh, the spare connected, its coordinator port chosen);
- joining: from there to process 0 resuming (python, jax, the distributed
  rendezvous, the checkpoint read);

and the medians over the runs, with each part's share of the whole.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, table

sys.path[:0] = [str(ROOT / "tests")]
from fixtures import sshd  # noqa: E402 - the suite's SSH hosts

RESUME = str(ROOT / "examples" / "resume.py")
STEPS = 24


def one_run(shared: Path) -> dict[str, float]:
    plans = [sshd.HostPlan(name, address, sshd.free_port(address), name.lower(), hostname_address=address)
             for name, address in sshd.MORTAL.items()]
    down = (sshd.DOWN[0], sshd.DOWN[1], sshd.free_port(sshd.DOWN[1]))
    with sshd.running_hosts(plans, down, cls=sshd.MortalHosts) as hosts, \
            tempfile.TemporaryDirectory(dir=shared) as work:
        work = Path(work)
        ckpt, report = work / "ckpt", work / "report.json"
        ckpt.mkdir()
        job = subprocess.Popen(
            [sys.executable, "-m", "jaxrun", "-n", "2", "--cpu-devices", "2", "-H", "hostE,hostF,hostG",
             "--ssh-config", hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", "RESUME_STEP_SECONDS=0.25",
             "--max-restarts", "1", "--min-hosts", "2", "--log-dir", str(work / "logs"), "--report", str(report),
             RESUME, str(ckpt), str(STEPS)],
            cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while _step(ckpt) < 6:
                if time.monotonic() > deadline or job.poll() is not None:
                    raise SystemExit("the job never reached step 6")
                time.sleep(0.02)
            died = time.time()
            hosts.power_off("hostF")
            out = job.communicate(timeout=180)[0].decode(errors="replace")
        finally:
            if job.poll() is None:
                os.killpg(job.pid, 9)
                job.wait()
        if job.returncode != 0:
            raise SystemExit(f"the job failed ({job.returncode}):\n{out[-3000:]}")
        before, after = json.loads(report.read_text())["attempts"]
    ended = max(p["ended_at"] for p in before["processes"])
    started = min(p["started_at"] for p in after["processes"])
    resumed = float(re.findall(r"process 0 of 2: starting at step \d+ at ([\d.]+)", out)[-1])
    return {"noticing": ended - died, "checking": started - ended, "joining": resumed - started,
            "total": resumed - died}


def _step(ckpt: Path) -> int:
    try:
        return json.loads((ckpt / "latest.json").read_text())["step"]
    except (OSError, ValueError):
        return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0 or not sshd.HAVE_SSH:
        sys.exit("needs root and OpenSSH (the test hosts run namespaced sshd servers)")
    sshd.check_shared_paths()
    sshd.clean_leftovers()
    shared = Path(tempfile.mkdtemp(prefix=f"{sshd.SHARED_PREFIX}{os.getpid()}-", dir=sshd.STATE_BASE))
    runs = []
    for number in range(args.runs):
        runs.append(one_run(shared))
        print(f"run {number + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in runs[-1].items()), flush=True)
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    rows = [(key, f"{value:.2f}", f"{value / medians['total']:.0%}") for key, value in medians.items()]
    print(table(rows, ("from death to restart", "median s", "share")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
