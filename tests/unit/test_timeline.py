"""The run's timeline: the event log the launcher writes (through the
slots, the stop sequence and the run loop's calls), its Chrome trace, and
``jaxrun logs --trace``.  The real run's timeline, with a crash and a
restart, is tests/e2e/test_timeline.py's."""

from __future__ import annotations

import json
import os
import signal

from click.testing import CliRunner

from jaxrun import contract
from jaxrun.core.backend import RunHooks
from jaxrun.core.outcome import Outcome, StopReason, Verdict
from jaxrun.core.spec import Host, ProcessSpec
from jaxrun.launcher.attempt.slots import Slots
from jaxrun.launcher.attempt.stop import StopSequence
from jaxrun.launcher.interactive.frontend import says_nothing
from jaxrun.launcher.output import logs
from jaxrun.launcher.output.timeline import Timeline
from jaxrun.reporting import timeline

T0 = 1_700_000_000.0  # a wall clock, as the log holds


def at(seconds: float) -> int:
    return timeline.micros(T0 + seconds)


# -- the converter, on a hand-written log ---------------------------------------------

def crash_and_restart_log() -> list[dict]:
    """Two processes; process 1 dies at 5 s, process 0 is asked for a dump and
    killed; the job starts again and both finish."""
    def state(t, rank, name, attempt=0, **facts):
        return {"t": T0 + t, "event": "state", "attempt": attempt, "rank": rank, "life": 0,
                "host": f"node-{rank}", "state": name, **facts}

    return [
        {"t": T0, "event": "attempt", "attempt": 0, "log_dir": "/logs/run"},
        state(0.1, 0, "started", pid=100), state(0.2, 1, "started", pid=101),
        {"t": T0 + 1, "event": "join", "attempt": 0, "rank": 0, "life": 0},
        state(1, 0, "joined"), state(1.5, 0, "working"), state(1.6, 1, "working"), state(3, 0, "waiting"),
        state(5, 1, "ended", exit=7),
        {"t": T0 + 5, "event": "signal", "attempt": 0, "signal": "SIGUSR1", "ranks": [0]},
        {"t": T0 + 5.5, "event": "signal", "attempt": 0, "signal": "SIGKILL", "ranks": [0]},
        state(5.6, 0, "ended", exit=137),
        {"t": T0 + 5.7, "event": "attempt_end", "attempt": 0, "exit_code": 7, "reason": "failure",
         "processes": [{"rank": 0, "life": 0, "verdict": "stopped by jaxrun", "exit": 137},
                       {"rank": 1, "life": 0, "verdict": "failed first", "exit": 7}]},
        {"t": T0 + 5.8, "event": "restart", "attempt": 0, "why": "restarting the job (1 of 1)", "elastic": False},
        {"t": T0 + 6, "event": "attempt", "attempt": 1, "log_dir": "/logs/run/restart-1"},
        state(6.1, 0, "started", 1, pid=200), state(6.2, 1, "started", 1, pid=201),
        state(7, 0, "working", 1), state(7, 1, "working", 1),
        state(9, 0, "finished", 1), state(9.5, 0, "ended", 1, exit=0), state(9.6, 1, "ended", 1, exit=0),
        {"t": T0 + 9.7, "event": "attempt_end", "attempt": 1, "exit_code": 0, "reason": None,
         "processes": [{"rank": 0, "life": 0, "verdict": "ok", "exit": 0},
                       {"rank": 1, "life": 0, "verdict": "ok", "exit": 0}]},
    ]


def spans(trace: dict, pid: int, tid: int) -> list[tuple[str, int, int]]:
    return [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
            if e["ph"] == "X" and e["pid"] == pid and e["tid"] == tid]


def instants(trace: dict, pid: int) -> list[tuple[str, int]]:
    return [(e["name"], e["ts"]) for e in trace["traceEvents"] if e["ph"] == "i" and e["pid"] == pid]


def test_a_track_per_process_named_with_its_host_and_the_attempts_first():
    trace = timeline.chrome_trace(crash_and_restart_log())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "jaxrun", 1: "process 0 (node-0)", 2: "process 1 (node-1)"}
    order = {e["pid"]: e["args"]["sort_index"] for e in trace["traceEvents"] if e["name"] == "process_sort_index"}
    assert order == {0: 0, 1: 1, 2: 2}
    json.dumps(trace)  # all of it JSON


def test_each_attempt_and_each_life_is_a_span_with_its_verdict():
    trace = timeline.chrome_trace(crash_and_restart_log())
    assert spans(trace, 0, timeline.LIVES_TID) == [("attempt 0", at(0), at(5.7)), ("attempt 1", at(6), at(9.7))]
    assert spans(trace, 2, timeline.LIVES_TID) == [("attempt 0", at(0.2), at(5)), ("attempt 1", at(6.2), at(9.6))]
    lives = [e["args"] for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 2]
    first = next(a for a in lives if a.get("verdict"))
    assert (first["verdict"], first["exit"], first["pid"], first["host"]) == ("failed first", 7, 101, "node-1")
    attempts = [e["args"] for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 0]
    assert [(a["exit_code"], a["reason"]) for a in attempts] == [(7, "failure"), (0, None)]


def test_the_states_follow_each_other_within_the_life():
    trace = timeline.chrome_trace(crash_and_restart_log())
    assert spans(trace, 1, timeline.STATES_TID) == [
        ("starting", at(0.1), at(1)), ("joined", at(1), at(1.5)), ("working", at(1.5), at(3)),
        ("waiting", at(3), at(5.6)),
        ("starting", at(6.1), at(7)), ("working", at(7), at(9)), ("finished (script returned)", at(9), at(9.5))]
    life = spans(trace, 1, timeline.LIVES_TID)
    for _, begin, end in spans(trace, 1, timeline.STATES_TID):
        assert any(b <= begin and end <= e for _, b, e in life)


def test_joins_dumps_signals_ends_and_the_restart_are_instants():
    trace = timeline.chrome_trace(crash_and_restart_log())
    assert instants(trace, 1) == [("joined", at(1)), ("stack dump asked", at(5)), ("SIGKILL sent", at(5.5)),
                                  ("ended (exit 137)", at(5.6)), ("ended (exit 0)", at(9.5))]
    assert instants(trace, 0) == [("restart", at(5.8))]
    ts = [e["ts"] for e in trace["traceEvents"] if e["ph"] != "M" and e["pid"] == 1]
    assert ts == sorted(ts)


def test_a_run_still_going_ends_its_open_spans_at_the_last_event():
    trace = timeline.chrome_trace(crash_and_restart_log()[:8])  # up to process 0's wait
    assert spans(trace, 1, timeline.LIVES_TID) == [("attempt 0", at(0.1), at(3))]
    assert spans(trace, 1, timeline.STATES_TID)[-1] == ("waiting", at(3), at(3))
    assert all(e["args"].get("unfinished") for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 0)


def test_a_process_started_again_alone_has_a_second_life_in_the_attempt():
    log = [{"t": T0, "event": "attempt", "attempt": 0},
           {"t": T0 + 1, "event": "state", "rank": 2, "life": 0, "host": "h", "state": "started", "pid": 1},
           {"t": T0 + 2, "event": "state", "rank": 2, "life": 0, "host": "h", "state": "ended", "exit": 1},
           {"t": T0 + 2, "event": "state", "rank": 2, "life": 1, "host": "h", "state": "pending"},
           {"t": T0 + 2.1, "event": "state", "rank": 2, "life": 1, "host": "h", "state": "started", "pid": 2},
           {"t": T0 + 4, "event": "state", "rank": 2, "life": 1, "host": "h", "state": "ended", "exit": 0}]
    trace = timeline.chrome_trace(log)
    assert spans(trace, 3, timeline.LIVES_TID) == [("attempt 0", at(1), at(2)), ("attempt 0, life 2", at(2.1), at(4))]
    assert ("started again alone", at(2)) in instants(trace, 3)


def test_lines_it_cannot_read_are_left_out(tmp_path):
    path = tmp_path / timeline.FILE
    good = crash_and_restart_log()[:3]
    path.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in good)
                     + b"not json\n" + b'{"t": "soon", "event": "state"}\n' + b'{"t": 1, "event": "state"}\n'
                     + b"[" * (timeline.MAX_LINE + 10) + b"\n" + b'{"t": 2, "event": "a later word"}\n'
                     + b'{"t": 3, "event": "attempt", "att')
    events = timeline.read(str(path))
    assert events[:3] == good and [e["t"] for e in events[3:]] == [1, 2]
    timeline.chrome_trace(events)  # a state line without a rank, a word it does not know: skipped
    assert timeline.read(str(tmp_path / "none")) is None
    assert timeline.began(str(path)) == T0


# -- the writer -----------------------------------------------------------------------------

class Kid:
    """Enough of a Child for the slots and the stop sequence."""

    def __init__(self, pid: int):
        self.pid, self.sent = pid, []

    def send(self, signum: int) -> None:
        self.sent.append(signum)


def written(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_slots_write_one_line_per_change_never_per_sample(tmp_path):
    folder = tmp_path / "run"
    clock = iter(T0 + i for i in range(100)).__next__
    specs = [ProcessSpec(r, r, Host("node-a"), "python", (), {}) for r in range(2)]
    with Timeline(str(folder), clock=clock) as log:
        log.attempt_began(0, str(folder), T0 - 5)
        slots = Slots(specs, str(folder), log)
        folder.mkdir()  # as the attempt makes it: the lines so far were kept
        for slot in slots:
            slot.started(Kid(100 + slot.rank))
        for said in (contract.BUSY, contract.BUSY, contract.BUSY, contract.IDLE, contract.IDLE):
            slots[0].activity(said)
        slots[0].joined()
        slots[0].joined()  # heard twice: one join
        StopSequence(slots, RunHooks(), lambda: 0.0, print).send_all(signal.SIGUSR1)
        slots[1].record.returncode = 3
        slots[1].ended()
        slots[1].next_life(str(folder))
        log.attempt_ended(Outcome(slots.records(), 3, StopReason.FAILURE, root_cause=1))
    lines = written(folder / timeline.FILE)
    assert lines[0] == {"t": T0 - 5, "event": "attempt", "attempt": 0, "log_dir": str(folder)}
    said = [(e["event"], e.get("rank"), e.get("state")) for e in lines[1:]]
    assert said == [("state", 0, "started"), ("state", 1, "started"), ("state", 0, "working"),
                    ("state", 0, "waiting"), ("join", 0, None), ("signal", None, None), ("state", 1, "ended"),
                    ("state", 1, "pending"), ("attempt_end", None, None)]
    assert lines[1]["pid"] == 100 and lines[1]["host"] == "node-a"
    assert lines[6] == {"t": lines[6]["t"], "event": "signal", "attempt": 0, "signal": "SIGUSR1", "ranks": [0, 1]}
    assert lines[7]["exit"] == 3 and lines[8]["life"] == 1
    ends = {(p["rank"], p["life"]): p["verdict"] for p in lines[-1]["processes"]}
    assert ends == {(0, 0): None, (1, 0): Verdict.RESTARTED.value, (1, 1): None}
    assert all(a["t"] <= b["t"] for a, b in zip(lines[1:], lines[2:]))


def test_a_run_that_never_started_leaves_no_timeline(tmp_path):
    try:
        with Timeline(str(tmp_path)) as log:
            log.attempt_began(0, str(tmp_path), T0)
            raise ValueError("bad input")
    except ValueError:
        pass
    assert not (tmp_path / timeline.FILE).exists()


def test_a_write_that_fails_is_one_line_and_the_run_goes_on(tmp_path):
    (tmp_path / timeline.FILE).mkdir()  # something that cannot be replaced stands in its place
    said = []
    log = Timeline(str(tmp_path), warn=said.append)
    slot = Slots([ProcessSpec(0, 0, Host("h"), "python", (), {})], str(tmp_path), log)[0]
    slot.started(Kid(1))
    slot.activity(contract.BUSY)
    log.restart("again", elastic=False)
    log.close()
    assert len(said) == 1 and said[0].startswith(f"jaxrun: cannot write the run's timeline {tmp_path / timeline.FILE}")
    assert said[0].endswith("; the run goes on without it")
    assert slot.state.value == "working"  # the slot moved all the same


def test_a_write_error_after_the_file_opened_is_one_line_too(tmp_path):
    said = []
    log = Timeline(str(tmp_path), warn=said.append)
    log.restart("first", elastic=False)
    full = open("/dev/full", "wb")  # every write: ENOSPC
    try:
        os.dup2(full.fileno(), log.fd)
        log.restart("second", elastic=False)
        log.restart("third", elastic=False)
    finally:
        full.close()
        log.close()
    assert len(said) == 1 and "No space left on device" in said[0]
    assert [e["why"] for e in written(tmp_path / timeline.FILE)] == ["first"]


# -- jaxrun logs --trace ---------------------------------------------------------------------

def test_logs_trace_writes_the_chrome_trace_and_says_how_to_open_it(tmp_path):
    base, out = tmp_path / "base", tmp_path / "t.json"
    for name, shift in (("older", -100), ("newer", 0)):
        (base / name).mkdir(parents=True)
        log = [{**e, "t": e["t"] + shift} for e in crash_and_restart_log()]
        (base / name / timeline.FILE).write_text("".join(json.dumps(e) + "\n" for e in log))
    (base / "before-timelines").mkdir()
    result = CliRunner().invoke(logs.command, ["--log-dir", str(base), "--trace", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"jaxrun: wrote the timeline of run newer (2 processes, 2 attempts) to {out}; open it at "
        "https://ui.perfetto.dev (Open trace file) or in chrome://tracing"]
    assert json.loads(out.read_text()) == timeline.chrome_trace(crash_and_restart_log())
    result = CliRunner().invoke(logs.command, ["--log-dir", str(base), "--trace", str(out), "older"])
    assert result.exit_code == 0 and "run older" in result.output
    result = CliRunner().invoke(logs.command, ["--log-dir", str(base), "--trace", str(out), "before-timelines"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"jaxrun: error: run before-timelines has no timeline ({timeline.FILE}): it ran before jaxrun kept one"]


# -- the console's empty line -----------------------------------------------------------------

def test_blank_lines_and_comments_say_nothing_but_a_block_they_end_does():
    assert says_nothing("") and says_nothing("   ") and says_nothing("# a note") and says_nothing("\n  # x\n")
    assert not says_nothing("for i in range(2):\n    print(i)\n") and not says_nothing("x = 1  # set")
