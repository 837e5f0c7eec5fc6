"""The run's timeline (docs/inspect.md "The run's timeline"): a real 2-process
JAX job whose process 1 crashes in its first attempt, restarted once
(``--max-restarts 1``), drawn with ``jaxrun logs --trace``.  Every process
and every attempt is in the Chrome trace, and its times are the JSON
report's.  One job serves every check."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from fixtures.jobs import JAXRUN, TOKEN, wait_gone

# Process 1 fails at once in the first attempt while process 0 sleeps (it is
# asked for its stack, then killed); the second attempt runs to its end.
CRASHES_ONCE = '''
import os, sys, time
import jax, jax.numpy as jnp

total = float(jnp.arange(4).sum())
if os.environ["JAXRUN_RESTART_COUNT"] == "0":
    if jax.process_index() == 1:
        time.sleep(0.5)
        sys.exit(3)
    time.sleep(60)
print("done", jax.process_index(), total)
'''
# The trace's life spans begin where slot.started tells the timeline and end
# where slot.ended does; the report's started_at and ended_at are set a few
# lines away, on the same thread (0.1 ms apart here).  0.25 s holds a loaded
# 2-core machine that switches threads in between.
SAME_MOMENT = 0.25
pytestmark = pytest.mark.timeout(180)  # the first test waits for the job: two attempts


@pytest.fixture(scope="module")
def crashed_and_restarted(tmp_path_factory):
    """The job, its report, its timeline's lines and its Chrome trace."""
    tmp = tmp_path_factory.mktemp("timeline")
    script, report, base = tmp / "crashes_once.py", tmp / "report.json", tmp / "logs"
    script.write_text(CRASHES_ONCE)
    run = base / "the-run"
    token = uuid.uuid4().hex  # a module's job, outside the per-test guard: it checks its own
    args = ["-n", 2, "--cpu-devices", 1, "--max-restarts", 1, "--stall-timeout", 3, "--report", report,
            "--log-dir", run, script]
    job = subprocess.Popen([*JAXRUN, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, env={**os.environ, TOKEN: token, "TMPDIR": str(tmp)})
    try:
        _, stderr = job.communicate(timeout=150)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        left = wait_gone(token, within=5.0)
        for proc in left:
            proc.kill()
    assert not left, f"processes outlived the job: {left}"
    assert job.returncode == 0, stderr
    out = tmp / "trace.json"
    drawn = subprocess.run([*JAXRUN, "logs", "--log-dir", base, "--trace", out, "the-run"],
                           capture_output=True, text=True, timeout=60)
    return {"report": json.loads(report.read_text()), "drawn": drawn, "out": out, "run": run,
            "lines": [json.loads(x) for x in (run / "timeline.jsonl").read_text().splitlines()]}


def events(trace: dict, ph: str, **match) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph and all(e.get(k) == v for k, v in match.items())]


def test_logs_trace_writes_the_trace_and_says_how_to_open_it(crashed_and_restarted):
    drawn, out = crashed_and_restarted["drawn"], crashed_and_restarted["out"]
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stdout.splitlines() == [
        f"jaxrun: wrote the timeline of run the-run (2 processes, 2 attempts) to {out}; open it at "
        "https://ui.perfetto.dev (Open trace file) or in chrome://tracing"]


def test_every_process_and_attempt_is_there_with_the_reports_times(crashed_and_restarted):
    report, trace = crashed_and_restarted["report"], json.loads(Path(crashed_and_restarted["out"]).read_text())
    names = {e["pid"]: e["args"]["name"] for e in events(trace, "M", name="process_name")}
    assert names == {0: "jaxrun", 1: "process 0 (localhost)", 2: "process 1 (localhost)"}
    attempts = sorted(events(trace, "X", pid=0, tid=1), key=lambda e: e["ts"])
    assert [a["name"] for a in attempts] == ["attempt 0", "attempt 1"] and len(report["attempts"]) == 2
    for span, attempt in zip(attempts, report["attempts"]):
        # The same moment, written once (the log keeps it to the microsecond: 1 µs either way).
        assert abs(span["ts"] - attempt["began_at"] * 1e6) <= 1
        assert span["args"]["exit_code"] == attempt["exit_code"]
    assert attempts[0]["ts"] + attempts[0]["dur"] <= attempts[1]["ts"]  # in order, one after the other
    for number, attempt in enumerate(report["attempts"]):
        for process in attempt["processes"]:
            lives = [e for e in events(trace, "X", pid=process["process_id"] + 1, name=f"attempt {number}")
                     if e["tid"] == 1]
            assert len(lives) == 1, (number, process["process_id"])
            life = lives[0]
            assert abs(life["ts"] / 1e6 - process["started_at"]) < SAME_MOMENT, (life, process)
            assert abs((life["ts"] + life["dur"]) / 1e6 - process["ended_at"]) < SAME_MOMENT, (life, process)
            assert life["args"]["verdict"] == process["verdict"] and life["args"]["pid"] == process["pid"]
            assert attempts[number]["ts"] <= life["ts"] <= life["ts"] + life["dur"] <= \
                attempts[number]["ts"] + attempts[number]["dur"]
    assert [e["args"]["verdict"] for e in events(trace, "X", pid=2, tid=1)] == ["failed first", "ok"]


def test_the_crash_its_dump_and_the_restart_are_marked(crashed_and_restarted):
    trace = json.loads(Path(crashed_and_restarted["out"]).read_text())
    ends = [e["name"] for e in events(trace, "i", pid=2) if e["name"].startswith("ended")]
    assert ends == ["ended (exit 3)", "ended (exit 0)"]
    assert [e["name"] for e in events(trace, "i", pid=1)].count("stack dump asked") == 1
    assert [e["name"] for e in events(trace, "i", pid=0)] == ["restart"]
    for pid in (1, 2):
        assert [e["name"] for e in events(trace, "i", pid=pid)].count("joined") == 2
        states = events(trace, "X", pid=pid, tid=2)
        lives = events(trace, "X", pid=pid, tid=1)
        assert states and all(any(life["ts"] <= s["ts"] and s["ts"] + s["dur"] <= life["ts"] + life["dur"]
                                  for life in lives) for s in states)


def test_the_log_holds_each_state_change_once(crashed_and_restarted):
    """One line per change, never one per activity sample (a sample every 0.3 s here)."""
    last: dict = {}
    for line in crashed_and_restarted["lines"]:
        if line["event"] == "state":
            key = (line["attempt"], line["rank"], line["life"])
            assert last.get(key) != line["state"], line
            last[key] = line["state"]
    assert set(last.values()) == {"ended"}
    assert any(line["event"] == "state" and line["state"] in ("working", "waiting")
               for line in crashed_and_restarted["lines"])
