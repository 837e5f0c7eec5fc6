"""One diagnosis per outcome (``reporting.diagnosis``): the console summary,
the JSON report, JUnit and the GitHub annotation name the same root cause for
the same reason, the logs are read once, and the reporters read none."""

from __future__ import annotations

import shutil
import signal
import sys
import tracemalloc
import xml.etree.ElementTree as ET

import pytest

from jaxrun import contract
from jaxrun.contract import ErrorRecord
from jaxrun.core.outcome import Outcome, Place, ProcessRecord, Stall, StallGroup, StopReason, Verdict
from jaxrun.core.spec import LOCAL_HOST, Host, ProcessSpec
from jaxrun.reporting import diagnosis, github, junit, report, summary
from jaxrun.reporting.diagnosis import Kind

# Every file this process opens while a test watches: an audit hook sees
# os.open and open alike, so a reporter that reads a log cannot hide it.
OPENED: list[str] | None = None


def _watch(event: str, args: tuple) -> None:
    if event == "open" and OPENED is not None and isinstance(args[0], str):
        OPENED.append(args[0])


sys.addaudithook(_watch)


@pytest.fixture
def opened():
    global OPENED
    OPENED = []
    try:
        yield OPENED
    finally:
        OPENED = None


def records(folder, hosts=("localhost", "hostB", "hostB")) -> list[ProcessRecord]:
    folder.mkdir(exist_ok=True)
    made = []
    for rank, name in enumerate(hosts):
        host = LOCAL_HOST if name == "localhost" else Host(name)
        spec = ProcessSpec(rank, rank, host, "python", (), {})
        made.append(ProcessRecord(spec, str(folder / f"process-{rank}.stdout"), str(folder / f"process-{rank}.stderr"),
                                  str(folder / f"process-{rank}.error.json"), pid=100 + rank, started_at=1.0,
                                  ended_at=2.0, returncode=-signal.SIGTERM, verdict=Verdict.STOPPED))
        for path in (made[-1].stdout_log, made[-1].stderr_log):
            with open(path, "w") as f:
                f.write(f"step 1 of process {rank}\n")
    return made


def raised(folder) -> Outcome:
    """Process 1 raised ValueError and left its error record; 2 failed in its wake."""
    recs = records(folder)
    traceback = 'Traceback (most recent call last):\n  File "/w/train.py", line 7, in <module>\nValueError: bad batch\n'
    ErrorRecord("ValueError", "bad batch", traceback, 5.0).dump(recs[1].error_file)
    with open(recs[1].stderr_log, "a") as f:
        f.write(traceback)
    recs[1].returncode, recs[1].verdict = 1, Verdict.ROOT_CAUSE
    recs[2].returncode, recs[2].verdict = 1, Verdict.CONSEQUENCE
    return Outcome(recs, 1, StopReason.FAILURE, root_cause=1)


def killed_quietly(folder) -> Outcome:
    """Process 0 was SIGKILLed with an empty stderr log: its stdout says what it did last."""
    recs = records(folder, ("localhost", "localhost"))
    open(recs[0].stderr_log, "w").close()
    recs[0].returncode, recs[0].verdict = -signal.SIGKILL, Verdict.ROOT_CAUSE
    return Outcome(recs, 137, StopReason.FAILURE, root_cause=0)


def engine_failed(folder) -> Outcome:
    recs = records(folder)
    engine_log = folder / "engine.log"
    engine_log.write_text("srun: error: Node n1 lost\n")
    note = contract.EngineNote.of("srun", -signal.SIGKILL, True, str(engine_log)).line()
    for rec in recs:
        with open(rec.stderr_log, "a") as f:
            f.write(note)
        rec.returncode, rec.verdict = 1, Verdict.CONSEQUENCE
    recs[0].verdict = Verdict.ROOT_CAUSE
    return Outcome(recs, 1, StopReason.FAILURE, root_cause=0)


def timed_out(folder) -> Outcome:
    script = folder / "hang.py"
    recs = records(folder, ("localhost", "localhost"))
    script.write_text("import time\ntime.sleep(60)\n")
    for rec in recs:
        with open(rec.stderr_log, "a") as f:
            f.write(f'Current thread 0x00007f (most recent call first):\n  File "{script}", line 2 in <module>\n')
    return Outcome(recs, 124, StopReason.TIMEOUT)


def stalled(folder) -> Outcome:
    """Process 1 (on hostB) asleep in the workspace's train.py while 0 and 2 wait at its line 9."""
    recs = records(folder)
    waiting, asleep = Place("/w/train.py", 9, "<module>", "float(step(x))", contract.IN_SCRIPT), \
        Place("/w/train.py", 7, "<module>", "time.sleep(600)", contract.IN_SCRIPT)
    for rec in recs:
        line = 7 if rec.spec.rank == 1 else 9
        with open(rec.stderr_log, "a") as f:
            f.write(f'Current thread 0x00007f (most recent call first):\n'
                    f'  File "/w/train.py", line {line} in <module>\n')
    found = Stall(600.0, StallGroup((0, 2), waiting), (StallGroup((1,), asleep),))
    return Outcome(recs, contract.STALL_EXIT, StopReason.STALL, stall=found)


OUTCOMES = {"raised": raised, "killed quietly": killed_quietly, "engine failed": engine_failed,
            "timed out": timed_out, "stalled": stalled}


def all_reports(outcome: Outcome, folder) -> dict:
    return {"summary": summary.summary_lines(outcome, str(folder)),
            "report": report.report_dict([outcome], "run", [str(folder)]),
            "junit": junit.render(outcome, suite="s"),
            "github": github.error_annotation(outcome, "/w")}


def failures(xml: str) -> dict[str, str]:
    """testcase name -> its failure's message."""
    suite = ET.fromstring(xml.split("\n", 1)[1])
    return {case.get("name"): case.find("failure").get("message")
            for case in suite.iter("testcase") if case.find("failure") is not None}


# -- the four agree --------------------------------------------------------------------

def test_a_raised_exception_is_one_root_cause_with_one_reason_everywhere(tmp_path):
    outcome = raised(tmp_path / "logs")
    found = diagnosis.attach(outcome)
    assert (found.kind, found.root.rank, found.root.host) == (Kind.PROCESS_FAILURE, 1, "hostB")
    reason = "ValueError: bad batch"
    out = all_reports(outcome, tmp_path)
    assert "jaxrun: process 1 on hostB failed first: exit code 1 (pid 101)" in out["summary"]
    assert f"jaxrun:   {reason}" in out["summary"]
    root = out["report"]["root_cause"]
    assert (root["process_id"], root["host"], root["exit"]) == (1, "hostB", "exit code 1")
    assert f"{root['exception']['type']}: {root['exception']['message']}" == reason
    assert failures(out["junit"]) == {"process 1": reason}
    assert out["github"] == ("::error title=jaxrun%3A process 1 on hostB failed first (exit code 1),"
                             f"file=train.py,line=7::{reason}")


def test_a_process_without_a_record_is_named_by_its_exit_and_its_last_output(tmp_path):
    outcome = killed_quietly(tmp_path / "logs")
    out = all_reports(outcome, tmp_path)
    stdout = outcome.records[0].stdout_log
    assert out["summary"][:3] == ["jaxrun: process 0 failed first: killed by SIGKILL (pid 100)",
                                  f"jaxrun:   last lines of {stdout}:", "    step 1 of process 0"]
    root = out["report"]["root_cause"]
    assert (root["process_id"], root["exit"], root["exception"], root["stderr_tail"]) == \
        (0, "killed by SIGKILL", None, [])
    assert failures(out["junit"]) == {"process 0": "killed by SIGKILL"}
    assert out["github"] == "::error title=jaxrun%3A process 0 failed first (killed by SIGKILL)::step 1 of process 0"


def test_an_engine_failure_is_named_once_and_alike(tmp_path):
    outcome = engine_failed(tmp_path / "logs")
    found = diagnosis.attach(outcome)
    headline = "srun failed first: it was killed by SIGKILL before processes 0-2 reported back"
    assert (found.kind, found.engine.headline, found.engine.log_tail) == \
        (Kind.ENGINE_FAILURE, headline, ("srun: error: Node n1 lost",))
    out = all_reports(outcome, tmp_path)
    assert out["summary"][0] == f"jaxrun: {headline} (pid 100)"
    assert out["report"]["root_cause"]["engine"]["message"] == headline
    assert failures(out["junit"]) == {"process 0": headline}
    assert out["github"] == f"::error title=jaxrun%3A srun failed first::{headline}%0Asrun: error: Node n1 lost"


def test_a_timeout_names_where_every_process_was_alike(tmp_path):
    outcome = timed_out(tmp_path / "logs")
    script = tmp_path / "logs" / "hang.py"
    found = diagnosis.attach(outcome)
    assert found.kind is Kind.TIMEOUT and found.root is None
    assert [p.frame for p in found.processes] == [(str(script), 2, "<module>", "time.sleep(60)")] * 2
    out = all_reports(outcome, tmp_path)
    assert out["summary"][0] == "jaxrun: --timeout expired; stack dumps are in each process's stderr log"
    # One line for the processes at one place (issue 74: the summary's lines are few).
    assert f"jaxrun:   processes 0, 1 were at {script}:2 in <module>: time.sleep(60)" in out["summary"]
    assert out["report"]["root_cause"] is None and out["report"]["attempts"][0]["stop_reason"] == "timeout"
    where = f" at {script}:2 in <module>: time.sleep(60)"
    assert failures(out["junit"]) == {f"process {r}": f"still running when --timeout expired{where}" for r in (0, 1)}
    assert out["github"].startswith("::error title=jaxrun%3A --timeout expired::process 0 was at ")


def test_a_script_in_a_folder_named_jaxrun_is_the_user_s_code(tmp_path):
    """A checkout called jaxrun holds the user's script: only jaxrun's own
    package is not the user's code, so the summary says where it was."""
    from jaxrun.child import shim

    checkout = tmp_path / "jaxrun" / "examples"
    checkout.mkdir(parents=True)
    script = checkout / "hang.py"
    script.write_text("import time\ntime.sleep(60)\n")
    recs = records(tmp_path / "logs", ("localhost",))
    with open(recs[0].stderr_log, "a") as f:
        f.write(f'Current thread 0x00007f (most recent call first):\n  File "{script}", line 2 in <module>\n'
                f'  File "{shim.__file__}", line 120 in run_target\n')
    lines = summary.summary_lines(Outcome(recs, 124, StopReason.TIMEOUT), str(tmp_path))
    assert f"jaxrun:   process 0 was at {script}:2 in <module>: time.sleep(60)" in lines, lines


def test_a_stall_names_who_stands_out_alike(tmp_path):
    outcome = stalled(tmp_path / "logs")
    found = diagnosis.attach(outcome)
    assert (found.kind, found.root.rank, found.root.at) == (Kind.STALL, 1, "/w/train.py:7")
    assert found.root.fingerprint == ("stall", repr(("/w/train.py", 7)))
    out = all_reports(outcome, tmp_path)
    assert out["summary"][:2] == [
        "jaxrun: the job stalled: no process made progress for 600 s (--stall-timeout); stack dumps are in each "
        "process's stderr log",
        "jaxrun:   process 1 on hostB stands out, at /w/train.py:7 in <module>: time.sleep(600); processes 0, 2 "
        "wait at /w/train.py:9 in <module>: float(step(x))"]
    assert not any("failed first" in line for line in out["summary"])
    root = out["report"]["root_cause"]
    assert (root["kind"], root["process_id"], root["at"]) == ("stall", 1, "/w/train.py:7")
    assert root["stall"]["waiting"]["process_ids"] == [0, 2] and root["stall"]["stand_out"][0]["at"] == "/w/train.py:7"
    assert out["report"]["attempts"][0]["stop_reason"] == "stall" and out["report"]["exit_code"] == 125
    assert failures(out["junit"]) == {"process 1": "stalled at /w/train.py:7 in <module>: time.sleep(600) "
                                                   "(--stall-timeout 600)"}
    assert out["github"].startswith("::error title=jaxrun%3A the job stalled%3A no process made progress for 600 s,"
                                    "file=train.py,line=7::process 1 on hostB stands out")


def test_a_start_error_and_a_success(tmp_path):
    stopped = Outcome.not_started(2, "hostB: ssh failed")
    assert diagnosis.diagnose(stopped).kind is Kind.START_ERROR
    assert github.error_annotation(stopped) == "::error title=jaxrun%3A the restart did not start::hostB: ssh failed"
    recs = records(tmp_path / "logs")
    for rec in recs:
        rec.returncode, rec.verdict = 0, Verdict.OK
    ok = Outcome(recs, 0, None)
    assert diagnosis.diagnose(ok).kind is Kind.SUCCESS
    assert github.error_annotation(ok) is None and failures(junit.render(ok)) == {}


# -- the logs are read once, by the diagnosis alone ------------------------------------

@pytest.mark.parametrize("name", OUTCOMES)
def test_the_reporters_read_no_log_once_the_diagnosis_is_kept(tmp_path, opened, name):
    folder = tmp_path / "logs"
    outcome = OUTCOMES[name](folder)
    fresh = all_reports(OUTCOMES[name](tmp_path / "again"), tmp_path)  # each reporter reading for itself
    diagnosis.attach(outcome, outputs=True)
    shutil.rmtree(folder)
    opened.clear()
    kept = all_reports(outcome, tmp_path)
    assert opened == []
    strip = str(folder), str(tmp_path / "again")
    assert repr(kept).replace(strip[0], "X") == repr(fresh).replace(strip[1], "X")


@pytest.mark.parametrize("name", OUTCOMES)
def test_the_diagnosis_reads_each_log_at_most_once(tmp_path, opened, name):
    folder = tmp_path / "logs"
    outcome = OUTCOMES[name](folder)
    opened.clear()
    diagnosis.attach(outcome, outputs=True)
    logs = [path for path in opened if path.startswith(str(folder)) and not path.endswith(".py")]
    assert logs and sorted(logs) == sorted(set(logs))
    opened.clear()
    assert diagnosis.attach(outcome, outputs=True) is outcome.diagnosis
    assert opened == []


def test_the_report_of_every_attempt_reads_no_earlier_attempt_again(tmp_path, opened):
    first, second = raised(tmp_path / "first"), timed_out(tmp_path / "second")
    diagnosis.attach(first)
    shutil.rmtree(tmp_path / "first")
    diagnosis.attach(second)
    opened.clear()
    data = report.report_dict([first, second], "run", [str(tmp_path / "first"), str(tmp_path / "second")])
    assert opened == []
    assert data["attempts"][0]["root_cause"]["exception"]["message"] == "bad batch"
    assert data["root_cause"] is None


def test_an_outcome_without_a_kept_diagnosis_is_read_afresh(tmp_path):
    """A caller that changes an outcome after one report gets the next from its files."""
    outcome = killed_quietly(tmp_path / "logs")
    assert summary.summary_lines(outcome, "x")[0].startswith("jaxrun: process 0 failed first")
    outcome.records[0].verdict, outcome.records[1].verdict = Verdict.CONSEQUENCE, Verdict.ROOT_CAUSE
    outcome.root_cause = 1
    assert summary.summary_lines(outcome, "x")[0].startswith("jaxrun: process 1 failed first")
    assert outcome.diagnosis is None


def test_a_diagnosis_of_a_huge_log_stays_small(tmp_path):
    outcome = timed_out(tmp_path / "logs")
    with open(outcome.records[0].stderr_log, "rb+") as f:
        dump = f.read()
        f.seek(0)
        f.write(b"y" * (64 << 20) + dump)
    tracemalloc.start()
    try:
        found = diagnosis.diagnose(outcome, outputs=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found.processes[0].frame is not None
    assert peak < 8 * (1 << 20), peak


# -- the same failure twice (the restart rule) ----------------------------------------

def crashed(folder, line: int, with_dump: bool = True, signum: int = signal.SIGSEGV, phase: str = "work") -> Outcome:
    """Process 0 killed by ``signum``; with its faulthandler dump at ``line``;
    in ``phase`` of its life, as jaxrun heard it."""
    recs = records(folder, ("localhost", "localhost"))
    recs[0].joined_at = None if phase == "start-up" else 1.0
    recs[0].finished_at = 2.0 if phase == "teardown" else None
    with open(recs[0].stderr_log, "a") as f:
        if with_dump:
            f.write(f'Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n'
                    f'  File "/w/train.py", line {line} in step\n  File "/w/train.py", line 40 in <module>\n')
    recs[0].returncode, recs[0].verdict = -signum, Verdict.ROOT_CAUSE
    return Outcome(recs, 128 + signum, StopReason.FAILURE, root_cause=0)


def raised_at(folder, message: str, line: int) -> Outcome:
    outcome = raised(folder)
    traceback = ('Traceback (most recent call last):\n  File "/w/train.py", line 40, in <module>\n'
                 f'  File "/w/train.py", line {line}, in step\n'
                 '  File "/usr/lib/python3/site-packages/jax/_src/api.py", line 9, in jit\n'
                 f'ValueError: {message}\n')
    ErrorRecord("ValueError", message, traceback, 5.0).dump(outcome.records[1].error_file)
    return outcome


def same_failure(last, before) -> bool:
    """The restart policy's rule, on two attempts' fingerprints: known and equal."""
    fingerprint = diagnosis.attempt_fingerprint(last)
    return fingerprint is not None and fingerprint == diagnosis.attempt_fingerprint(before)


def test_the_same_exception_at_the_same_line_of_the_users_code_is_the_same_failure(tmp_path):
    first = diagnosis.diagnose(raised_at(tmp_path / "a", "bad batch", 12))
    assert first.root.fingerprint == ("exception", "ValueError", "bad batch", "/w/train.py", 12)
    assert first.root.failure == "ValueError: bad batch at /w/train.py:12"  # the user's line, not jax's
    assert report.report_dict([raised_at(tmp_path / "r", "bad batch", 12)], "r", ["l"])["root_cause"]["at"] == \
        "/w/train.py:12"
    assert same_failure(diagnosis.diagnose(raised_at(tmp_path / "b", "bad batch", 12)), first)
    assert not same_failure(diagnosis.diagnose(raised_at(tmp_path / "c", "bad batch", 13)), first)
    assert not same_failure(diagnosis.diagnose(raised_at(tmp_path / "d", "other", 12)), first)


def test_a_crash_signal_is_the_same_at_the_line_its_dump_shows_or_else_in_the_same_phase(tmp_path):
    first = diagnosis.diagnose(crashed(tmp_path / "a", 7))
    assert first.root.fingerprint == ("signal", "SIGSEGV", "/w/train.py", 7)
    assert same_failure(diagnosis.diagnose(crashed(tmp_path / "b", 7)), first)
    assert not same_failure(diagnosis.diagnose(crashed(tmp_path / "c", 8)), first)
    # No line dumped: the same signal in the same process and phase of its life.
    undumped = {(phase, i): diagnosis.diagnose(crashed(tmp_path / f"u{phase}{i}", 7, with_dump=False, phase=phase))
                for phase in ("start-up", "work", "teardown") for i in range(2)}
    assert undumped["work", 0].root.fingerprint == ("crash", "SIGSEGV", 0, "work")
    assert undumped["work", 0].root.failure == "killed by SIGSEGV" and undumped["work", 0].root.at is None
    for phase in ("start-up", "work", "teardown"):
        assert same_failure(undumped[phase, 0], undumped[phase, 1])
    assert not same_failure(undumped["teardown", 0], undumped["work", 0])
    assert not same_failure(undumped["start-up", 0], undumped["work", 0])
    aborted = diagnosis.diagnose(crashed(tmp_path / "abrt", 7, with_dump=False, signum=signal.SIGABRT))
    assert not same_failure(aborted, undumped["work", 0])
    # SIGKILL and SIGTERM come from outside, whatever line or phase the process was at.
    for signum in (signal.SIGKILL, signal.SIGTERM):
        for dump in (True, False):
            killed = [diagnosis.diagnose(crashed(tmp_path / f"k{signum}{dump}{i}", 7, with_dump=dump, signum=signum))
                      for i in range(2)]
            assert killed[0].root.fingerprint is None and not same_failure(*killed)


def test_a_lost_host_an_exit_code_or_an_engine_failure_is_never_the_same(tmp_path):
    lost = []
    for name in ("a", "b"):
        outcome = raised_at(tmp_path / name, "bad batch", 12)
        outcome.records[1].lost = "the connection to hostB"
        lost.append(diagnosis.diagnose(outcome))
    assert lost[0].root.fingerprint is None and not same_failure(*lost)
    quiet = [diagnosis.diagnose(killed_quietly(tmp_path / f"q{i}")) for i in range(2)]
    assert not same_failure(*quiet)
    engines = [diagnosis.diagnose(engine_failed(tmp_path / f"e{i}")) for i in range(2)]
    assert not same_failure(*engines)


def test_a_failure_at_teardown_once_every_script_returned_says_the_work_finished(tmp_path):
    outcome = crashed(tmp_path / "all", 7, signum=signal.SIGABRT, phase="teardown")
    for rec in outcome.records:
        rec.finished_at = 2.0
    assert outcome.work_finished
    out = all_reports(outcome, tmp_path)
    assert out["summary"][0] == ("jaxrun: the work finished (every process's script returned); then process 0 failed "
                                 "at teardown: killed by SIGABRT (pid 100)")
    assert [p["finished_then_failed"] for p in out["report"]["processes"]] == [True, False]
    # Process 1 had not finished: the usual rules, and the line still says that process 0 had.
    mixed = crashed(tmp_path / "some", 7, signum=signal.SIGABRT, phase="teardown")
    assert not mixed.work_finished
    out = all_reports(mixed, tmp_path)
    assert out["summary"][0] == ("jaxrun: process 0 failed first: killed by SIGABRT (pid 100); its script had "
                                 "returned (it failed at teardown)")
    assert [p["finished_then_failed"] for p in out["report"]["processes"]] == [False, False]
