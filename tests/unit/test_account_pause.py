"""The account's looks slow down while the main thread stands parked at one
place (jaxrun.child.watch.accounting): an idle process (a session at its
prompt, a script asleep) paid 1.7% of a core for a look every 20 ms; the
looks come every 20 ms again at the first look that finds it moved."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from jaxrun.child.watch import accounting

from .test_accelerator_time import Frames
from .test_device_backlog import Device

SLEEP = ("/work/train.py", "wait_for_input")
ELSEWHERE = ("/work/train.py", "read_batch")
STEP = ("/site-packages/jax/_src/array.py", "block_until_ready")


def account(device=None):
    clock, used, frames = [0.0], [0.0], Frames(SLEEP)
    found = accounting.Accountant(lambda line: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                  cpu=lambda: used[0], delay=lambda: 0.0, frames=frames, alone=True,
                                  host=lambda: used[0], running=lambda: False, device=device)
    found.clock_now, found.used, found.frames_set = clock, used, frames
    return found


def looks(found, seconds: float, *stack, cpu: float = 0.0) -> list[float]:
    """Look as the sampler does, each after the pause the last one asked for:
    the pauses, for ``seconds`` of the account's clock."""
    found.frames_set.set(*stack)
    pauses, end = [], found.clock_now[0] + seconds
    while found.clock_now[0] < end - 1e-9:
        found.clock_now[0] += found.pause
        found.used[0] += cpu * found.pause
        found.look()
        pauses.append(found.pause)
    return pauses


def test_a_main_thread_parked_at_one_place_is_looked_at_less_often_after_a_second_and_all_its_time_is_idle():
    found = account()
    pauses = looks(found, 5.0, SLEEP)
    fast = [p for p in pauses if p == accounting.TICK]
    assert len(fast) == pytest.approx(accounting.STILL_SLOW / accounting.TICK, abs=2)
    assert pauses[-1] == accounting.STILL_TICK
    assert len(pauses) < 5.0 / accounting.TICK / 2  # 90 looks where 250 were
    assert found.split().idle == pytest.approx(5.0, abs=accounting.STILL_TICK)


@pytest.mark.parametrize("moved", ["to another line", "into JAX", "to its own compute"])
def test_the_looks_come_every_tick_again_at_the_first_look_that_finds_the_main_thread_moved(moved):
    found = account()
    looks(found, 3.0, SLEEP)
    assert found.pause == accounting.STILL_TICK
    if moved == "to another line":
        looks(found, accounting.STILL_TICK, ELSEWHERE)
    elif moved == "into JAX":
        looks(found, accounting.STILL_TICK, STEP, SLEEP)
    else:  # the same line, but it used the CPU since
        looks(found, accounting.STILL_TICK, SLEEP, cpu=0.5)
    assert found.pause == accounting.TICK
    # ... and they slow down only once it stood still another second.
    pauses = looks(found, 2 * accounting.STILL_SLOW, ELSEWHERE)
    assert pauses[:int(accounting.STILL_SLOW / accounting.TICK) - 2] == [accounting.TICK] * (
        int(accounting.STILL_SLOW / accounting.TICK) - 2)


def test_parked_over_a_busy_device_the_looks_keep_their_pace_for_the_probe():
    """The device's probe answers for the host's time outside JAX: while the
    device runs what the script dispatched, the looks keep their pace."""
    busy = account(Device([0.0], lambda t: True))
    busy.device.clock = busy.clock_now
    looks(busy, 3.0, SLEEP)
    assert busy.pause == accounting.TICK
    idle = account(Device([0.0], lambda t: False))
    idle.device.clock = idle.clock_now
    looks(idle, 3.0, SLEEP)
    assert idle.pause == accounting.STILL_TICK


SCRIPT = textwrap.dedent("""
    import json, sys, time
    from jaxrun import contract
    from jaxrun.child.watch import accounting, activity

    looks = []
    real = accounting.Accountant.look

    def look(self):
        looks.append(time.monotonic())
        return real(self)

    accounting.Accountant.look = look
    env = {contract.ACTIVITY_FILE: sys.argv[1], contract.STALL_TIMEOUT: "60"}
    activity.start(env)
    accounting.joined(env)
    start = time.monotonic()
    time.sleep(4.0)
    slept = time.monotonic()
    while time.monotonic() - slept < 1.0:  # computes: looked at every tick again
        sum(range(1000))
    done = time.monotonic()
    account = accounting._started
    split = account.split()
    print(json.dumps({"asleep": sum(1 for t in looks if start < t <= slept), "pause": account.pause,
                      "computing": sum(1 for t in looks if slept < t <= done),
                      "idle": split.idle, "work": split.work}))
    accounting.script_returned()
    activity.script_returned()
""")


def test_a_real_process_asleep_is_looked_at_less_often_and_its_compute_after_is_still_its_work(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "activity")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # 4 s asleep: 50 looks in its first second, then 10 a second (a look every tick: 200).
    assert seen["asleep"] < 110, seen
    # Then 1 s computing: looked at every tick again, and its time is its work.
    assert seen["pause"] == accounting.TICK and seen["computing"] >= 2, seen
    assert seen["idle"] >= 3.5 and seen["work"] >= 0.8, seen
