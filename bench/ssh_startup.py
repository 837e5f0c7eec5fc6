"""Start-to-finish wall time over SSH: jaxrun against one ``ssh`` per process.

    python bench/ssh_startup.py [--rounds 5] [--hosts 2] [--per-host 4]

Starts the test suite's SSH hosts (one namespaced sshd each, with a private
/tmp: see tests/fixtures/sshd.py; needs root and OpenSSH), then runs the
guide's toy job on H hosts x P processes x 1 CPU device:

- jaxrun:               ``jaxrun -H hostA:P,hostB:P ...`` (a preloading server per host);
- jaxrun --no-preload:  the same, each process a fresh interpreter;
- one ssh per process:  the hand-made launch, a bash loop of ``ssh HOST python toy.py i N &``.

The script lives in a folder every host sees at the same path, as with a
shared home.  Contenders run alternately, round after round; the table gives
medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from common import JAXRUN, PYTHON, ROOT, alternate, median, table, wall

sys.path.insert(0, str(ROOT / "tests"))
from fixtures import sshd  # noqa: E402 - the test hosts, reused
from startup import BARE_JOB  # noqa: E402


def host_plans(count: int) -> list:
    plans = []
    for i in range(count):
        name = f"host{chr(ord('A') + i)}"
        address = f"127.0.0.{2 + i}"
        plans.append(sshd.HostPlan(name, address, sshd.free_port(address), f"bench-{name.lower()}",
                                   hostname_address=address))
    return plans


def one_ssh_per_process(hosts, plans, per_host: int, script: str, coordinator: str) -> list[str]:
    """The hand-made launch: every process its own ssh, told its rank."""
    n = len(plans) * per_host
    lines = []
    for rank in range(n):
        plan = plans[rank // per_host]
        remote = shlex.join(["env", "JAX_PLATFORMS=cpu", "JAX_NUM_CPU_DEVICES=1", f"BENCH_MESH={n}",
                             f"BENCH_COORDINATOR={coordinator}", f"PYTHONPATH={ROOT}",
                             PYTHON, script, str(rank), str(n)])
        ssh = shlex.join(["ssh", "-F", str(hosts.config), "-o", "BatchMode=yes", "-T", plan.name, remote])
        lines.append(f"{ssh} >/dev/null 2>&1 &")
    return ["bash", "-c", "\n".join(lines) + "\nfail=0; for j in $(jobs -p); do wait $j || fail=1; done; exit $fail"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--per-host", type=int, default=4)
    args = parser.parse_args()
    if os.geteuid() != 0 or not sshd.HAVE_SSH:
        sys.exit("needs root and OpenSSH (the test hosts run namespaced sshd servers)")
    sshd.check_shared_paths()
    sshd.clean_leftovers()
    plans = host_plans(args.hosts)
    shared = Path(tempfile.mkdtemp(prefix="jaxrun-bench-", dir="/var/tmp"))
    try:
        script = shared / "toy.py"
        script.write_text(BARE_JOB)
        n = args.hosts * args.per_host
        with sshd.running_hosts(plans, ("hostDown", "127.0.0.99", sshd.free_port("127.0.0.99"))) as hosts:
            spread = ",".join(f"{p.name}:{args.per_host}" for p in plans)
            base = dict(os.environ, BENCH_MESH=str(n))
            base.pop("JAXRUN_NO_PRELOAD", None)
            jaxrun = JAXRUN + ["-H", spread, "--ssh-config", str(hosts.config), "-x", f"PYTHONPATH={ROOT}",
                               "-x", "BENCH_MESH", "--cpu-devices", "1", "--log-dir", str(shared / "logs")]

            def hand_made() -> float:
                coordinator = f"{plans[0].address}:{sshd.free_port(plans[0].address)}"
                return wall(one_ssh_per_process(hosts, plans, args.per_host, str(script), coordinator), base)

            contenders = {
                "jaxrun": lambda: wall(jaxrun + [str(script)], base),
                "jaxrun --no-preload": lambda: wall(jaxrun + ["--no-preload", str(script)], base),
                "one ssh per process": hand_made,
            }
            print(f"over SSH: {args.hosts} hosts x {args.per_host} processes x 1 CPU device, {args.rounds} rounds")
            times = alternate(contenders, args.rounds)
        med = {name: median(t) for name, t in times.items()}
        rows = [(name, f"{m:.2f} s", f"{m / med['one ssh per process']:.2f}") for name, m in med.items()]
        print(table(rows, ("launch", "median wall", "vs one ssh per process")))
        print(f"target: jaxrun <= 0.5x one ssh per process (got {med['jaxrun'] / med['one ssh per process']:.2f})")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    main()
