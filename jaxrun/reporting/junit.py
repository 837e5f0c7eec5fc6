"""The run as JUnit XML, which CI systems (GitLab, Jenkins, GitHub test-report
actions) show as a test table: one testcase per process.

Only the root cause is a ``<failure>``.  Processes that jaxrun stopped because
of it, or that crashed in its wake, are ``<skipped>`` with a message naming the
root cause, so a CI page shows one red line instead of N copies of a cascade.
After ``--timeout`` every process that was still running failed to finish,
so each is a failure and says where it was.
"""

from __future__ import annotations

import datetime
import re
import xml.etree.ElementTree as ET

from jaxrun.contract import signal_name
from jaxrun.core.noise import is_noise
from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason, Verdict
from jaxrun.reporting import report, summary
from jaxrun.reporting.stacks import innermost_user_frame

# Characters XML 1.0 cannot hold at all, even escaped.  Child output may contain
# them (terminal escapes, NUL), and one of them would make the whole file unreadable.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def clean(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def render(outcome: Outcome, suite: str = "jaxrun", tail_lines: int = summary.TAIL_LINES) -> str:
    """The whole document as text; pure apart from reading the run's log files."""
    suite_el = ET.Element("testsuite", name=suite)
    counts = {"failure": 0, "error": 0, "skipped": 0}
    failure = summary.engine_failure(outcome)  # once: it reads every process's log
    if outcome.start_error is not None:  # a restart that never started: one case says why
        case = ET.SubElement(suite_el, "testcase", classname=suite, name="start")
        ET.SubElement(case, "error", message=clean(f"did not start: {outcome.start_error}"))
        counts["error"] += 1
    for rec in outcome.records:
        case = ET.SubElement(suite_el, "testcase", classname=suite, name=f"process {rec.spec.rank}")
        if rec.started_at is not None and rec.ended_at is not None:
            case.set("time", f"{max(0.0, rec.ended_at - rec.started_at):.3f}")
        verdict = _result(outcome, rec, failure)
        if verdict is not None:
            kind, message, body = verdict
            counts[kind] += 1
            el = ET.SubElement(case, kind, message=clean(message))
            if body:
                el.text = clean(body)
        out, err = _output_tail(rec.stdout_log, tail_lines), _output_tail(rec.stderr_log, tail_lines)
        if out:
            ET.SubElement(case, "system-out").text = clean("\n".join(out) + "\n")
        if err:
            ET.SubElement(case, "system-err").text = clean("\n".join(err) + "\n")
    starts = [r.started_at for r in outcome.records if r.started_at is not None]
    ends = [r.ended_at for r in outcome.records if r.ended_at is not None]
    suite_el.set("tests", str(len(outcome.records) + (outcome.start_error is not None)))
    suite_el.set("failures", str(counts["failure"]))
    suite_el.set("errors", str(counts["error"]))
    suite_el.set("skipped", str(counts["skipped"]))
    if starts and ends:
        suite_el.set("time", f"{max(ends) - min(starts):.3f}")
        suite_el.set("timestamp", datetime.datetime.fromtimestamp(min(starts)).isoformat(timespec="seconds"))
    root = ET.Element("testsuites")
    root.append(suite_el)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _output_tail(path: str, n: int) -> list[str]:
    """The end of a log as the console shows it: without JAX's per-run noise."""
    lines = [line for line in summary.tail(path, 4 * n) if not is_noise(line.encode())]
    return lines[-n:]


def _result(outcome: Outcome, rec: ProcessRecord,
            failure: summary.EngineFailure | None) -> tuple[str, str, str] | None:
    """(element, message, text) for a process that did not pass; None if it
    passed.  ``failure``: the engine failure that is the root cause, if one is."""
    if rec.verdict is Verdict.OK:
        return None
    if failure is not None and rec.spec.rank in failure.ranks:  # one failure, named once
        if rec.verdict is Verdict.ROOT_CAUSE:
            return "failure", failure.headline, "\n".join(summary.tail(failure.note.log))
        return "skipped", f"ended when {failure.note.engine} failed first", ""
    if rec.verdict is Verdict.ROOT_CAUSE:
        err = summary.error_info(rec)
        if err:
            return "failure", err.headline, err.traceback
        _, tail = summary.last_output(rec)
        return "failure", f"{summary.describe_exit(rec)}", "\n".join(tail)
    if outcome.reason is StopReason.FAILURE and outcome.root_cause is not None:
        cause = failure.note.engine if failure else summary.where(outcome.records[outcome.root_cause])
        if rec.verdict is Verdict.CONSEQUENCE:
            return "skipped", f"{summary.describe_exit(rec)} after {cause} failed first", ""
        return "skipped", f"stopped by jaxrun after {cause} failed", ""
    if outcome.reason is StopReason.TIMEOUT:
        frame = innermost_user_frame(rec.stderr_log)
        where = f" at {frame[0]}:{frame[1]} in {frame[2]}: {frame[3]}" if frame else ""
        return "failure", f"still running when --timeout expired{where}", ""
    if outcome.reason is StopReason.SIGNAL and outcome.signum:
        return "error", f"stopped when jaxrun received {signal_name(outcome.signum)}", ""
    return "error", summary.describe_exit(rec), ""


def write(path: str, outcome: Outcome, suite: str = "jaxrun") -> None:
    report.write_or_warn("--junit-xml", path, render(outcome, suite).encode("utf-8"))
