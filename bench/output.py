"""Output throughput: 4 processes each writing 50 MB, through jaxrun vs straight to files.

    python bench/output.py [--rounds 5] [--mb 50]

Every writer first signals that it is ready, then waits for a common "go", so
start-up (Python's, JAX's, jaxrun's) is left out and all writers run at once.
Throughput is all bytes over the span from "go" to the last writer's end.
Every log is checked byte for byte against the sha256 its writer computed.

Contenders, run alternately:

- straight to files: the bash loop, each process's stdout redirected to a file;
- through a pipe: the bash loop, each process's stdout a pipe that a minimal
  mover (``SPLICER``: a loop of ``splice`` calls, no jaxrun) empties into its
  file.  The floor of any launcher that stands between a process and its
  log, as jaxrun does so that a full log disk never reaches the process:
  each byte is copied twice (into the pipe, from the pipe into the file);
- jaxrun: the default console (every rank, prefixed), read through a pipe by
  this script as a terminal or a CI log would read it;
- jaxrun --console-ranks 0: only process 0 shown, the others in their logs only;
- jaxrun --console-ranks none: logs only.

For the jaxrun rows, "console done" is the time from "go" until the last
console byte arrived, and the console's line count is checked.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import tempfile
import threading
import time

from common import JAXRUN, PYTHON, median, table

WRITER = """
import hashlib, json, os, random, sys, time
rank = os.environ.get("JAXRUN_PROCESS_ID") or sys.argv[1]
total = int(os.environ["BENCH_BYTES"])
folder = os.environ["BENCH_DIR"]
rng = random.Random(int(rank))
alphabet = bytes(range(32, 127))
# 1 MiB of 100-byte text lines, different per process, written over and over.
block = b"".join(bytes(rng.choices(alphabet, k=99)) + b"\\n" for _ in range(10486))[: 1 << 20]
open(os.path.join(folder, f"ready-{rank}"), "w").close()
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.001)
digest = hashlib.sha256()
left = total
while left:
    piece = block[: min(left, len(block))]
    view = memoryview(piece)
    while view:
        view = view[os.write(1, view[:65536]):]
    digest.update(piece)
    left -= len(piece)
end = time.time()
with open(os.path.join(folder, f"writer-{rank}.json"), "w") as f:
    json.dump({"end": end, "sha256": digest.hexdigest()}, f)
"""

# The pipe's floor: what moving a pipe into a file costs with nothing else
# around it (jaxrun's log writer does this, in a thread of the launcher).
SPLICER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
try:
    import fcntl
    fcntl.fcntl(0, fcntl.F_SETPIPE_SZ, 1 << 20)  # the 1 MiB pipe jaxrun's are
except (OSError, AttributeError):
    pass
while os.splice(0, fd, 1 << 20):
    pass
"""

N = 4


class Console:
    """Reads a launcher's stdout as a terminal would: counts lines, notes the last byte's time."""

    def __init__(self, pipe):
        self.pipe, self.lines, self.last = pipe, 0, 0.0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while data := os.read(self.pipe.fileno(), 1 << 20):
            self.lines += data.count(b"\n")
            self.last = time.time()


def run_once(cmd: list[str], env: dict, folder: str, logs: list[str], read_console: bool) -> dict:
    for name in os.listdir(folder):
        if name.startswith(("ready-", "writer-")) or name == "go":
            os.unlink(os.path.join(folder, name))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if read_console else subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    console = Console(proc.stdout) if read_console else None
    try:
        deadline = time.time() + 120
        while sum(os.path.exists(os.path.join(folder, f"ready-{r}")) for r in range(N)) < N:
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"{cmd}: the writers did not all start (exit {proc.poll()})")
            time.sleep(0.005)
        go = time.time()
        open(os.path.join(folder, "go"), "w").close()
        if proc.wait(timeout=300) != 0:
            raise SystemExit(f"{cmd} exited {proc.returncode}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    if console:
        console.thread.join(timeout=30)
    records = [json.load(open(os.path.join(folder, f"writer-{r}.json"))) for r in range(N)]
    lines = []  # as the console shows them: a last partial line gets its own newline
    for rank, (rec, log) in enumerate(zip(records, logs)):
        with open(log, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != rec["sha256"]:
            raise SystemExit(f"process {rank}: log {log} differs from what it wrote")
        lines.append(data.count(b"\n") + (not data.endswith(b"\n")))
        os.unlink(log)
    result = {"span": max(r["end"] for r in records) - go, "lines": lines}
    if console:
        result["console_done"] = console.last - go
        result["console_lines"] = console.lines
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mb", type=int, default=50, help="megabytes per process (default 50)")
    args = parser.parse_args()
    total = args.mb * 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "writer.py")
        with open(script, "w") as f:
            f.write(WRITER)
        splicer = os.path.join(tmp, "splicer.py")
        with open(splicer, "w") as f:
            f.write(SPLICER)
        env = dict(os.environ, BENCH_BYTES=str(total), BENCH_DIR=tmp, JAX_PLATFORMS="cpu")
        logdir = os.path.join(tmp, "logs")
        jaxrun_logs = [os.path.join(logdir, f"process-{r}.stdout") for r in range(N)]
        direct = [os.path.join(tmp, f"direct-{r}.out") for r in range(N)]
        loop = " ".join(f"{PYTHON} {script} {r} > {direct[r]} &" for r in range(N)) + " wait"
        piped = " ".join(f"{PYTHON} {script} {r} | {PYTHON} {splicer} {direct[r]} &" for r in range(N)) + " wait"
        contenders = {
            "straight to files": (["bash", "-c", loop], direct, False, None),
            "through a pipe": (["bash", "-c", piped], direct, False, None),
            "jaxrun": (JAXRUN + ["-n", str(N), "--log-dir", logdir, script], jaxrun_logs, True, N),
            "jaxrun --console-ranks 0": (
                JAXRUN + ["-n", str(N), "--log-dir", logdir, "--console-ranks", "0", script], jaxrun_logs, True, 1),
            "jaxrun --console-ranks none": (
                JAXRUN + ["-n", str(N), "--log-dir", logdir, "--console-ranks", "none", script], jaxrun_logs, False,
                None),
        }
        results: dict[str, list[dict]] = {name: [] for name in contenders}
        for r in range(args.rounds):
            for name, (cmd, logs, read_console, shown) in contenders.items():
                res = run_once(cmd, env, tmp, logs, read_console)
                if shown is not None and res["console_lines"] < sum(res["lines"][:shown]):
                    raise SystemExit(f"{name}: the console showed {res['console_lines']} lines, "
                                     f"expected at least {sum(res['lines'][:shown])}")
                results[name].append(res)
            print(f"  round {r + 1}/{args.rounds}: "
                  + ", ".join(f"{n} {v[-1]['span']:.3f}s" for n, v in results.items()), flush=True)
    mb = N * total / 1e6
    base = mb / median([x["span"] for x in results["straight to files"]])
    rows = []
    for name, runs in results.items():
        rate = mb / median([x["span"] for x in runs])
        done = f"{median([x['console_done'] for x in runs]):.2f} s" if "console_done" in runs[0] else "-"
        span = median([x['span'] for x in runs])
        rows.append((name, f"{span:.3f} s", f"{rate:.0f} MB/s", f"{rate / base:.2f}", done))
    print(f"{N} processes x {args.mb} MB of 100-byte lines, every log byte-exact, {args.rounds} rounds, medians")
    print(table(rows, ("path", "writers' span", "throughput", "ratio", "console done")))
    rate = mb / median([x["span"] for x in results["jaxrun"]])
    floor = mb / median([x["span"] for x in results["through a pipe"]])
    print(f"targets (default jaxrun): >= 200 MB/s (got {rate:.0f}), >= 0.8x straight to files (got {rate / base:.2f}); "
          f"against the pipe's floor: {rate / floor:.2f}x")


if __name__ == "__main__":
    main()
