"""What a fresh JAX process spends before its script's first line: the CPU
seconds of ``import jax`` and ``jax.devices()``, and of ``import ml_dtypes``
alone, in new interpreters, alternating with a second set of packages when
``--against DIR`` names one (a folder put first on ``sys.path``, e.g. another
ml_dtypes wheel unpacked there)::

    python bench/jax_import.py --runs 7
    pip download --no-deps -d /tmp/w 'ml_dtypes==0.6.0' && python -m zipfile -e /tmp/w/*.whl /tmp/mld
    python bench/jax_import.py --runs 7 --against /tmp/mld

Every process jaxrun starts without the preloading server (``--no-preload``,
every SSH session agent, Slurm and Open MPI task, Ray actor) pays this once;
with it, once per host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = """\
import json, time
t = time.process_time()
import ml_dtypes
dtypes = time.process_time() - t
import jax
jax.devices()
print(json.dumps({"ml_dtypes": ml_dtypes.__version__, "dtypes_s": dtypes, "jax_s": time.process_time() - t}))
"""


def once(path: str | None) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--against", metavar="DIR", help="a folder of other packages to compare, first on sys.path")
    args = parser.parse_args()
    ways = [None, args.against] if args.against else [None]
    seen: dict = {way: [] for way in ways}
    for _ in range(args.runs):
        for way in ways:  # alternating: the machine's noise falls on both
            seen[way].append(once(way))
    medians = {}
    for way, runs in seen.items():
        jax_s = statistics.median(r["jax_s"] for r in runs)
        dtypes_s = statistics.median(r["dtypes_s"] for r in runs)
        medians[way] = jax_s
        print(f"ml_dtypes {runs[0]['ml_dtypes']:8} ({'installed' if way is None else way}): "
              f"import jax + jax.devices() {jax_s:.2f} s of CPU, of which import ml_dtypes {dtypes_s:.2f} s "
              f"(median of {len(runs)})")
    if args.against:
        print(f"ratio installed / against: {medians[None] / medians[args.against]:.2f}x")


if __name__ == "__main__":
    main()
