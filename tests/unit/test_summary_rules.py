"""Issue 74's rules for the summary, on recorded inputs: "its traceback in
FILE" names only a file that holds one (else the error record); the console
shows one diagnosis for the job (every process that judged wrote it; the
summary gives the root cause's once); "was at" is where a process was when
it ended, its last traceback or dump, never an older dump; no line
contradicts another.  The real jobs are in tests/e2e/test_console_pages.py,
test_checks_replicas.py and test_divergence.py."""

from __future__ import annotations

import io

import pytest
from fixtures.records import process_records

from jaxrun import contract
from jaxrun.contract import ErrorRecord
from jaxrun.core.events import Stream
from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason, Verdict
from jaxrun.launcher.output.printer import ConsolePrinter
from jaxrun.reporting import summary

SHIM = "/venv/lib/python3.11/site-packages/jaxrun/child/shim.py"
SHUTDOWN = "/venv/lib/python3.11/site-packages/jax/_src/distributed.py"


def records(folder, n: int = 4) -> list[ProcessRecord]:
    return process_records(folder, n, root=0)


def write(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def dump(*frames: tuple[str, int, str]) -> str:
    """A faulthandler dump of the main thread, innermost frame first."""
    return "Current thread 0x00007f (most recent call first):\n" + "".join(
        f'  File "{file}", line {line} in {func}\n' for file, line, func in frames) + "\n"


def traceback(script, line: int, error: str = "ValueError: bad batch") -> str:
    return f'Traceback (most recent call last):\n  File "{script}", line {line}, in <module>\n{error}\n'


# -- a check's stop: one diagnosis, and its record named ---------------------------------

PARTED = ("processes 0-3 parted: process 0 ran eval_step (spanning 0-3) at train.py:16 and processes 1, 2, 3 "
          "never made it; now processes 1, 2, 3 finished their script")
CHECKS = {  # what each check writes, as its stop leaves it (agreement.stop, divergence's stop)
    "parting": ("PartedProgramError", PARTED,
                [PARTED, "process 0 ran eval_step at /w/train.py:16, which processes 1, 2, 3 never made",
                 "processes 1, 2, 3 finished their script after step 5"], True),
    "replicas": ("ReplicaMismatchError", "replicas differ at load.py:42 (call 4 there): slice [0:2, 0:3]",
                 ["processes 0, 2 hold slice [0:2, 0:3] of the array built at load.py:42 (call 4 there)",
                  "processes that share a slice must load the same data"], True),
    "divergence": ("DivergenceError", "call 6 differs across processes: process 2 runs eval_step#1",
                   ["--check-divergence: the processes part at call 6 (counting programs that span processes):",
                    "  process 2: eval_step#1, program 2b13, called at /w/train.py:48",
                    "  stopping the job before that call runs"], False),
}


def judged(folder, check: str) -> Outcome:
    """Every process judged and wrote the check's lines; process 0's end came first."""
    kind, message, lines, with_headline = CHECKS[check]
    text = "".join(f"jaxrun: {line}\n" for line in lines)
    recs = records(folder)
    for rec in recs:
        write(rec.stderr_log, f"{contract.DIAGNOSIS_HEAD}\n{text}")
        ErrorRecord(kind, message, text + (f"{kind}: {message}\n" if with_headline else ""), 5.0).dump(rec.error_file)
    return Outcome(recs, 1, StopReason.FAILURE, root_cause=0)


@pytest.mark.parametrize("check", CHECKS)
def test_a_checks_stop_names_its_error_record_and_its_diagnosis_once(tmp_path, check):
    outcome = judged(tmp_path, check)
    kind, message, lines, _ = CHECKS[check]
    said = summary.summary_lines(outcome, str(tmp_path))
    assert not any("its traceback in" in line for line in said), said
    assert f"jaxrun:   no traceback (jaxrun stopped it); its record: {outcome.records[0].error_file}" in said, said
    assert said.count(f"jaxrun:   {kind}: {message}") == 1, said
    for line in lines:  # each line of the diagnosis once, the exception's own message not again
        assert sum(line in shown for shown in said) == 1, (line, said)
    # The console showed none of the four processes' copies.
    printer = ConsolePrinter(stdout=io.BytesIO(), stderr=(err := io.BytesIO()), log_dir=str(tmp_path))
    for rec in outcome.records:
        printer.write(rec.spec.rank, Stream.STDERR, open(rec.stderr_log, "rb").read())
    printer.flush()
    assert err.getvalue() == b""


def test_no_line_contradicts_the_judges_word_on_who_finished(tmp_path):
    """The judge said processes 1, 2, 3 finished their script; the dumps
    found 1 and 3 in JAX's shutdown and none came from 2: the summary says
    the judge's word alone (at 74d7ebe it added "processes 1, 3 had finished
    the script")."""
    outcome = judged(tmp_path, "parting")
    for rec in outcome.records:
        rec.verdict = Verdict.ROOT_CAUSE if rec.spec.rank == 0 else Verdict.STOPPED
    for rank in (1, 3):
        write(outcome.records[rank].stderr_log, dump((SHUTDOWN, 1190, "shutdown"), (SHIM, 120, "main")))
    said = summary.summary_lines(outcome, str(tmp_path))
    assert not any("had finished the script" in line for line in said), said
    assert sum("finished their script" in line for line in said) == 2, said  # the headline, and its line


# -- "was at": where each process ended ----------------------------------------------------

@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import time\n" * 5 + "time.sleep(0.2)  # OLDER\nraise ValueError('bad batch')  # ENDS\n")
    return path


def ended(tmp_path, stderr: str) -> list[str]:
    """The summary after process 0 raised first and process 1 left ``stderr``."""
    tmp_path.mkdir(exist_ok=True)
    recs = records(tmp_path, 2)
    write(recs[0].stderr_log, traceback("/w/root.py", 3))
    ErrorRecord("ValueError", "bad batch", traceback("/w/root.py", 3), 5.0).dump(recs[0].error_file)
    write(recs[1].stderr_log, stderr)
    return summary.summary_lines(Outcome(recs, 1, StopReason.FAILURE, root_cause=0), str(tmp_path))


def test_was_at_is_the_traceback_that_came_after_an_older_dump(tmp_path, script):
    """jaxrun's stop asked for a dump while process 1 slept; then it raised
    (a flax job whose processes all raised within 0.5 s, at 74d7ebe: "at"
    the older dump's line)."""
    said = ended(tmp_path, dump((str(script), 6, "<module>"), (SHIM, 120, "run_script")) + traceback(script, 7))
    assert f"jaxrun:   process 1 was at {script}:7 in <module>: raise ValueError('bad batch')  # ENDS" in said, said
    assert not any(f"{script}:6" in line for line in said), said


def test_a_dump_in_jaxruns_ending_of_the_exception_leaves_the_tracebacks_line(tmp_path, script):
    ending = dump(("/venv/lib/python3.11/site-packages/jaxrun/child/ending.py", 30, "record_error"),
                  (SHIM, 211, "run_target"))
    said = ended(tmp_path, traceback(script, 7) + ending)
    assert f"jaxrun:   process 1 was at {script}:7 in <module>: raise ValueError('bad batch')  # ENDS" in said, said
    # But a traceback the script printed and went on from is no place once
    # the stop found it past the script, in JAX's shutdown.
    said = ended(tmp_path / "later", traceback(script, 7) + "going on\n" + dump((SHUTDOWN, 1190, "shutdown")))
    assert not any(" was at " in line for line in said), said


def test_processes_at_one_place_share_one_line_and_the_root_causes_is_not_repeated(tmp_path, script):
    recs = records(tmp_path, 4)
    write(recs[0].stderr_log, traceback(script, 7))
    ErrorRecord("ValueError", "bad batch", traceback(script, 7), 5.0).dump(recs[0].error_file)
    for rec in recs[1:]:
        write(rec.stderr_log, dump((str(script), 6, "<module>")))
    said = summary.summary_lines(Outcome(recs, 1, StopReason.FAILURE, root_cause=0), str(tmp_path))
    places = [line for line in said if " at " in line and " in <module>: " in line]
    assert places == [f"jaxrun:   processes 1, 2, 3 were at {script}:6 in <module>: time.sleep(0.2)  # OLDER"], said
    # An exception's traceback is in the log the summary names.
    assert f"jaxrun:   raised at {script}:7; its traceback in {recs[0].stderr_log}" in said, said


def test_processes_that_raised_the_root_causes_error_themselves_are_not_its_consequences(tmp_path, script):
    """A flax job whose processes all raised the same error within 0.5 s:
    at 74d7ebe they "failed after the root cause"."""
    recs = records(tmp_path, 4)
    for rec in recs:
        write(rec.stderr_log, traceback(script, 7))
        if rec.spec.rank != 3:  # process 3 was lost with the root cause: Gloo's error, its own
            ErrorRecord("ValueError", "bad batch", traceback(script, 7), 5.0).dump(rec.error_file)
    ErrorRecord("JaxRuntimeError", "Gloo all-reduce failed", "", 5.0).dump(recs[3].error_file)
    recs[2].verdict = Verdict.STOPPED
    said = summary.summary_lines(Outcome(recs, 1, StopReason.FAILURE, root_cause=0), str(tmp_path))
    assert "jaxrun: processes 1, 2 raised the same ValueError themselves, after the root cause" in said, said
    assert "jaxrun: process 3 failed after the root cause" in said, said
    assert not any("stopped by jaxrun" in line or "processes 1" in line and "failed after" in line for line in said)
