"""Stack dumps against a process that runs Python: does the dump kill it?

A child (``tests/fixtures/looked_at.py``) keeps two threads and its main
thread busy in Python (calls, a generator, a cached function: calls from C
back into Python), as a job's input pipeline or the time account's thread
do, and is sent SIGUSR1 every millisecond for ``--seconds``.  The two handlers take turns, round by round:

- ``faulthandler``: ``faulthandler.register(SIGUSR1, all_threads=True)``,
  the C handler jaxrun used to install (it reads every thread's frames
  without the GIL);
- ``jaxrun``: ``jaxrun.child.watch.dumps``, what the shim installs now (Python's
  handler wakes a thread that dumps holding the GIL).

Printed: per handler, the runs it survived, the median seconds and asks
until a death, and the dumps written.

    python bench/dumps.py --rounds 5 --seconds 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PYTHON, ROOT  # noqa: E402

sys.path[:0] = [str(ROOT / "tests")]
from fixtures import looked_at  # noqa: E402 - the busy child, the suite's


def one(handler: str, seconds: float, folder: Path) -> tuple[bool, float, int, int]:
    """(survived, seconds it lived under dumps, asks sent, dumps written)."""
    err = folder / f"{handler}.err"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(err, "w") as f:
        child = subprocess.Popen([PYTHON, looked_at.PATH, handler, str(seconds)], stdout=subprocess.PIPE, stderr=f,
                                 env=env, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        start = time.monotonic()
        asks = looked_at.ask_until_gone(child)
        lived = time.monotonic() - start
        code = child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    dumped = err.read_text(errors="replace").count("Current thread 0x")
    return code == 0, lived, asks, dumped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    handlers = ("faulthandler", "jaxrun")
    results: dict[str, list] = {h: [] for h in handlers}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for h in handlers:
                results[h].append(one(h, args.seconds, Path(tmp)))
                survived, lived, asks, dumped = results[h][-1]
                print(f"round {r + 1} {h:12s} {'survived' if survived else 'DIED    '} {lived:5.1f} s, "
                      f"{asks} asks, {dumped} dumps", flush=True)
    print(f"\n{args.rounds} rounds of {args.seconds:g} s, SIGUSR1 every ms, load {os.getloadavg()[0]:.1f}:")
    for h in handlers:
        runs = results[h]
        died = [(lived, asks) for survived, lived, asks, _ in runs if not survived]
        line = f"  {h:12s} survived {len(runs) - len(died)} of {len(runs)}"
        if died:
            line += (f"; died after {statistics.median(d[0] for d in died):.1f} s median "
                     f"({statistics.median(d[1] for d in died):.0f} asks)")
        line += f"; {statistics.median(r[3] for r in runs):.0f} dumps written per run (median)"
        print(line)


if __name__ == "__main__":
    main()
