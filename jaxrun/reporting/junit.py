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
from jaxrun.core.noise import FatalPages, is_noise
from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason, Verdict
from jaxrun.reporting import diagnosis, report
from jaxrun.reporting.diagnosis import Diagnosis, ProcessFacts, describe_exit

# Characters XML 1.0 cannot hold at all, even escaped.  Child output may contain
# them (terminal escapes, NUL), and one of them would make the whole file unreadable.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def clean(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def render(outcome: Outcome, suite: str = "jaxrun") -> str:
    """The whole document as text, from the outcome's diagnosis with every
    process's last lines (``diagnosis.of(outcome, outputs=True)``)."""
    found = diagnosis.of(outcome, outputs=True)
    suite_el = ET.Element("testsuite", name=suite)
    counts = {"failure": 0, "error": 0, "skipped": 0}
    if found.kind is diagnosis.Kind.START_ERROR:  # a restart that never started: one case says why
        case = ET.SubElement(suite_el, "testcase", classname=suite, name="start")
        ET.SubElement(case, "error", message=clean(f"did not start: {outcome.start_error}"))
        counts["error"] += 1
    for rec, facts in zip(outcome.records, found.processes):
        case = ET.SubElement(suite_el, "testcase", classname=suite, name=f"process {rec.spec.rank}")
        first = rec.lives[0].started_at  # its first life's start: a process that restarted alone ran longer
        if first is not None and rec.ended_at is not None:
            case.set("time", f"{max(0.0, rec.ended_at - first):.3f}")
        verdict = _result(outcome, rec, facts, found)
        earlier = _earlier_lives(rec)
        if verdict is not None:
            kind, message, body = verdict
            counts[kind] += 1
            el = ET.SubElement(case, kind, message=clean(message))
            if body or earlier:
                el.text = clean("\n".join(filter(None, [body, *earlier])))
        out, err = _output_tail(facts.stdout), _output_tail(facts.stderr)
        if earlier and verdict is None:  # it passed in the end: its failed lives go with its output
            out = [*earlier, *out]
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


def _earlier_lives(rec: ProcessRecord) -> list[str]:
    """A line for each failed life of a process that restarted alone."""
    return [f"jaxrun: life {i + 1} of {len(rec.lives)} (pid {life.pid}) {describe_exit(life)}; started again alone; "
            f"its output is in {life.stdout_log} and {life.stderr_log}" for i, life in enumerate(rec.earlier)]


def _output_tail(lines: tuple[str, ...]) -> list[str]:
    """The end of a log as the console shows it: without JAX's per-run noise
    and its fatal-error pages (a process that aborted after a peer was gone
    would otherwise end in its C++ stack's frames)."""
    pages = FatalPages()
    return [line for line in lines
            if not is_noise(data := line.encode()) and not pages.hides(0, data)][-diagnosis.TAIL_LINES:]


def _result(outcome: Outcome, rec: ProcessRecord, facts: ProcessFacts,
            found: Diagnosis) -> tuple[str, str, str] | None:
    """(element, message, text) for a process that did not pass; None if it passed."""
    if rec.verdict is Verdict.OK:
        return None
    failure, root = found.engine, found.root
    if failure is not None and rec.spec.rank in failure.ranks:  # one failure, named once
        if rec.verdict is Verdict.ROOT_CAUSE:
            return "failure", failure.headline, "\n".join(failure.log_tail)
        return "skipped", f"ended when {failure.note.engine} failed first", ""
    if rec.verdict is Verdict.ROOT_CAUSE and root is not None and root.rank == rec.spec.rank:
        if root.error:
            return "failure", root.error.headline, root.error.traceback
        return "failure", root.exit, "\n".join(root.output)
    if rec.verdict is Verdict.FAILED_ALONE:  # a recoverable job's: the others went on without it
        return "failure", describe_exit(rec), ""
    if outcome.reason is StopReason.FAILURE and root is not None:
        cause = failure.note.engine if failure else root.where
        if rec.verdict is Verdict.CONSEQUENCE:
            return "skipped", f"{describe_exit(rec)} after {cause} failed first", ""
        return "skipped", f"stopped by jaxrun after {cause} failed", ""
    if outcome.stall is not None:
        group = next((g for g in outcome.stall.odd if rec.spec.rank in g.ranks), None)
        if group is not None:
            return "failure", f"stalled at {group.place.text()} (--stall-timeout {outcome.stall.seconds:g})", \
                "\n".join(diagnosis.stall_lines(outcome.stall, outcome.records))
        return "skipped", f"stopped by jaxrun after the job stalled; it waited at {_frame_text(facts)}", ""
    if outcome.reason is StopReason.TIMEOUT:
        frame = facts.frame
        where = f" at {frame[0]}:{frame[1]} in {frame[2]}: {frame[3]}" if frame else ""
        return "failure", f"still running when --timeout expired{where}", ""
    if outcome.reason is StopReason.SIGNAL and outcome.signum:
        return "error", f"stopped when jaxrun received {signal_name(outcome.signum)}", ""
    return "error", describe_exit(rec), ""


def _frame_text(facts: ProcessFacts) -> str:
    frame = facts.frame
    return f"{frame[0]}:{frame[1]} in {frame[2]}: {frame[3]}" if frame else "an unknown place"


def write(path: str, outcome: Outcome, suite: str = "jaxrun") -> None:
    """``render`` into ``path``, atomically."""
    report.write_or_warn("--junit-xml", path, render(outcome, suite).encode("utf-8"))
