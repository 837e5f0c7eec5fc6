"""Open files: the launcher's and each process's peak number of descriptors.

    python bench/fds.py [--sizes 1 4 16] [--no-preload]

Runs ``jaxrun -n N --cpu-devices 1`` on a job whose processes import jax,
run one program and wait 3 s, and counts /proc/PID/fd of jaxrun and of each
of its descendants every 20 ms.  The launcher's figures give the open-file
estimate's parts (``jaxrun/launcher/setup/limits.py``: its own, and each
process's, ``fds_per_process`` in ``jaxrun/backends/table.py``): the slope
between sizes is a process's cost, what is left at -n 1 the launcher's own.
Linux only (/proc).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

import psutil
from common import JAXRUN, table

JOB = """
import time
import jax
jax.numpy.zeros(4).block_until_ready()
time.sleep(3)
"""


def count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def peaks(n: int, script: str, flags: list[str]) -> tuple[int, int, int]:
    """(the launcher's peak, the highest of any descendant's, exit status)."""
    proc = subprocess.Popen([*JAXRUN, "-n", str(n), "--cpu-devices", "1", *flags, script],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    launcher, child = 0, 0
    me = psutil.Process(proc.pid)
    while proc.poll() is None:
        launcher = max(launcher, count(proc.pid))
        try:
            kids = me.children(recursive=True)
        except psutil.Error:
            kids = []
        child = max([child, *(count(kid.pid) for kid in kids)])
        time.sleep(0.02)
    return launcher, child, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--no-preload", action="store_true")
    args = parser.parse_args()
    flags = ["--no-preload"] if args.no_preload else []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "job.py")
        with open(script, "w") as f:
            f.write(JOB)
        rows, found = [], []
        for n in args.sizes:
            launcher, child, code = peaks(n, script, flags)
            if code != 0:
                raise SystemExit(f"-n {n} exited {code}")
            found.append((n, launcher))
            rows.append((str(n), str(launcher), str(child)))
    print(table(rows, ("-n", "launcher's peak", "a process's peak (any descendant)")))
    (n0, l0), (n1, l1) = found[0], found[-1]
    if n1 > n0:
        each = (l1 - l0) / (n1 - n0)
        print(f"each process costs the launcher {each:.1f}; its own (and what was open before): {l0 - each * n0:.0f}")


if __name__ == "__main__":
    main()
