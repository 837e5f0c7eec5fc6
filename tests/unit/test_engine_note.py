"""A scheduler step that ends under its tasks: one note per process log, one
line on the console (the summary's).  The real srun/mpirun cases are in
tests/e2e/test_slurm.py and test_mpirun.py."""

import io
import signal

import pytest

from jaxrun import contract
from jaxrun.core.events import Stream
from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason, Verdict
from jaxrun.core.ranks import format_ranks
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
from jaxrun.launcher.output.printer import ConsolePrinter
from jaxrun.reporting.summary import summary_lines


@pytest.mark.parametrize("ranks, text", [
    ([], ""), ([5], "5"), (range(16), "0-15"), ([6, 0, 1, 2, 3], "0-3,6"), ([1, 3, 4, 9], "1,3-4,9"), ([2, 2], "2"),
])
def test_rank_lists_are_written_as_ranges(ranks, text):
    assert format_ranks(ranks) == text


@pytest.mark.parametrize("returncode, started", [(1, False), (1, True), (-signal.SIGKILL, True), (0, False)])
def test_the_note_reads_back_as_written(returncode, started):
    note = contract.EngineNote.of("srun", returncode, started, "/logs dir/engine.log")
    assert contract.parse_engine_note(note.line()) == note
    assert contract.parse_engine_note(note.line().rstrip("\n")) == note
    assert any(mark in note.line().encode() for mark in contract.ENGINE_NOTE_MARKS)


def test_a_line_that_only_quotes_the_note_is_not_one():
    line = contract.EngineNote.of("mpirun", 1, False, "/l/engine.log").line()
    assert contract.parse_engine_note("my script says: " + line) is None
    assert contract.parse_engine_note(line.replace("(see", "see")) is None


def test_the_console_leaves_the_note_out_of_stderr_and_keeps_the_rest():
    out, err = io.BytesIO(), io.BytesIO()
    printer = ConsolePrinter(stdout=out, stderr=err)
    note = contract.EngineNote.of("srun", 1, True, "/l/engine.log").line().encode()
    printer.write(2, Stream.STDERR, b"before\n" + note)
    printer.write(3, Stream.STDERR, note)
    printer.flush()
    assert err.getvalue() == b"[2] before\n"
    shown = ConsolePrinter(stdout=out, stderr=err, show_noise=True)  # --show-noise: everything
    assert shown.render(3, Stream.STDERR, note) == note


def records(tmp_path, ranks: int) -> list[ProcessRecord]:
    made = []
    for rank in range(ranks):
        spec = ProcessSpec(rank, rank, LOCAL_HOST, "python", (), {})
        logs = [str(tmp_path / f"process-{rank}.{kind}") for kind in ("stdout", "stderr", "error")]
        made.append(ProcessRecord(spec, *logs, pid=4242, returncode=1, verdict=Verdict.CONSEQUENCE))
    return made


def test_the_summary_names_an_engine_failure_once_for_every_process_it_ended(tmp_path):
    engine_log = tmp_path / "engine.log"
    engine_log.write_text("srun: error: Node n1 lost\n")
    note = contract.EngineNote.of("srun", -signal.SIGKILL, True, str(engine_log)).line()
    recs = records(tmp_path, 6)
    recs[0].returncode, recs[0].verdict = 0, Verdict.OK  # it had reported its exit: not the engine's
    (tmp_path / "process-0.stderr").write_text("fine\n")
    (tmp_path / "process-5.stderr").write_text("Traceback: its own failure\n")  # ended otherwise
    for rank in (1, 2, 4):
        (tmp_path / f"process-{rank}.stderr").write_text(note)
    (tmp_path / "process-3.stderr").write_text("some output\n" + note)
    recs[1].verdict = Verdict.ROOT_CAUSE
    lines = summary_lines(Outcome(recs, 1, StopReason.FAILURE, root_cause=1), str(tmp_path))
    assert lines[:3] == [
        "jaxrun: srun failed first: it was killed by SIGKILL before processes 1-4 reported back (pid 4242)",
        f"jaxrun:   last lines of {engine_log}:",
        "    srun: error: Node n1 lost",
    ]
    assert "jaxrun: process 5 failed after the root cause" in lines
    assert sum("SIGKILL" in line for line in lines) == 1, lines


def test_without_the_note_the_root_cause_is_a_process_as_before(tmp_path):
    recs = records(tmp_path, 2)
    recs[0].verdict = Verdict.ROOT_CAUSE
    (tmp_path / "process-0.stderr").write_text("boom\n")
    lines = summary_lines(Outcome(recs, 1, StopReason.FAILURE, root_cause=0), str(tmp_path))
    assert lines[0] == "jaxrun: process 0 failed first: exit code 1 (pid 4242)"
    assert "jaxrun: process 1 failed after the root cause" in lines


def test_the_report_junit_and_github_name_the_engine_too(tmp_path):
    """Not process 1, which only carries the note: the same one failure as the summary."""
    from xml.etree import ElementTree as ET

    from jaxrun.reporting import github, junit, report

    engine_log = tmp_path / "engine.log"
    engine_log.write_text("mpirun: not enough slots\n")
    note = contract.EngineNote.of("mpirun", 1, False, str(engine_log)).line()
    recs = records(tmp_path, 3)
    for rank in range(3):
        (tmp_path / f"process-{rank}.stderr").write_text(note)
    recs[1].verdict = Verdict.ROOT_CAUSE
    outcome = Outcome(recs, 1, StopReason.FAILURE, root_cause=1)
    headline = "mpirun failed first: it exited with code 1 before any task started; processes 0-2 never ran"
    named = report.report_dict([outcome], "run", [str(tmp_path)])["root_cause"]["engine"]
    assert named == {"name": "mpirun", "message": headline, "process_ids": [0, 1, 2], "log": str(engine_log),
                     "log_tail": ["mpirun: not enough slots"]}
    cases = {c.get("name"): c for c in ET.fromstring(junit.render(outcome).split("\n", 1)[1]).iter("testcase")}
    assert cases["process 1"].find("failure").get("message") == headline
    assert cases["process 0"].find("skipped").get("message") == "ended when mpirun failed first"
    line = github.error_annotation(outcome)
    assert line.startswith("::error title=jaxrun%3A mpirun failed first::") and "not enough slots" in line


def test_a_process_failure_has_no_engine_in_the_report(tmp_path):
    from jaxrun.reporting import report

    recs = records(tmp_path, 2)
    recs[0].verdict = Verdict.ROOT_CAUSE
    (tmp_path / "process-0.stderr").write_text("boom\n")
    outcome = Outcome(recs, 1, StopReason.FAILURE, root_cause=0)
    root = report.report_dict([outcome], "run", [str(tmp_path)])["root_cause"]
    assert root["engine"] is None and root["process_id"] == 0
