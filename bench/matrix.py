"""The held-out fault matrix: crash faults, many runs, under CPU overload.

    python bench/matrix.py [--runs 5] [--burners 3] [--backends preload,ssh] [--faults exit,exception,segv]

Runs the cells of tests/e2e/test_matrix.py (the same job, the same checks)
again and again while ``--burners`` busy loops load the machine, and prints,
per backend and fault, how many runs were right: exit status and root cause
both, and every other check of the cell.  Issue #29 found the root cause
wrong in about 1 run in 5 with the preloading server on a loaded machine,
when a process that failed only because its peer was gone was reaped first.

Backends: any of the matrix's that need no pytest fixture (local, preload,
mpirun), and ssh, for which this starts the test suite's two SSH hosts
(tests/fixtures/sshd.py: namespaced sshd servers; needs root and OpenSSH).
Faults: any of the matrix's (``exit``, ``exception``, ``segv``, ``sigterm``,
``tree_sigterm``, ``sigkill``, ``hang``).  The exit status is 1 when a run
was wrong, so that a script can use it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from common import ROOT, table

sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]
import test_matrix as matrix  # noqa: E402 - the suite's cells, run here without pytest
from fixtures import sshd  # noqa: E402 - the suite's SSH hosts


@contextlib.contextmanager
def engine_for(backend: matrix.Backend):
    """What the backend's flags need: the SSH hosts, started here, or nothing."""
    if backend.engine is None:
        if backend.program and not shutil.which(backend.program):
            sys.exit(f"{backend.name}: {backend.program} is not installed")
        yield None
    elif backend.engine == "sshd_hosts":
        if os.geteuid() != 0 or not sshd.HAVE_SSH:
            sys.exit("ssh: needs root and OpenSSH (the test hosts run namespaced sshd servers)")
        sshd.check_shared_paths()
        sshd.clean_leftovers()
        plans = [sshd.HostPlan(name, address, sshd.free_port(address), sshd.HOSTNAMES[name], hostname_address=address)
                 for name, address in sshd.HOSTS.items()]
        with sshd.running_hosts(plans, (sshd.DOWN[0], sshd.DOWN[1], sshd.free_port(sshd.DOWN[1]))) as hosts:
            yield hosts
    else:
        sys.exit(f"{backend.name}: needs the pytest fixture {backend.engine}; run tests/e2e/test_matrix.py for it")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--burners", type=int, default=3, help="busy loops while each cell runs (0: none)")
    parser.add_argument("--backends", default="preload,ssh")
    parser.add_argument("--faults", default=",".join(f.name for f in matrix.CRASHES))
    args = parser.parse_args()
    faults = {f.name: f for f in matrix.FAULTS}
    chosen = [faults[name] for name in args.faults.split(",")]
    backends = [matrix.BY_NAME[name] for name in args.backends.split(",")]
    rows, wrong = [], 0
    base = Path(tempfile.mkdtemp(prefix="jaxrun-bench-", dir="/var/tmp"))  # every SSH test host sees /var/tmp
    try:
        for backend in backends:
            with engine_for(backend) as engine:
                for fault in map(backend.expects, chosen):
                    results = []
                    for run in range(args.runs):
                        folder = base / f"{backend.name}-{fault.name}-{run}"
                        folder.mkdir()
                        token = uuid.uuid4().hex  # finds what the cell left, as the suite's leak guard does
                        with matrix.overload(args.burners) if args.burners else contextlib.nullcontext():
                            seen = matrix.run_cell(backend, engine, fault, folder, token, loaded=args.burners > 0)
                        found = matrix.problems(backend, fault, seen, loaded=args.burners > 0)
                        wrong_note = "" if not found else "  WRONG: " + "; ".join(found)
                        print(matrix.summary(backend, fault, seen) + wrong_note,
                              flush=True)
                        results.append((seen, found))
                    rows.append(row(backend, fault, results))
                    wrong += sum(1 for _, found in results if found)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print(f"{args.runs} runs per cell, {args.burners} CPU burners on {os.cpu_count()} cores")
    print(table(rows, ("backend", "fault", "right", "status+cause right", "statuses", "root causes",
                       "s to the end (median, max)")))
    return 1 if wrong else 0


def row(backend: matrix.Backend, fault: matrix.Fault, results: list) -> tuple:
    def cause(seen):
        return ((seen.report or {}).get("root_cause") or {}).get("process_id")

    both = sum(1 for seen, _ in results if seen.status == fault.status and cause(seen) == fault.root)
    took = [seen.took for seen, _ in results if seen.took is not None]
    times = f"{statistics.median(took):.1f}, {max(took):.1f}" if took else "-"
    return (backend.name, fault.name, f"{sum(1 for _, found in results if not found)}/{len(results)}",
            f"{both}/{len(results)}", " ".join(str(seen.status) for seen, _ in results),
            " ".join(str(cause(seen)) for seen, _ in results), times)


if __name__ == "__main__":
    sys.exit(main())
