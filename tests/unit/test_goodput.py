"""The run's goodput (reporting.goodput): the pure split of the run's wall
time into its parts, the facts it reads from each attempt's Outcome, the
summary line, and the timeline's row.  The real job is tests/e2e/test_goodput.py."""

from __future__ import annotations

import math
import random

import pytest

from jaxrun import contract
from jaxrun.core import causes
from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason
from jaxrun.core.spec import LOCAL_HOST, Host, ProcessSpec
from jaxrun.reporting import goodput, timeline
from jaxrun.reporting.goodput import PARTS, AttemptFacts, account, host_line


def sums_to_wall(found: goodput.Account) -> None:
    assert set(found.parts) == set(PARTS)
    assert all(s >= 0 for s in found.parts.values()), found.parts
    assert math.isclose(sum(found.parts.values()), found.wall, abs_tol=1e-9), found.parts


def test_a_clean_attempt_from_jaxrun_s_start():
    # jaxrun starts at 0, its attempt begins at 1 and joins at 4; 10 s of
    # compiles, saves and work, then 1 s of JAX's shutdown and 0.5 s of reports.
    found = account(0.0, 15.5, [AttemptFacts(1.0, 4.0, 14.0, 15.0, compile=1.5, checkpoint=0.5)])
    sums_to_wall(found)
    assert found.parts == {"startup": 4.0, "compile": 1.5, "work": 8.0, "input": 0.0, "idle": 0.0, "waiting": 0.0,
                           "checkpoint": 0.5, "stall": 0.0, "restart": 0.0, "lost": 0.0, "teardown": 1.5}
    assert found.share == pytest.approx(8.0 / 15.5)
    assert found.unsaved == ()


def test_a_crash_after_a_save_loses_the_work_since_and_the_restart_s_gap_is_its_own():
    first = AttemptFacts(0.0, 3.0, 20.0, 21.0, failed=True, compile=1.0, checkpoint=0.6, saved_at=17.0,
                         compile_after_save=0.5, stills=((18.0, 19.0),))
    second = AttemptFacts(23.0, 26.0, 35.0, 36.0, compile=0.2, checkpoint=0.6, attempt=1)
    found = account(0.0, 36.0, [first, second])
    sums_to_wall(found)
    # 3 s after the save, less its 0.5 s compile and 1 s stall: 1.5 s done again
    assert found.parts["lost"] == pytest.approx(1.5)
    assert found.parts["restart"] == pytest.approx(2.0)
    assert found.parts["stall"] == pytest.approx(1.0)
    assert found.parts["startup"] == pytest.approx(6.0)
    assert found.parts["work"] == pytest.approx(17 - 1.6 - 1.0 - 1.5 + 9 - 0.8)
    # The timeline draws the lost work as long as it counts, up to the crash,
    # after the save; the work's span runs up to it.
    assert ("lost", 18.5, 20.0, 0) in found.spans and ("restart", 21.0, 23.0, 1) in found.spans
    assert ("work", 3.0, 18.5, 0) in found.spans
    assert ("stall", 18.0, 19.0, 0) in found.spans


def test_without_a_save_the_failed_attempt_s_work_is_lost_and_said_so():
    first = AttemptFacts(0.0, 2.0, 12.0, 12.5, failed=True, compile=1.0)
    found = account(0.0, 20.0, [first, AttemptFacts(13.0, 15.0, 19.0, 19.5, attempt=1)])
    sums_to_wall(found)
    assert found.parts["lost"] == pytest.approx(9.0)  # all of it but the compile
    assert found.unsaved == (0,)
    assert "no checkpoint seen in attempt 0: its work counted as lost" in goodput.summary_line(found)
    # A save outside the attempt's work (an earlier attempt's) is no save of its own.
    moved = account(0.0, 20.0, [AttemptFacts(0.0, 2.0, 12.0, 12.5, failed=True, saved_at=1.0),
                                AttemptFacts(13.0, 15.0, 19.0, 19.5, attempt=1)])
    assert moved.unsaved == (0,) and moved.parts["lost"] == pytest.approx(10.0)


def test_a_failure_nothing_restarts_redoes_nothing():
    found = account(0.0, 12.0, [AttemptFacts(0.0, 2.0, 10.0, 11.0, failed=True)])
    sums_to_wall(found)
    assert found.parts["lost"] == 0 and found.parts["work"] == 8.0 and found.unsaved == ()


def test_a_failure_in_start_up_has_no_work_to_lose():
    found = account(0.0, 12.0, [AttemptFacts(0.0, None, 3.0, 3.5, failed=True),
                                AttemptFacts(4.0, 6.0, 11.0, 11.5, attempt=1)])
    sums_to_wall(found)
    assert found.parts["startup"] == pytest.approx(5.0) and found.unsaved == () and found.parts["lost"] == 0


def test_stalls_count_once_and_only_inside_the_work():
    stills = ((1.0, 5.0), (4.0, 8.0), (7.0, 9.0), (12.0, 30.0))  # overlapping; one reaches past the work
    found = account(0.0, 20.0, [AttemptFacts(0.0, 3.0, 15.0, 16.0, stills=stills)])
    sums_to_wall(found)
    assert found.parts["stall"] == pytest.approx((9.0 - 3.0) + (15.0 - 12.0))
    assert [s for s in found.spans if s[0] == "stall"][-1] == ("stall", 12.0, 15.0, 0)


def test_waiting_comes_out_of_the_work_and_out_of_the_lost_work_in_proportion():
    first = AttemptFacts(0.0, 0.0, 10.0, 10.0, failed=True, waiting=2.0, saved_at=5.0)
    found = account(0.0, 20.0, [first, AttemptFacts(10.0, 10.0, 20.0, 20.0, attempt=1)])
    sums_to_wall(found)
    assert found.parts["waiting"] == pytest.approx(2.0)
    assert found.parts["lost"] == pytest.approx(5.0 - 1.0)


def test_parts_larger_than_their_time_are_capped_and_work_is_never_negative():
    found = account(0.0, 10.0, [AttemptFacts(0.0, 2.0, 8.0, 9.0, compile=5.0, checkpoint=5.0, waiting=5.0)])
    sums_to_wall(found)
    assert found.parts["compile"] == 5.0 and found.parts["checkpoint"] == pytest.approx(1.0)
    assert found.parts["waiting"] == 0.0 and found.parts["work"] == 0.0


def test_times_out_of_order_are_clamped_and_still_sum_to_the_wall():
    rng = random.Random(57)
    for _ in range(500):
        facts, t = [], rng.uniform(-5, 5)
        for n in range(rng.randint(0, 4)):
            times = [t + rng.uniform(-3, 30) for _ in range(5)]
            facts.append(AttemptFacts(times[0], rng.choice([None, times[1]]), times[2], times[3],
                                      failed=rng.random() < 0.5, compile=rng.uniform(-1, 8),
                                      checkpoint=rng.uniform(0, 8), waiting=rng.uniform(0, 8),
                                      saved_at=rng.choice([None, times[4]]), compile_after_save=rng.uniform(0, 3),
                                      stills=tuple((a, a + rng.uniform(0, 9)) for a in times[:rng.randint(0, 3)]),
                                      attempt=n))
            t = max(times)
        found = account(0.0, max(t, 0.0) + rng.uniform(0, 5), facts)
        sums_to_wall(found)
        for part, begin, end, _ in found.spans:
            assert 0.0 <= begin < end <= found.wall + 1e-9, (part, begin, end)


def test_the_restart_s_time_and_the_last_teardown_are_in_the_account():
    """A mutation that drops the restart's gap (or the time after the last
    attempt) leaves the parts short of the wall."""
    found = account(100.0, 130.0, [AttemptFacts(100.0, 101.0, 110.0, 111.0, failed=True, saved_at=110.0),
                                   AttemptFacts(118.0, 119.0, 128.0, 128.5, attempt=1)])
    sums_to_wall(found)
    assert found.parts["restart"] == pytest.approx(7.0)
    assert found.parts["teardown"] == pytest.approx(1.0 + 0.5 + 1.5)
    assert found.losses()[0] == ("restart", pytest.approx(7.0))


def spec(rank: int, host: Host = LOCAL_HOST) -> ProcessSpec:
    return ProcessSpec(rank, rank, host, "python", ("--", "x.py"), {})


def record(rank: int, **kw) -> ProcessRecord:
    return ProcessRecord(spec(rank), "o", "e", "j", pid=100 + rank, **kw)


def marks(**kw) -> contract.Marks:
    return contract.Marks(**{"clock": causes.clock_id(), **kw})


def test_an_attempt_s_facts_from_its_outcome():
    records = [record(0, started_at=11.0, joined_at=13.0, ended_at=30.0,
                      marks=marks(compile=2.0, checkpoint=0.6, saves=2, saved_at=25.0, compile_after_save=0.1)),
               record(1, started_at=11.0, joined_at=14.0, ended_at=29.0, returncode=1,
                      marks=marks(compile=2.5, checkpoint=0.5, saves=2, saved_at=25.5))]
    outcome = Outcome(records, 1, StopReason.FAILURE, root_cause=1, began_at=10.0, stills=((20.0, 22.0),))
    found = goodput.attempt_facts(outcome, {0: 0.0, 1: 3.0})
    assert found == AttemptFacts(10.0, 14.0, 29.0, 30.0, failed=True, compile=2.5, checkpoint=0.6, waiting=1.5,
                                 saved_at=25.5, compile_after_save=0.0, stills=((20.0, 22.0),))


def test_a_clean_attempt_s_work_ends_when_the_scripts_returned():
    records = [record(r, joined_at=2.0, finished_at=8.0 + r, ended_at=10.0, returncode=0) for r in (0, 1)]
    found = goodput.attempt_facts(Outcome(records, 0, None, began_at=1.0))
    assert (found.work_ended_at, found.failed, found.joined_at) == (9.0, False, 2.0)
    # One never joined: the attempt's start-up never ended; nobody said it returned: the first end.
    records[1].joined_at = records[1].finished_at = None
    found = goodput.attempt_facts(Outcome(records, 0, None, began_at=1.0))
    assert (found.joined_at, found.work_ended_at) == (None, 10.0)


def test_a_join_is_the_process_s_own_not_when_a_loaded_launcher_heard_it():
    """Each process's account began at its join (``TimeSplit.began``): the
    launcher heard it 0.3 s later.  Never later than heard, never before the
    attempt began, and from a far clock only where something places it."""
    def split(began: float) -> contract.TimeSplit:
        return contract.TimeSplit(began, 1.0, 1.0, 0.0, 0.0, 0.0)

    records = [record(r, joined_at=5.3, finished_at=9.0, ended_at=10.0, returncode=0, clock=causes.clock_id())
               for r in (0, 1)]
    outcome = Outcome(records, 0, None, began_at=1.0, splits={0: split(4.9), 1: split(5.0)})
    assert goodput.attempt_facts(outcome).joined_at == 5.0
    outcome.splits = {0: split(4.9), 1: split(6.0)}  # a clock ahead: what was heard
    assert goodput.attempt_facts(outcome).joined_at == 5.3
    outcome.splits = {0: split(0.2), 1: split(0.5)}  # behind the attempt's start: its start
    assert goodput.attempt_facts(outcome).joined_at == 1.0
    far = [record(r, joined_at=5.3, ended_at=10.0, returncode=0, clock="hostB") for r in (0, 1)]  # never reaped here
    assert goodput.attempt_facts(Outcome(far, 0, None, began_at=1.0, splits={0: split(3.0), 1: split(3.0)})) \
        .joined_at == 5.3


def test_a_save_on_another_machine_is_put_on_the_launcher_s_clock():
    far = record(0, joined_at=2.0, ended_at=50.0, reaped_at=1050.0, clock="hostB",
                 marks=contract.Marks(saves=1, saved_at=1040.0, clock="hostB"))
    assert goodput.attempt_facts(Outcome([far], 1, StopReason.FAILURE, root_cause=0, began_at=1.0)).saved_at == 40.0


def test_an_attempt_that_never_started_is_the_restart_s_time():
    first = Outcome([record(0, joined_at=1.0, ended_at=5.0, returncode=1)], 1, StopReason.FAILURE, root_cause=0,
                    began_at=0.0)
    never = Outcome.not_started(2, "hostB: no answer")
    never.began_at = 6.0
    found = goodput.of_run(0.0, 9.0, [first, never])
    sums_to_wall(found)
    assert found.parts["teardown"] == pytest.approx(4.0)  # no attempt follows it that redoes anything
    third = Outcome([record(0, joined_at=8.0, ended_at=9.0, returncode=0, finished_at=9.0)], 0, None, began_at=7.0)
    found = goodput.of_run(0.0, 9.0, [first, never, third])
    assert found.parts["restart"] == pytest.approx(2.0) and found.unsaved == (0,)
    assert [s for s in found.spans if s[0] == "startup"][-1][3] == 2  # the report's attempt number


def test_the_summary_line_names_the_share_and_the_three_biggest_losses():
    found = account(0.0, 20.0, [AttemptFacts(0.0, 4.0, 18.0, 18.5, compile=2.0, checkpoint=1.0,
                                             stills=((10.0, 10.5),))])
    assert goodput.summary_line(found) == "jaxrun: goodput 52% of 20.0 s; lost to startup 4.0 s, compile 2.0 s, " \
                                          "teardown 2.0 s"


def test_the_timeline_draws_the_goodput_row():
    found = account(0.0, 10.0, [AttemptFacts(0.0, 2.0, 9.0, 9.5, compile=1.0)])
    event = {"t": 10.0, "event": timeline.GOODPUT, "attempt": 0, **found.to_dict(),
             "spans": [list(s) for s in found.spans]}
    trace = timeline.chrome_trace([{"t": 0.0, "event": timeline.ATTEMPT, "attempt": 0}, event])["traceEvents"]
    row = [e for e in trace if e.get("tid") == timeline.GOODPUT_TID and e["ph"] == "X"]
    assert [(e["name"], e["dur"]) for e in row] == [("startup", 2_000_000), ("work", 7_000_000),
                                                    ("teardown", 500_000), ("teardown", 500_000)]
    assert row[1]["args"]["compile"] == 1.0
    names = [e["args"]["name"] for e in trace if e["ph"] == "M" and e.get("tid") == timeline.GOODPUT_TID]
    assert names == ["goodput 60% of 10.0 s"]


def test_marks_travel_as_a_dict_and_junk_is_refused(tmp_path):
    made = contract.Marks(1.5, 0.25, 2, 123.5, 0.0, 40, 124.0, "hostB")
    assert contract.Marks.from_dict(made.to_dict()) == made
    for junk in (None, [], {"compile": "x", "checkpoint": 0, "saves": 0}, {"compile": 1.0}):
        assert contract.Marks.from_dict(junk) is None
    path = tmp_path / "marks"
    assert contract.Marks.read(str(path)) is None
    path.write_text("{not json")
    assert contract.Marks.read(str(path)) is None


def test_the_hosts_own_time_is_input_or_idle_never_work_and_one_line_names_where():
    """Issue 76: the host's compute and its idle time outside JAX are parts of
    their own (a save, host time too, counted once, as the save), and a host
    the devices waited for 20% of the steps' time or more is named at its line."""
    found = account(0.0, 30.0, [AttemptFacts(0.0, 2.0, 29.0, 30.0, checkpoint=1.0, input=12.0, idle=1.5,
                                             input_at="train.py:40 in next_batch", idle_at="train.py:44 in main")])
    sums_to_wall(found)
    assert found.parts["input"] == pytest.approx(12.0) and found.parts["idle"] == pytest.approx(0.5)
    assert found.parts["work"] == pytest.approx(27.0 - 1.0 - 12.0 - 0.5)
    assert found.to_dict()["input_at"] == "train.py:40 in next_batch"
    assert host_line(found) == ("jaxrun: the devices waited for the host 48% of the steps' time, mostly at "
                                "train.py:40 in next_batch (input-bound: the script's own compute outside JAX)")
    asleep = account(0.0, 30.0, [AttemptFacts(0.0, 2.0, 29.0, 30.0, idle=20.0, idle_at="train.py:44 in main")])
    assert host_line(asleep).endswith("mostly at train.py:44 in main (idle: the host parked outside JAX, in a "
                                      "sleep, a queue or a read)")
    busy = account(0.0, 30.0, [AttemptFacts(0.0, 2.0, 29.0, 30.0, input=4.0)])  # 15% of the steps' time
    assert host_line(busy) is None
    toy = account(0.0, 6.0, [AttemptFacts(0.0, 2.0, 5.0, 6.0, input=2.0)])  # 3 s of steps: a toy's
    assert host_line(toy) is None
