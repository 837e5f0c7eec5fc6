"""``jaxrun probe`` on the suite's four slowed hosts, again and again: does it
name exactly the slow link's host and the slow host, every time?

    python bench/probe.py [--runs 10]

The hosts are ``tests/fixtures/slowed.py``'s: four SSH hosts in network
namespaces, hostC's veth limited by tc tbf at both ends, hostD's sshd held
to a fraction of a core.  Each run is ``jaxrun probe --json``; a run passes
when it names hostC (every link slow, not its compute) and hostD (its
compute) and nothing else.  Besides the count, it prints the figures the
rule's thresholds are judged against: the healthy hosts' largest compute
ratio and best-link ratio (how far a good host strays), and the slowed
ones' (how far a bad one stands out).  Needs root, OpenSSH, iproute2's ip
and tc, and the cgroup v1 cpu controller.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]
from fixtures.slowed import slowed_four_hosts  # noqa: E402 - the suite's slowed hosts


def best_ratio(verdict: dict, host: str) -> float:
    """A host's best link against the median of the others' best links (>1: slower)."""
    def best(row):
        return max(link["mb_s"] for link in row["links"].values())
    rows = {row["host"]: row for row in verdict["hosts"]}
    others = statistics.median(best(r) for name, r in rows.items() if name != host)
    return others / best(rows[host])


def passed(verdict: dict) -> bool:
    rows = {row["host"]: row for row in verdict["hosts"]}
    return (list(verdict["named"]) == ["hostC", "hostD"]
            and rows["hostC"]["why"][0].startswith("every link slow")
            and not any(w.startswith("compute") for w in rows["hostC"]["why"])
            and rows["hostD"]["why"][0].startswith("compute")
            and rows["hostA"]["verdict"] == rows["hostB"]["verdict"] == "ok"
            and verdict["slow_links"] == [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the hosts' namespaces, qdiscs and cgroup undone
    good = 0
    with slowed_four_hosts() as slowed, tempfile.TemporaryDirectory() as folder:
        hosts = slowed.hosts_file(Path(folder))
        for i in range(args.runs):
            load = open("/proc/loadavg").read().split()[0]
            start = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "jaxrun", "probe", "--json", "--hosts", str(hosts),
                                   "--ssh-config", str(slowed.hosts.config), "-x", f"PYTHONPATH={ROOT}",
                                   "--cpu-devices", "1", "--log-dir", f"{folder}/run-{i}"],
                                  capture_output=True, text=True, timeout=300)
            took = time.monotonic() - start
            try:
                verdict = json.loads(done.stdout)
            except ValueError:
                print(f"run {i + 1}: exit {done.returncode}, no JSON: {done.stderr[-500:]}")
                continue
            ok = passed(verdict) and done.returncode == 1
            good += ok
            rows = {row["host"]: row for row in verdict["hosts"]}
            print(f"run {i + 1}: {'pass' if ok else 'FAIL'} in {took:.1f} s (load {load}); named {verdict['named']}; "
                  f"compute ratio A {rows['hostA']['compute_ratio']:.2f} B {rows['hostB']['compute_ratio']:.2f} "
                  f"C {rows['hostC']['compute_ratio']:.2f} D {rows['hostD']['compute_ratio']:.2f}; best link "
                  f"A {best_ratio(verdict, 'hostA'):.2f} B {best_ratio(verdict, 'hostB'):.2f} "
                  f"C {best_ratio(verdict, 'hostC'):.1f} D {best_ratio(verdict, 'hostD'):.1f}", flush=True)
    print(f"{good} of {args.runs} runs named exactly hostC and hostD")
    return 0 if good == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
