"""Shared pieces of the benchmarks: run contenders alternately, report medians and ratios."""

from __future__ import annotations

import compileall
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
JAXRUN = [PYTHON, "-m", "jaxrun"]

# Measure jaxrun as installed: pip compiles a package's bytecode at install
# time, but an editable checkout under PYTHONDONTWRITEBYTECODE=1 would be
# compiled from source again by every process, launcher and children alike.
compileall.compile_dir(str(ROOT / "jaxrun"), quiet=1)


def bench_script(bench: str, name: str, text: str) -> str:
    """``text`` written as ``name`` in this run's folder for ``bench``
    (``$TMPDIR/jaxrun-bench-BENCH-PID``, made if need be); its path."""
    folder = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"jaxrun-bench-{bench}-{os.getpid()}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def free_port() -> int:
    from jaxrun import portable

    return portable.free_port("127.0.0.1")  # below the ephemeral range, as jaxrun's own


def wall(cmd: Sequence[str], env: dict | None = None, timeout: float = 300, cwd=None) -> float:
    """Seconds from start to exit of a command; output is discarded; failure raises."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd), env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {err.decode(errors='replace')[-1500:]}")
    return took


def alternate(contenders: dict[str, Callable[[], float]], rounds: int, log=print) -> dict[str, list[float]]:
    """Run each contender once per round, in turn, so that drift in the
    machine's load hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        for name, run in contenders.items():
            times[name].append(run())
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()))
    return times


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(rows: list[tuple], headers: tuple) -> str:
    cells = [tuple(str(c) for c in headers)] + [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


CHECKS_MODES = {"off": "off", "on (default)": "on"}  # a row's name -> --checks


def checks_on_off(run: Callable[[str], float], rounds: int, what: str) -> dict[str, list[float]]:
    """Each round runs a job with ``--checks off`` and one with the default,
    which one first alternating (on a shared machine an A/A run, off against
    off always in one order, differed by 2.3%); ``run(checks)`` gives a job's
    median step in ms.  Prints each round, the table and the 1% goal's
    verdict for ``what`` (a step); returns each row's step times."""
    times: dict[str, list[float]] = {name: [] for name in CHECKS_MODES}
    for r in range(rounds):
        order = list(CHECKS_MODES.items())[::1 if r % 2 == 0 else -1]
        for name, checks in order:
            times[name].append(run(checks))
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {times[n][-1]:.2f} ms" for n, _ in order), flush=True)
    base = median(times["off"])
    rows = [[name, f"{median(ms):.2f}", f"{median(ms) / base:.3f}"] for name, ms in times.items()]
    print(table(rows, ("--checks", "median step ms", "vs off")))
    ratio = median(times["on (default)"]) / base
    print(f"the default checks cost {100 * (ratio - 1):+.2f}% {what}: goal (at most 1%) "
          f"{'met' if ratio <= 1.01 else 'NOT met'}")
    return times


def bash_loop(script: str, n: int, env: dict, extra_args: Sequence[str] = ()) -> list[str]:
    """The guide's launch: n background processes, each told its id, then wait."""
    args = " ".join(extra_args)
    loop = f"for i in $(seq 0 {n - 1}); do {PYTHON} {script} $i {n} {args} > /dev/null 2>&1 & done; wait"
    return ["bash", "-c", loop]


def step_ms(flags: Sequence[str], script: str, *args: object, processes: int = 2, cpu_devices: int = 1) -> float:
    """One job of a training benchmark (``bench/stall.py``'s, ``checks.py``'s,
    ``account.py``'s): jaxrun with ``flags`` runs ``script ARGS``, whose
    process 0 prints ``STEP_MS <median step>``; that median, in ms."""
    cmd = [*JAXRUN, "-n", str(processes), "--cpu-devices", str(cpu_devices), *flags, script, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, start_new_session=True)
    found = re.search(r"STEP_MS ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return float(found[1])
