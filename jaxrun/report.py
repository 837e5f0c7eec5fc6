"""After the run: the console summary, the JSON run report, and stack-dump reading."""

from __future__ import annotations

import json
import linecache
import os
import re
from typing import Iterable

from jaxrun.spawn import signal_name
from jaxrun.supervisor import Outcome, ProcessRecord, StopReason, Verdict

TAIL_LINES = 15

_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_LIBRARY_PARTS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
# jaxrun's own package folder (not any folder that happens to be called jaxrun,
# such as a checkout of this repository holding the user's script).
_OWN_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def describe_exit(record: ProcessRecord) -> str:
    code = record.returncode
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal_name(-code)}"
    return f"exit code {code}"


def tail(path: str, n: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-n:]


def _is_user_file(path: str) -> bool:
    return (
        not path.startswith(("<", _OWN_PACKAGE))
        and not any(p in path for p in _LIBRARY_PARTS)
        and "/lib/python" not in path
    )


def innermost_user_frame(stderr_path: str) -> tuple[str, int, str, str] | None:
    """From the last faulthandler dump in a log: the main thread's innermost frame
    in the user's own code, as (file, line, function, source text)."""
    try:
        with open(stderr_path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    start = text.rfind("Current thread 0x")
    if start < 0:
        return None
    for line in text[start:].splitlines()[1:]:
        if _THREAD.match(line) or not line.strip():
            break
        m = _FRAME.match(line)
        if m and _is_user_file(m["file"]):
            source = linecache.getline(m["file"], int(m["line"])).strip()
            return m["file"], int(m["line"]), m["func"], source
    return None


def error_info(record: ProcessRecord) -> dict | None:
    try:
        with open(record.error_file) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def where(record: ProcessRecord) -> str:
    host = record.spec.host.name
    return f"process {record.spec.rank}" + ("" if host == "localhost" else f" on {host}")


def summary_lines(outcome: Outcome, log_dir: str, show_frames: bool = False) -> list[str]:
    lines: list[str] = []
    if outcome.reason is StopReason.TIMEOUT:
        lines.append("jaxrun: --timeout expired; stack dumps are in each process's stderr log")
    elif outcome.reason is StopReason.SIGNAL:
        lines.append(f"jaxrun: received {signal_name(outcome.signum)}; stopped every process")
    if outcome.root_cause is not None:
        rec = outcome.records[outcome.root_cause]
        lines.append(f"jaxrun: {where(rec)} failed first: {describe_exit(rec)} (pid {rec.pid})")
        err = error_info(rec)
        if err:
            lines.append(f"jaxrun:   {err['type']}: {err['message']}")
        body = tail(rec.stderr_log) or tail(rec.stdout_log)
        if body:
            lines.append(f"jaxrun:   last lines of {rec.stderr_log}:")
            lines.extend(f"    {line}" for line in body)
    others = _group(r for r in outcome.records if r.verdict in (Verdict.STOPPED, Verdict.CONSEQUENCE))
    for verdict, ranks in others.items():
        noun = "processes" if "," in ranks else "process"
        lines.append(f"jaxrun: {noun} {ranks} {verdict.value}")
    if show_frames or outcome.reason is not None:
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


def report_dict(outcomes: list[Outcome], run_id: str, log_dirs: list[str]) -> dict:
    attempts = []
    for outcome, log_dir in zip(outcomes, log_dirs):
        attempts.append(
            {
                "log_dir": log_dir,
                "exit_code": outcome.exit_code,
                "stop_reason": outcome.reason.value if outcome.reason else None,
                "signal": signal_name(outcome.signum) if outcome.signum else None,
                "root_cause": _root_cause(outcome),
                "processes": [_process_dict(r) for r in outcome.records],
            }
        )
    last = attempts[-1]
    return {
        "run_id": run_id,
        "exit_code": last["exit_code"],
        "restarts": len(attempts) - 1,
        "root_cause": last["root_cause"],
        "processes": last["processes"],
        "attempts": attempts,
    }


def _root_cause(outcome: Outcome) -> dict | None:
    if outcome.root_cause is None:
        return None
    rec = outcome.records[outcome.root_cause]
    err = error_info(rec)
    return {
        "process_id": rec.spec.rank,
        "host": rec.spec.host.name,
        "exit": describe_exit(rec),
        "exception": err,
        "stderr_tail": tail(rec.stderr_log),
    }


def _process_dict(r: ProcessRecord) -> dict:
    code = r.returncode
    return {
        "process_id": r.spec.rank,
        "local_process_id": r.spec.local_rank,
        "host": r.spec.host.name,
        "pid": r.pid,
        "exit_code": code if code is not None and code >= 0 else None,
        "signal": signal_name(-code) if code is not None and code < 0 else None,
        "verdict": r.verdict.value if r.verdict else None,
        "started_at": r.started_at,
        "ended_at": r.ended_at,
        "stdout_log": r.stdout_log,
        "stderr_log": r.stderr_log,
    }


def write_report(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)
