"""Output throughput: 4 processes each writing 50 MB, through jaxrun vs straight to files.

    python bench/output.py [--rounds 3] [--mb 50]

Each writer times its own write loop and records the sha256 of what it wrote.
Throughput is all bytes over the span from the first writer's start to the
last writer's end.  A pipe holds at most 64 KiB, so a writer only finishes
once jaxrun has taken nearly all of its bytes.  Through jaxrun the bytes go to
the per-process log files and, rank-prefixed, to the console (here /dev/null);
every log is checked byte for byte against the writer's digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile

from common import JAXRUN, PYTHON, alternate, median, table, wall

WRITER = """
import hashlib, json, os, random, sys, time
rank = os.environ.get("JAXRUN_PROCESS_ID") or sys.argv[1]
total = int(os.environ["BENCH_BYTES"])
rng = random.Random(int(rank))
alphabet = bytes(range(32, 127))
# 1 MiB of 100-byte text lines, different per process, written over and over.
block = b"".join(bytes(rng.choices(alphabet, k=99)) + b"\\n" for _ in range(10486))[: 1 << 20]
digest = hashlib.sha256()
start = time.time()
left = total
while left:
    piece = block[: min(left, len(block))]
    view = memoryview(piece)
    while view:
        view = view[os.write(1, view[:65536]):]
    digest.update(piece)
    left -= len(piece)
end = time.time()
with open(os.path.join(os.environ["BENCH_DIR"], f"writer-{rank}.json"), "w") as f:
    json.dump({"start": start, "end": end, "sha256": digest.hexdigest()}, f)
"""


def span_and_check(folder: str, logs: list[str]) -> float:
    records = [json.load(open(os.path.join(folder, f"writer-{r}.json"))) for r in range(len(logs))]
    for rank, (rec, log) in enumerate(zip(records, logs)):
        with open(log, "rb") as f:
            got = hashlib.file_digest(f, "sha256").hexdigest()
        if got != rec["sha256"]:
            raise SystemExit(f"process {rank}: log {log} differs from what it wrote")
        os.unlink(log)
    return max(r["end"] for r in records) - min(r["start"] for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=50, help="megabytes per process (default 50)")
    args = parser.parse_args()
    n, total = 4, args.mb * 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "writer.py")
        with open(script, "w") as f:
            f.write(WRITER)
        env = dict(os.environ, BENCH_BYTES=str(total), BENCH_DIR=tmp, JAX_PLATFORMS="cpu")
        spans: dict[str, list[float]] = {"jaxrun": [], "straight to files": []}

        def through_jaxrun() -> float:
            logs = os.path.join(tmp, "logs")
            wall(JAXRUN + ["-n", str(n), "--log-dir", logs, script], env)
            spans["jaxrun"].append(span_and_check(tmp, [os.path.join(logs, f"process-{r}.stdout") for r in range(n)]))
            return spans["jaxrun"][-1]

        def to_files() -> float:
            outs = [os.path.join(tmp, f"direct-{r}.out") for r in range(n)]
            loop = " ".join(f"{PYTHON} {script} {r} > {outs[r]} &" for r in range(n)) + " wait"
            wall(["bash", "-c", loop], env)
            spans["straight to files"].append(span_and_check(tmp, outs))
            return spans["straight to files"][-1]

        alternate({"jaxrun": through_jaxrun, "straight to files": to_files}, args.rounds)
    mb = n * total / 1e6
    rates = {name: mb / median(s) for name, s in spans.items()}
    print(f"{n} processes x {args.mb} MB of text lines, every log byte-exact, {args.rounds} rounds")
    print(table([(name, f"{median(spans[name]):.2f} s", f"{rate:.0f} MB/s") for name, rate in rates.items()],
                ("path", "median span", "throughput")))
    ratio = rates["jaxrun"] / rates["straight to files"]
    print(f"targets: >= 200 MB/s (got {rates['jaxrun']:.0f}), >= 0.8x straight to files (got {ratio:.2f})")


if __name__ == "__main__":
    main()
