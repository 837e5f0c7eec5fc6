"""``--timeout`` is one deadline per attempt, on one clock, made before the
attempt is placed: a slow placement and a slow start-up both count, so no
attempt outlives it (docs/options.md).

The backend is the real local one, made slow to place (tests/data/slow_place.py);
the job is real processes that start slowly and then never end.  The
module's three runs overlap (``deadlines``): together they take about half
the time of one after the other.  An attempt's life is timed on jaxrun's own
record, from the start of its placement to its processes' end in the report:
the interpreter's start before it and the reports after it are not the
attempt, and on a loaded machine they took seconds (CI once measured 11.8 s
from outside for a 6.5 s attempt).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.jobs import ROOT

PROBE = os.path.join(ROOT, "tests", "data", "slow_place.py")
# Sleeps before it prints: a start-up that takes its time, then a hang.
SLOW_START = "import time\ntime.sleep(1.5)\nprint('started', flush=True)\ntime.sleep(600)\n"
# The processes get TIMEOUT - PLACE for their start (the interpreter and the
# shim, then the script's 1.5 s sleep), and the stack dumps' wait after it:
# 1 s was too little once on CI, 2 s once (2026-12-04, a loaded machine), and
# 2.5 s once more (2026-12-04: neither process had printed, nor dumped its
# stack, 4 s after its start, while the other pytest worker loaded the
# machine).  SLACK < PLACE keeps a deadline that began after the placement
# in sight, whatever TIMEOUT is.
TIMEOUT = 8.5
PLACE = 4.0
# After --timeout: the stack dumps (TIMEOUT_DUMP_WAIT, 1.5 s) and the kill, on
# a loaded 2-core machine.  Less than PLACE, so that a deadline that started
# after the placement would be seen.
SLACK = 3.5


def run_probe(folder: Path, place: float, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """The run, and when it had ended (``time.time()``, the clock of its "placing at" line)."""
    script = folder / "slow_start.py"
    script.write_text(SLOW_START)
    env = {**os.environ, "PLACE_SECONDS": str(place)}
    done = subprocess.run([sys.executable, PROBE, "-n", "2", "--no-preload", "--timeout", str(TIMEOUT),
                           "--log-dir", str(folder / "logs"), *args, str(script)],
                          env=env, capture_output=True, text=True, timeout=60)
    return done, time.time()


LONG_PLACE = 30.0
# The first slow start's processes begin PLACE s after its launch and import
# jax; the second's placement covers that (see ``deadlines``).
STAGGER = PLACE + 1.0


def job(folder: Path, which: str) -> tuple[subprocess.CompletedProcess, float, Path]:
    folder.mkdir()
    report = folder / "report.json"
    if which == "long":
        return (*run_probe(folder, LONG_PLACE), report)
    return (*run_probe(folder, PLACE, "--max-restarts", which, "--report", str(report)), report)


@pytest.fixture(scope="module")
def deadlines(tmp_path_factory):
    """The module's three runs, overlapped: each is mostly waiting (a slow
    placement, a slow start, a hang).  The cut-short placement starts no
    process and runs beside both others; the second slow start begins
    STAGGER s after the first, in its placement while the first's processes
    start, so that no two starts share the machine (its TIMEOUT - PLACE for
    a start is tight already).  Each run has a folder of its own, and has
    ended (or was killed at 60 s) when the fixture is made; they carry the
    first test's token, so its leak guard finds whatever one left."""
    base = tmp_path_factory.mktemp("deadline")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        runs = {"long": pool.submit(job, base / "long", "long"), "0": pool.submit(job, base / "0", "0")}
        time.sleep(STAGGER)
        runs["1"] = pool.submit(job, base / "1", "1")
        return {which: run.result() for which, run in runs.items()}


@pytest.mark.parametrize("restarts", ["0", "1"])
def test_a_slow_placement_and_a_slow_start_count_against_the_timeout(deadlines, restarts):
    done, _, report = deadlines[restarts]
    assert done.returncode == 124, done.stderr
    assert "placed after" in done.stderr, done.stderr
    # The slow start ended within the deadline: a process's one line, as the
    # console prints it (both, unless a loaded machine held one back past it).
    started = done.stdout.splitlines()
    assert started and set(started) <= {"[0] started", "[1] started"}, done.stdout
    attempts = json.loads(report.read_text())["attempts"]
    assert len(attempts) == 1  # a timeout ends the run, restarts or not (docs/restarts.md)
    placing = float(re.search(r"placing at ([0-9.]+)", done.stderr).group(1))
    lived = max(p["ended_at"] for p in attempts[0]["processes"]) - placing
    assert lived < TIMEOUT + SLACK, f"the attempt outlived --timeout {TIMEOUT:g}: {lived:.1f} s\n{done.stderr}"


def test_a_placement_longer_than_the_timeout_is_cut_short(deadlines):
    done, ended, _ = deadlines["long"]
    assert done.returncode == 124, done.stderr
    assert "stopped during start-up: --timeout; no process was started" in done.stderr
    assert "placed after" not in done.stderr
    # From the placement's start to the run's end, as the module's other test times an attempt: the
    # interpreter's start before it is not the attempt (17 s from outside once, under three pytest workers).
    placing = float(re.search(r"placing at ([0-9.]+)", done.stderr).group(1))
    assert ended - placing < LONG_PLACE / 2, f"{ended - placing:.1f} s: a placement waited out takes all of it"
