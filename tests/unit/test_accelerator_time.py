"""Where the time goes on an accelerator (issue 71): the device's time is
the programs', not a wait, in a process that waits for nobody; the runtime's
start (JAX making its first backend, about 10 s on a TPU host, inside the
script's first trace or compile) is start-up, neither compile nor work."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from jaxrun import contract
from jaxrun.child.watch import accounting, marks, place
from jaxrun.reporting.goodput import PARTS, AttemptFacts, account


class Frames:
    """The main thread's stack as the accountant's walk sees it: innermost first."""

    def __init__(self, *stack: tuple[str, str]):
        self.set(*stack)

    def set(self, *stack: tuple[str, str]) -> None:
        frame = None
        for filename, name in reversed(stack):
            code = compile(f"def {name}(): pass", filename, "exec").co_consts[0]
            frame = type("Frame", (), {"f_code": code, "f_back": frame, "f_lasti": 0, "f_lineno": 1})()
        self.frame = frame

    def __call__(self):
        return {1: self.frame}


SCRIPT = ("/work/train.py", "main")
STEP = ("/site-packages/jax/_src/array.py", "block_until_ready")
RUNTIME = ("/site-packages/jax/_src/xla_bridge.py", "_init_backend")
TRACE = ("/site-packages/jax/_src/interpreters/partial_eval.py", "trace_to_jaxpr")
COMPILER = ("/site-packages/jax/_src/compiler.py", "compile_or_get_cached")


def ticks(account, frames, stack, n, seconds=0.02, cpu=None):
    frames.set(*stack)
    for _ in range(n):
        account.clock_now[0] += seconds
        if cpu is not None:
            account.used[0] += cpu
        account.look()


def accountant(alone: bool) -> accounting.Accountant:
    frames = Frames(SCRIPT)
    clock, used = [0.0], [0.0]
    found = accounting.Accountant(lambda line: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                  cpu=lambda: used[0], delay=lambda: 0.0, frames=frames, alone=alone,
                                  host=lambda: used[0], running=lambda: False)
    found.clock_now, found.used, found.frames_set = clock, used, frames
    return found


@pytest.mark.parametrize("alone, programs, waiting", [(True, 1.0, 0.0), (False, 0.0, 1.0)])
def test_a_process_alone_waits_for_nobody_its_hosts_wait_is_its_device_programs(alone, programs, waiting):
    """The host blocks in block_until_ready, using no CPU, while the chip
    runs the step: alone in its job, that is the device's time."""
    found = accountant(alone)
    ticks(found, found.frames_set, (STEP, SCRIPT), 50)
    split = found.split()
    assert (split.programs, split.waiting) == pytest.approx((programs, waiting))


def test_the_runtimes_start_inside_a_trace_or_a_compile_is_no_part_of_the_split():
    found = accountant(alone=True)
    ticks(found, found.frames_set, (SCRIPT,), 10, cpu=0.02)  # 0.2 s of the script's own compute
    ticks(found, found.frames_set, (RUNTIME, TRACE, SCRIPT), 250)  # 5 s: the TPU runtime's start, in a trace
    ticks(found, found.frames_set, (RUNTIME, COMPILER, SCRIPT), 250)  # 5 s more, in a compile
    ticks(found, found.frames_set, (COMPILER, SCRIPT), 50)  # 1 s of compile
    ticks(found, found.frames_set, (STEP, SCRIPT), 100)  # 2 s of steps
    split = found.split()
    assert split.work == pytest.approx(0.2) and split.compile == pytest.approx(1.0)
    assert split.programs == pytest.approx(2.0) and split.waiting == 0.0
    assert split.covered == pytest.approx(3.2)  # the parts, to a tick: the 10 s of start left out
    assert split.began == pytest.approx(110.0)  # ... and the account's clock moved past them


def test_the_runtimes_start_is_bounded_by_jax_so_the_watchdog_takes_it_for_work():
    code = compile("def _init_backend(): pass", RUNTIME[0], "exec").co_consts[0]
    assert place.code_place(code) == place.STARTING
    assert place.busy_place(((code, 0),))
    other = compile("def backends(): pass", RUNTIME[0], "exec").co_consts[0]
    assert place.code_place(other) == place.INSIDE and not place.busy_place(((other, 0),))


def test_a_compile_event_that_held_the_runtimes_start_counts_only_its_own_time():
    tally = marks.Tally(None, clock=lambda: 100.0)
    tally.runtime_started(10.0, 19.5)  # the runtime started in 9.5 s ...
    tally.heard("/jax/core/compile/jaxpr_trace_duration", 10.0, now=20.0)  # ... inside this trace
    tally.heard("/jax/core/compile/backend_compile_duration", 1.2, now=21.2)  # a compile after it
    tally.heard("/jax/core/compile/jaxpr_trace_duration", 0.3, now=5.0)  # one before it
    found = tally.marks()
    assert found.compile == pytest.approx(0.5 + 1.2 + 0.3)
    assert found.runtime_start == pytest.approx(9.5)
    assert contract.Marks.from_dict(json.loads(marks.json_line(found))) == found
    old = {k: v for k, v in found.to_dict().items() if k != "runtime_start"}  # a far end of the last version
    assert contract.Marks.from_dict(old).runtime_start == 0.0


def test_the_runtimes_start_after_the_join_is_start_up_in_the_goodput():
    found = account(0.0, 40.0, [AttemptFacts(0.0, 3.0, 39.0, 40.0, compile=1.2, runtime_start=10.0)])
    assert found.parts["startup"] == pytest.approx(13.0)
    assert found.parts["compile"] == pytest.approx(1.2)
    assert found.parts["work"] == pytest.approx(39.0 - 3.0 - 10.0 - 1.2)
    assert set(found.parts) == set(PARTS) and sum(found.parts.values()) == pytest.approx(40.0)


TIMED = textwrap.dedent("""
    import sys, time
    from jaxrun.child.watch import marks
    tally = marks.Tally(None)
    marks._the_tally = lambda: tally
    import jax
    marks._listen(jax)
    jax.devices()
    print(tally.marks().runtime_start, tally.marks().compile)
""")


def test_a_real_jax_processes_backend_start_is_timed_apart():
    out = subprocess.run([sys.executable, "-c", TIMED], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    started, compiled = map(float, out.stdout.split())
    assert started > 0.0 and compiled == 0.0
