"""The child's marks (child.marks): compiles and checkpoint saves heard from
jax.monitoring and from the script, written for the launcher a few times a
minute at most; and the stall spans the launcher's watch keeps for the
run's goodput."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from jaxrun import contract
from jaxrun.child.watch import marks
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
from jaxrun.launcher.attempt import activity as stall


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def written(path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def test_a_save_is_written_at_once_and_a_burst_within_the_gap_waits_for_it(tmp_path):
    path, clock = tmp_path / "marks", Clock()
    tally = marks.Tally(str(path), clock=clock, gap=2.0)
    tally.heard("/jax/core/compile/backend_compile_duration", 1.25)
    assert written(path)["compile"] == 1.25  # the first news goes at once
    clock.now += 0.5
    tally.heard("/jax/orbax/write/blocking_duration_secs", 0.75)
    tally.step()
    assert written(path)["saves"] == 0 and tally.dirty  # within the gap: held for the writer thread
    clock.now += 2.0
    tally.heard("/jax/core/compile/jaxpr_trace_duration", 0.5)  # past the gap: everything so far
    got = written(path)
    assert got == {"compile": 1.75, "checkpoint": 0.75, "saves": 1, "saved_at": 1000.5, "compile_after_save": 0.5,
                   "steps": 1, "written_at": 1002.5, "clock": tally.host, "runtime_start": 0.0, "input_at": "",
                   "input_at_s": 0.0, "idle_at": "", "idle_at_s": 0.0}
    tally.heard("/jax/some/other_duration", 9.0)  # not a compile or a save: nothing
    assert tally.marks().compile == 1.75 and tally.marks().checkpoint == 0.75


def test_the_writer_thread_writes_what_a_gap_held_back(tmp_path):
    path = tmp_path / "marks"
    tally = marks.Tally(str(path), gap=0.2)
    tally.saved(0.5)
    tally.saved(0.5)  # within the gap
    assert written(path)["saves"] == 1
    threading.Thread(target=tally.run, daemon=True).start()
    for _ in range(100):
        if written(path)["saves"] == 2:
            break
        time.sleep(0.05)
    assert written(path)["saves"] == 2 and not tally.dirty


def test_checkpointing_counts_a_block_that_ends_and_not_one_that_raises(tmp_path, monkeypatch):
    tally = marks.Tally(None)
    monkeypatch.setattr(marks, "_tally", tally)
    with marks.checkpointing():
        pass
    with pytest.raises(ValueError):
        with marks.checkpointing():
            raise ValueError("the save failed")
    marks.checkpoint_saved(2.5)
    assert tally.saves == 2 and tally.checkpoint >= 2.5


LISTENS = """
import os, sys
from jaxrun.child.watch import marks
marks.prepare()
import jax, jax.numpy as jnp
jax.jit(lambda x: x * 2 + 1)(jnp.arange(4.0)).block_until_ready()
jax.monitoring.record_event_duration_secs("/jax/orbax/write/async/blocking_duration_secs", 0.375)
marks.step()
marks.script_ended()
"""


def test_a_real_jax_process_is_heard_through_jax_monitoring(tmp_path):
    """JAX's own compile events, and a save said with Orbax's event name."""
    path = tmp_path / "marks"
    env = {**os.environ, contract.MARKS_FILE: str(path), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", LISTENS], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = contract.Marks.read(str(path))
    assert got is not None and got.compile > 0 and got.saves == 1 and got.checkpoint == 0.375 and got.steps == 1
    # Without the launcher's file (a plain `python script.py`), the helpers only count.
    alone = marks.Tally(None)
    alone.saved(1.0)
    alone.flush()
    assert alone.saves == 1 and list(tmp_path.iterdir()) == [path]


def test_the_watch_keeps_each_span_no_process_moved_in_for_the_timeout_that_ended_still(tmp_path):
    clock, wall = Clock(), Clock()
    specs = [ProcessSpec(r, r, LOCAL_HOST, "python", ("--", "x.py"), {}) for r in range(2)]
    w = stall.ActivityWatch(specs, 10.0, clock, lambda line: None, {0: "", 1: ""}, wall=wall)
    w.heard(0, contract.IDLE)
    wall.now += 30.0  # one still, the other busy: no span
    w.heard(1, contract.IDLE)
    wall.now += 9.0
    w.heard(1, contract.BUSY)  # still for less than the timeout: no span either
    w.heard(1, contract.IDLE)
    began = wall.now
    wall.now += 12.0
    w.heard(0, contract.BUSY)  # still past the timeout, then moved by itself: no stall (a long program)
    assert w.stills == []
    w.heard(0, contract.IDLE)
    wall.now += 11.0
    w.finish()  # a span still open at the end counts up to it
    assert w.stills == [(began + 12.0, began + 23.0)]
    off = stall.ActivityWatch(specs, 0.0, clock, lambda line: None, {0: "", 1: ""}, wall=wall)  # --stall-timeout 0
    off.heard(0, contract.IDLE)
    off.heard(1, contract.IDLE)
    wall.now += 100.0
    off.finish()
    assert off.stills == []
