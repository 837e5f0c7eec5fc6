"""The launcher's own cost: CPU seconds and peak memory while it carries a chatty job.

    python bench/overhead.py [--seconds 30] [--processes 8]

8 processes each print a line every millisecond for 30 s under jaxrun (with the
preloading server, the default).  The jaxrun process is sampled with psutil
every 0.2 s for CPU time and resident memory; each worker reports its own CPU
time (getrusage) when it finishes.  The preloading server is listed apart: it
forks the workers and then only waits, and most of its memory is shared with
them.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import tempfile
import time

import psutil

from common import JAXRUN

WORKER = """
import json, os, resource, sys, time
end = time.monotonic() + float(os.environ["BENCH_SECONDS"])
i = 0
while time.monotonic() < end:
    print(f"step {i} loss {1.0 / (i + 1):.6f}")
    i += 1
    time.sleep(0.001)
sys.stdout.flush()
use = resource.getrusage(resource.RUSAGE_SELF)
with open(os.path.join(os.environ["BENCH_DIR"], f"cpu-{os.environ['JAXRUN_PROCESS_ID']}.json"), "w") as f:
    json.dump({"cpu": use.ru_utime + use.ru_stime, "lines": i}, f)
"""


def cpu_of(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--processes", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env = dict(os.environ, BENCH_SECONDS=str(args.seconds), BENCH_DIR=tmp, JAX_PLATFORMS="cpu")
        env.pop("JAXRUN_NO_PRELOAD", None)
        launcher = subprocess.Popen(
            JAXRUN + ["-n", str(args.processes), "--log-dir", os.path.join(tmp, "logs"), script],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        me = psutil.Process(launcher.pid)
        cpu = rss = server_cpu = server_rss = 0.0
        while launcher.poll() is None:
            try:
                cpu, rss = cpu_of(me), max(rss, me.memory_info().rss)
                for child in me.children():
                    if "jaxrun.zygote" in " ".join(child.cmdline()):
                        server_cpu = cpu_of(child)
                        server_rss = max(server_rss, child.memory_info().rss)
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.2)
        if launcher.returncode != 0:
            raise SystemExit(f"jaxrun exited {launcher.returncode}")
        workers = [json.load(open(p)) for p in glob.glob(os.path.join(tmp, "cpu-*.json"))]
    job_cpu = sum(w["cpu"] for w in workers)
    lines = sum(w["lines"] for w in workers)
    print(f"{args.processes} processes x one line per ms for {args.seconds:.0f} s: {lines} lines")
    print(f"workers' CPU time:            {job_cpu:.2f} s")
    print(f"jaxrun's CPU time:            {cpu:.2f} s  ({100 * cpu / job_cpu:.1f}% of the job's)")
    print(f"jaxrun's peak RSS:            {rss / 2**20:.1f} MiB")
    print(f"preloading server: CPU {server_cpu:.2f} s, peak RSS {server_rss / 2**20:.1f} MiB (mostly shared with the workers)")
    print(f"targets: launcher <= 2% of the job's CPU (got {100 * cpu / job_cpu:.1f}%), peak RSS <= 60 MB (got {rss / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
