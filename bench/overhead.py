"""The launcher's own cost: CPU seconds and peak memory while it carries a chatty job.

    python bench/overhead.py [--seconds 30] [--processes 8]

8 processes each print a line every millisecond for 30 s under jaxrun (with the
preloading server, the default), the console going to a file, as a CI log would.  When jaxrun
has exited, and before it is reaped, its CPU time and peak resident memory
are read from /proc: CPU from the unreaped process, the peak from VmHWM (a
high-water mark the kernel keeps) while it runs, so nothing between samples is
missed.  Each
worker reports its own CPU time (getrusage) when it finishes.  The preloading
server is sampled with psutil and listed apart: it imports jax once for all
the workers, forks them and then only waits, and most of its memory is shared
with them.  Linux only.
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
from common import JAXRUN, PYTHON, median

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


def final_cpu(pid: int) -> float:
    """CPU seconds of an exited, not yet reaped process: all its threads, none of its children."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def high_water_mark(pid: int) -> float:
    """Peak resident memory so far, in bytes (0 once the process has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


def one_run(args, tmp: str, script: str) -> dict:
    env = dict(os.environ, BENCH_SECONDS=str(args.seconds), BENCH_DIR=tmp, JAX_PLATFORMS="cpu")
    env.pop("JAXRUN_NO_PRELOAD", None)
    for old in glob.glob(os.path.join(tmp, "cpu-*.json")):
        os.unlink(old)
    console = open(os.path.join(tmp, "console.txt"), "wb")
    launcher = subprocess.Popen(
        JAXRUN + ["-n", str(args.processes), "--log-dir", os.path.join(tmp, "logs"), *args.jaxrun_args, script],
        env=env, stdout=console, stderr=subprocess.STDOUT,
    )
    console.close()
    me = psutil.Process(launcher.pid)
    server_cpu = server_rss = rss = 0.0
    while not os.waitid(os.P_PID, launcher.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG):
        rss = max(rss, high_water_mark(launcher.pid))
        try:
            for child in me.children():
                if "jaxrun.backends.forkserver.server" in " ".join(child.cmdline()):
                    server_cpu = cpu_of(child)
                    server_rss = max(server_rss, child.memory_info().rss)
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.2)
    cpu = final_cpu(launcher.pid)
    if launcher.wait() != 0:
        raise SystemExit(f"jaxrun exited {launcher.returncode}")
    workers = [json.load(open(p)) for p in glob.glob(os.path.join(tmp, "cpu-*.json"))]
    job = sum(w["cpu"] for w in workers)
    with open(os.path.join(tmp, "console.txt"), "rb") as f:
        shown = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    if not args.jaxrun_args and shown < sum(w["lines"] for w in workers):
        raise SystemExit(f"the console showed {shown} lines of {sum(w['lines'] for w in workers)}")
    return {"cpu": cpu, "rss": rss, "server_cpu": server_cpu, "server_rss": server_rss, "job": job,
            "lines": sum(w["lines"] for w in workers), "share": cpu / job}


def start_up_cpu(cmd: list[str], runs: int = 9) -> float:
    """Median CPU seconds of a short command, children included."""
    spent = []
    for _ in range(runs):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, _, usage = os.wait4(proc.pid, 0)
        spent.append(usage.ru_utime + usage.ru_stime)
    return median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jaxrun-arg", dest="jaxrun_args", action="append", default=[], metavar="ARG",
                        help="pass ARG to jaxrun (repeatable), e.g. --jaxrun-arg=--console-ranks=0")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        for r in range(args.rounds):
            runs.append(one_run(args, tmp, script))
            x = runs[-1]
            print(f"  round {r + 1}/{args.rounds}: jaxrun {x['cpu']:.2f} s CPU, workers {x['job']:.2f} s "
                  f"({100 * x['share']:.1f}%), peak RSS {x['rss'] / 2**20:.1f} MiB", flush=True)
    no_site = start_up_cpu([PYTHON, "-S", "-c", "pass"])
    bare = start_up_cpu([PYTHON, "-c", "pass"])
    floor = start_up_cpu([PYTHON, "-c", "import click"])
    version = start_up_cpu(JAXRUN + ["--version"])
    share = median([x["share"] for x in runs])
    rss = max(x["rss"] for x in runs)
    print(f"jaxrun {' '.join(args.jaxrun_args)}: {args.processes} processes x one line per ms for {args.seconds:.0f} s "
          f"({median([x['lines'] for x in runs]):.0f} lines), {args.rounds} rounds, medians:")
    print(f"workers' CPU time:            {median([x['job'] for x in runs]):.2f} s")
    with_server = median([x['cpu'] / (x['job'] + x['server_cpu']) for x in runs])
    print(f"jaxrun's CPU time:            {median([x['cpu'] for x in runs]):.3f} s  "
          f"({100 * share:.1f}% of the workers', {100 * with_server:.1f}% of workers + preloading server)")
    print(f"  for context, start-up CPU on this machine: python -S -c pass {1000 * no_site:.0f} ms, "
          f"python -c pass {1000 * bare:.0f} ms (site-packages' .pth hooks run), "
          f"python -c 'import click' {1000 * floor:.0f} ms, jaxrun --version {1000 * version:.0f} ms")
    print(f"jaxrun's peak RSS (highest):  {rss / 2**20:.1f} MiB")
    print(f"preloading server: CPU {median([x['server_cpu'] for x in runs]):.2f} s, peak RSS "
          f"{max(x['server_rss'] for x in runs) / 2**20:.0f} MiB (it imports jax once for all the workers; "
          f"most of its memory is shared with them)")
    print(f"targets: launcher <= 2% of the job's CPU (got {100 * share:.1f}%), "
          f"peak RSS <= 60 MB (got {rss / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
