"""After each attempt: the lines the console shows, and the facts that the
JSON report, JUnit and GitHub annotations share with it."""

from __future__ import annotations

from typing import Iterable

from jaxrun.contract import ErrorRecord, signal_name
from jaxrun.launcher.control import BUG_REPORT
from jaxrun.launcher.outcome import Outcome, ProcessRecord, StopReason, Verdict
from jaxrun.reporting.stacks import innermost_user_frame, read_small, read_tail

TAIL_LINES = 15
# How much of the end of a log the summary and the reports take their lines
# from: logs may be many gigabytes.
LOG_TAIL = 64 * 1024
# An error record is one exception's headline and traceback.  A larger one
# (an exception with a giant message) is not read: the summary then shows the
# end of the log instead.
ERROR_RECORD_MAX = 1 << 20


def describe_exit(record: ProcessRecord) -> str:
    code = record.returncode
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal_name(-code)}"
    return f"exit code {code}"


def tail(path: str, n: int = TAIL_LINES) -> list[str]:
    data = read_tail(path, LOG_TAIL)
    return [] if data is None else data.decode("utf-8", "replace").splitlines()[-n:]


def error_info(record: ProcessRecord) -> ErrorRecord | None:
    data = read_small(record.error_file, ERROR_RECORD_MAX) if record.error_file else None
    return None if data is None else ErrorRecord.from_json(data.decode("utf-8", "replace"))


def where(record: ProcessRecord) -> str:
    host = record.spec.host.name
    return f"process {record.spec.rank}" + ("" if host == "localhost" else f" on {host}")


def last_output(record: ProcessRecord) -> tuple[str, list[str]]:
    """The end of what a process printed: its stderr log, or its stdout log
    when stderr is empty.  (path, lines)."""
    for path in (record.stderr_log, record.stdout_log):
        lines = tail(path)
        if lines:
            return path, lines
    return record.stderr_log, []


def summary_lines(outcome: Outcome, log_dir: str) -> list[str]:
    lines: list[str] = []
    started = any(r.pid is not None for r in outcome.records)
    if outcome.reason is StopReason.TIMEOUT:
        lines.append("jaxrun: --timeout expired; stack dumps are in each process's stderr log")
    elif outcome.reason is StopReason.SIGNAL:
        stopped = "stopped every process" if started else "no process had started"
        lines.append(f"jaxrun: received {signal_name(outcome.signum)}; {stopped}")
    elif outcome.reason is StopReason.INTERNAL:
        lines.append(f"jaxrun: internal error: {outcome.fault}; stopped every process")
        lines.append(f"jaxrun:   {BUG_REPORT}")
    for problem in outcome.log_errors:
        lines.append(f"jaxrun: logs incomplete: {problem}")
    if outcome.root_cause is not None:
        rec = outcome.records[outcome.root_cause]
        lines.append(f"jaxrun: {where(rec)} failed first: {describe_exit(rec)} (pid {rec.pid})")
        err = error_info(rec)
        if err:
            lines.append(f"jaxrun:   {err.headline}")
        path, body = last_output(rec)
        if body:
            lines.append(f"jaxrun:   last lines of {path}:")
            lines.extend(f"    {line}" for line in body)
    others = _group(r for r in outcome.records
                    if r.verdict in (Verdict.STOPPED, Verdict.CONSEQUENCE, Verdict.NOT_STARTED))
    for verdict, ranks in others.items():
        noun = "processes" if "," in ranks else "process"
        lines.append(f"jaxrun: {noun} {ranks} {verdict.value}")
    if outcome.reason is not None:
        for rec in outcome.records:
            frame = innermost_user_frame(rec.stderr_log)
            if frame:
                file, line, func, source = frame
                lines.append(f"jaxrun:   {where(rec)} was at {file}:{line} in {func}: {source}")
    lines.append(f"jaxrun: logs in {log_dir}")
    return lines


def _group(records: Iterable[ProcessRecord]) -> dict[Verdict, str]:
    groups: dict[Verdict, list[str]] = {}
    for r in records:
        groups.setdefault(r.verdict, []).append(str(r.spec.rank))
    return {v: ", ".join(ranks) for v, ranks in groups.items()}
