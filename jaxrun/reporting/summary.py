"""After each attempt: the lines the console shows, formatted from the
attempt's diagnosis (``reporting.diagnosis``); nothing here reads a log."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from jaxrun import contract
from jaxrun.contract import FlightEntry, FlightLog, signal_name
from jaxrun.core.outcome import BUG_REPORT, Outcome, ProcessRecord, StopReason, Verdict
from jaxrun.reporting import diagnosis, stacks
from jaxrun.reporting.diagnosis import ENDED_BY_OTHERS, Diagnosis, EngineFailure, Kind, where
from jaxrun.reporting.stacks import dumped_state as dumped_state  # its older name, for its callers

# What the summary quotes of a text the console has shown already (an
# exception, the end of a log): at most this many lines, each cut at
# QUOTED_WIDTH characters; the rest is in the file it names.
EXCEPTION_LINES = 4
QUOTED_LINES = 10
QUOTED_WIDTH = 400


def summary_lines(outcome: Outcome, log_dir: str, run_lines: Iterable[str] = (), quiet: bool = False) -> list[str]:
    """``log_dir``: the folder the last line names.  The failure comes
    first, then what the others did; ``run_lines`` (the run's own, as its
    goodput) and the figures follow, and the log folder ends it.  ``quiet``
    (-q): the failure and the log folder only."""
    found = diagnosis.of(outcome)
    if found.kind is Kind.START_ERROR:  # a restart that never started its processes
        said = f"error: {outcome.start_error}" if outcome.reason is StopReason.NOT_STARTED else \
            f"{outcome.start_error}; no process was started"
        return [f"jaxrun: {said}", f"jaxrun: logs in {log_dir}"]
    lines: list[str] = []
    started = any(r.pid is not None for r in outcome.records)
    if outcome.reason is StopReason.TIMEOUT:
        lines.append("jaxrun: --timeout expired; stack dumps are in each process's stderr log")
    elif outcome.stall is not None:
        first, second = diagnosis.stall_lines(outcome.stall, outcome.records)
        lines.append(f"jaxrun: {first} (--stall-timeout); stack dumps are in each process's stderr log")
        lines.append(f"jaxrun:   {second}")
    elif outcome.reason is StopReason.SIGNAL:
        lines.append(signal_line(outcome, started))
    elif outcome.reason is StopReason.INTERNAL:
        lines.append(f"jaxrun: internal error: {outcome.fault}; stopped every process")
        lines.append(f"jaxrun:   {BUG_REPORT}")
    for problem in outcome.log_errors:
        lines.append(f"jaxrun: logs incomplete: {problem}")
    shared: set[int] = set()  # the ranks an engine failure ended, named in its line
    failure, root = found.engine, found.root
    if found.second_registration is not None:
        shared = {r.spec.rank for r in outcome.records if r.verdict in (Verdict.ROOT_CAUSE, Verdict.CONSEQUENCE)}
        lines.extend(second_registration_lines(found.second_registration, sorted(shared)))
    elif failure is not None:
        shared = set(failure.ranks)
        lines.extend(engine_failure_lines(failure, root.pid))
    elif root is not None and found.kind is not Kind.STALL:
        lines.extend(parted_lines(outcome, found))
        lines.append(root_line(outcome, root))
        if root.error:
            lines.extend(exception_lines(root))
        if root.oom:
            lines.append(f"jaxrun:   {root.oom}")
        if root.output and not root.error:  # an exception's log ends with its traceback, which the console showed
            lines.append(f"jaxrun:   last lines of {root.output_path}:")
            lines.extend(quoted(root.output, QUOTED_LINES, root.output_path, "    "))
    others = _group(r for r in outcome.records
                    if r.verdict in (*ENDED_BY_OTHERS, Verdict.FAILED_ALONE) and r.spec.rank not in shared)
    alike = same_error(outcome.records, found)  # ended after the root cause, but raised its error themselves
    for verdict, ranks in others.items():
        ranks = ", ".join(rank for rank in ranks.split(", ") if int(rank) not in alike)
        if ranks:
            lines.append(f"jaxrun: {'processes' if ',' in ranks else 'process'} {ranks} {verdict.value}")
    if alike:
        lines.append(f"jaxrun: {_ranks(alike)} raised the same {found.root.error.type} "
                     f"{'themselves' if len(alike) > 1 else 'itself'}, after the root cause")
    if outcome.reason is not None:
        lines.extend(place_lines(outcome.records, found))
        # A check's diagnosis says where each process stood when it judged: the
        # dumps' later word on who had finished would only repeat it, or differ.
        lines.extend(divergence_lines(found, states=not judged(found.root)))
    for rec in outcome.records:
        if rec.resources and rec.resources.oom and rec.spec.rank != outcome.root_cause:
            lines.append(f"jaxrun: {where(rec)}: {rec.resources.oom}")
    lines.extend(rerun_line(rec) for rec in outcome.records if rec.earlier)
    if not quiet:
        if outcome.straggler is not None:
            lines.append(f"jaxrun: {outcome.straggler.line()}")
        lines.extend(run_lines)
        lines.extend(resource_lines(outcome.records))
    # The console's count of what it left to the logs rides on their line (issue 74: a few lines a failure).
    pages = f" ({outcome.pages}, left off the console; -v shows them)" if outcome.pages else ""
    lines.append(f"jaxrun: logs in {log_dir}{pages}")
    return lines


def quoted(lines: Iterable[str], limit: int, path: str, indent: str) -> list[str]:
    """At most ``limit`` of ``lines`` (the last ones), each cut at
    QUOTED_WIDTH characters; where any were left out, a line that says how
    many and names ``path``, which holds them."""
    lines = list(lines)
    shown = [indent + _cut(line) for line in lines[-limit:]]
    if len(lines) > limit:
        shown.insert(0, f"{indent}({len(lines) - limit} lines above these are in {path})")
    return shown


def _cut(line: str) -> str:
    return line if len(line) <= QUOTED_WIDTH else line[:QUOTED_WIDTH] + " [...]"


def exception_lines(root: diagnosis.RootCause) -> list[str]:
    """The root cause's exception: its first EXCEPTION_LINES lines, each cut
    at QUOTED_WIDTH, where the user's code raised it, and the log that holds
    it whole with its traceback."""
    text = root.error.headline.splitlines() or [root.error.type]
    lines = [f"jaxrun:   {_cut(line)}" for line in text[:EXCEPTION_LINES]]
    more = len(text) - EXCEPTION_LINES
    cut = more > 0 or any(len(line) > QUOTED_WIDTH for line in text[:EXCEPTION_LINES])
    at = f"raised at {root.at}; " if root.at else ""
    if not stacks.has_traceback(root.error.traceback):
        # jaxrun stopped it (a check, a refusal): its log holds jaxrun's lines,
        # its error record the whole of it.  A check's lines are the job's one
        # diagnosis: the console left every process's copy to the logs.
        lines.extend(quoted(diagnosis_of(root.error), QUOTED_LINES, root.error_path, "jaxrun:   "))
        said = f"{more} more lines of it are in" if more > 0 else ("all of it is in" if cut else "its record:")
        lines.append(f"jaxrun:   {at}no traceback (jaxrun stopped it); {said} {root.error_path}")
        return lines
    said = f"{more} more lines of it, and its traceback," if more > 0 else \
        ("all of it, and its traceback," if cut else "its traceback")
    lines.append(f"jaxrun:   {at}{said} in {root.output_path}")
    return lines


def diagnosis_of(error: contract.ErrorRecord) -> list[str]:
    """A check's lines in its error record (jaxrun's own lines, which its
    process wrote under contract.DIAGNOSIS_HEAD), less the exception's own."""
    said = [line.removeprefix("jaxrun: ") for line in error.traceback.splitlines() if line.startswith("jaxrun: ")]
    return [line for line in said if line not in (error.message, error.headline)]


def judged(root: diagnosis.RootCause | None) -> bool:
    """Whether the root cause is a check's stop that says what it saw."""
    return root is not None and root.error is not None and not stacks.has_traceback(root.error.traceback) \
        and bool(diagnosis_of(root.error))


def place_lines(records: list[ProcessRecord], found: Diagnosis) -> list[str]:
    """Where each process was when it ended: one line per place, its
    processes together ("processes 1, 2, 3 were at train.py:7 ...")."""
    places: dict[tuple, list[ProcessRecord]] = {}
    root = found.root
    for rec, facts in zip(records, found.processes):
        if not facts.frame:
            continue
        if root is not None and rec.spec.rank == root.rank and f"{facts.frame[0]}:{facts.frame[1]}" == root.at:
            continue  # the root cause's line, which its exception's lines name already
        places.setdefault(facts.frame, []).append(rec)
    lines = []
    for (file, line, func, source), recs in places.items():
        who = where(recs[0]) + " was" if len(recs) == 1 else \
            "processes " + ", ".join(str(r.spec.rank) for r in recs) + " were"
        lines.append(f"jaxrun:   {who} at {file}:{line} in {func}: {source}")
    return lines


# Gloo's words where processes that a collective spans reached different ones:
# "Received data size doesn't match expected size. Is there a distributed
# collective mismatch in your code?" (the process aborts: SIGABRT).
COLLECTIVE_MISMATCH = re.compile(r"(Received data size doesn't match expected size)|collective mismatch")


def parted_lines(outcome: Outcome, found: Diagnosis) -> list[str]:
    """Where the root cause aborted in a collective that did not match, and
    the processes stood at different lines: they parted there, and that is
    the failure (the abort is its consequence)."""
    root = found.root
    said = next((line for line in reversed(root.stderr_tail) if COLLECTIVE_MISMATCH.search(line)), None)
    if said is None:
        return []
    places: dict[tuple, list[int]] = {}
    finished: list[int] = []  # their script returned: the others' collectives met no one there
    for rec, facts in zip(outcome.records, found.processes):
        if facts.frame:
            places.setdefault(facts.frame, []).append(rec.spec.rank)
        elif rec.finished_at:
            finished.append(rec.spec.rank)
    if not places or len({frame[:2] for frame in places}) + bool(finished) < 2:
        return []
    sides = sorted(places.items(), key=lambda side: (len(side[1]), side[1]))
    what = COLLECTIVE_MISMATCH.search(said)
    pieces = [f"{'process' if len(ranks) == 1 else 'processes'} {', '.join(map(str, ranks))} at "
              f"{os.path.basename(frame[0])}:{frame[1]}: {frame[3]}" for frame, ranks in sides]
    if finished:
        pieces.append(f"{'process' if len(finished) == 1 else 'processes'} {', '.join(map(str, finished))} "
                      f"finished {'its' if len(finished) == 1 else 'their'} script")
    return [f"jaxrun: the processes parted: {'; '.join(pieces)} (a program that spans processes runs on every "
            f"one of them, or on none); their collectives did not match ({what[0]})"]


def root_line(outcome: Outcome, root) -> str:
    """The root cause's line; a failure at teardown says that the work was
    done (every script had returned), or that its own script had."""
    if outcome.work_finished:
        return (f"jaxrun: the work finished (every process's script returned); then {root.where} failed at "
                f"teardown: {root.exit} (pid {root.pid})")
    rec = next((r for r in outcome.records if r.spec.rank == root.rank), None)
    after = "; its script had returned (it failed at teardown)" if rec is not None and rec.finished_at else ""
    return f"jaxrun: {root.where} failed first: {root.exit} (pid {root.pid}){after}"


def second_registration_lines(task: int, aborted: list[int]) -> list[str]:
    """The coordination service saw a task register twice, and made the
    job's processes abort: none of them is to blame."""
    return [f"jaxrun: task {task} of the job registered a second time with the coordination service, "
            f"while process {task} was connected: another process registered as it (from outside the job: "
            f"the service has no authentication), or process {task} joined twice",
            f"jaxrun:   the service then ended the job: {_ranks(aborted)} failed after it "
            "(see docs/security.md)"]


def rerun_line(rec: ProcessRecord) -> str:
    """A recoverable job's process that started again alone: each life's end."""
    lives = "; ".join(f"life {i + 1} (pid {life.pid}) {diagnosis.describe_exit(life)}"
                      for i, life in enumerate(rec.earlier))
    last = "exited 0" if rec.returncode == 0 else diagnosis.describe_exit(rec)
    times = "once" if len(rec.earlier) == 1 else f"{len(rec.earlier)} times"
    return f"jaxrun: {where(rec)} started again alone {times}: {lives}; its last life (pid {rec.pid}) {last}"


def signal_line(outcome: Outcome, started: bool) -> str:
    """How a stop on a signal went: a clean one, where every process exited 0
    after the forwarded signal (a checkpoint saved on SIGTERM), says so."""
    name = signal_name(outcome.signum)
    if started and outcome.records and all(r.returncode == 0 for r in outcome.records):
        within = "" if outcome.stop_seconds is None else f" within {outcome.stop_seconds:.1f} s"
        return f"jaxrun: stopped on {name}; every process exited 0{within}"
    stopped = "stopped every process" if started else "no process had started"
    return f"jaxrun: received {name}; {stopped}"


def resource_lines(records: list[ProcessRecord]) -> list[str]:
    """Which process peaked highest, and the CPU time of them all (from the
    figures measured where each ran; processes without figures are left out
    and counted)."""
    measured = [r for r in records if r.resources is not None]
    if not measured:
        return []
    top = max(measured, key=lambda r: r.resources.peak_rss_bytes)
    low = min(r.resources.peak_rss_bytes for r in measured)
    spread = "" if len(measured) == 1 else f" (lowest {contract.format_bytes(low)})"
    cpu = sum(r.resources.cpu_seconds for r in measured)
    unknown = len(records) - len(measured)
    missing = f"; {unknown} without figures" if unknown else ""
    return [f"jaxrun: peak memory {contract.format_bytes(top.resources.peak_rss_bytes)} in {where(top)}{spread}; "
            f"{cpu:.1f} CPU seconds in all{missing}"]


def engine_failure_lines(failure: EngineFailure, pid: int | None) -> list[str]:
    """The engine failure named once, for every process it ended, with the
    end of the engine's own output.  ``pid``: the first process it ended."""
    lines = [f"jaxrun: {failure.headline} (pid {pid})"]
    if failure.log_tail:
        lines.append(f"jaxrun:   last lines of {failure.note.log}:")
        lines.extend(quoted(failure.log_tail, QUOTED_LINES, failure.note.log, "    "))
    return lines


def same_error(records: list[ProcessRecord], found: Diagnosis) -> list[int]:
    """The processes that ended after the root cause having raised its very
    error (type and message) themselves: not its consequences."""
    root = found.root
    if root is None or root.error is None:
        return []
    error = (root.error.type, root.error.message)
    return [rec.spec.rank for rec, facts in zip(records, found.processes)
            if rec.spec.rank != root.rank and facts.raised == error]


def _group(records: Iterable[ProcessRecord]) -> dict[Verdict, str]:
    groups: dict[Verdict, list[str]] = {}
    for r in records:
        groups.setdefault(r.verdict, []).append(str(r.spec.rank))
    return {v: ", ".join(ranks) for v, ranks in groups.items()}


# -- where each process was, and what it last ran ---------------------------------------

def divergence_lines(found: Diagnosis, states: bool = True) -> list[str]:
    """After a stop: which processes had finished the script (and wait in JAX's
    shutdown for the others) and which were still in it (``states``), and, from
    the flight recorder's blocks (--flight-recorder), the call where the
    processes parted and the program each one ran last."""
    logs = {p.rank: p.flight for p in found.processes if p.flight is not None}
    said = state_lines({p.rank: p.state for p in found.processes if p.state}) if states else []
    return said + line_up(logs)


def _ranks(ranks: list[int]) -> str:
    return ("process " if len(ranks) == 1 else "processes ") + ", ".join(map(str, ranks))


def state_lines(states: dict[int, str]) -> list[str]:
    """One line, when any process had finished its script: those that had
    apart from those still in it."""
    if not any(s != contract.IN_SCRIPT for s in states.values()):
        return []
    groups: dict[str, list[int]] = {}
    for rank in sorted(states):
        groups.setdefault(states[rank], []).append(rank)
    words = {
        contract.IN_SHUTDOWN: ("had finished the script and was waiting in JAX's shutdown",
                               "had finished the script and were waiting in JAX's shutdown"),
        contract.SCRIPT_RETURNED: ("had finished the script", "had finished the script"),
        contract.IN_SCRIPT: ("was still in the script", "were still in the script"),
    }
    parts = [f"{_ranks(groups[s])} {words[s][len(groups[s]) > 1]}"
             for s in (contract.IN_SHUTDOWN, contract.SCRIPT_RETURNED, contract.IN_SCRIPT) if s in groups]
    return ["jaxrun: " + "; ".join(parts)]


def _ran(entry: FlightEntry) -> str:
    call = "a local program" if entry.call is None else f"call {entry.call}"
    return f"{call} {entry.label} ({entry.where})"


def _sides(groups: dict[object, list[int]], say) -> str:
    """"process 2 ran X; processes 0, 1, 3 ran Y": the smaller side first."""
    order = sorted(groups, key=lambda k: (len(groups[k]), groups[k][0]))
    return "; ".join(f"{_ranks(groups[k])} {say(k, len(groups[k]) > 1)}" for k in order)


def line_up(logs: dict[int, FlightLog]) -> list[str]:
    """The processes' flight records side by side: the first call (among
    programs that span processes) where they ran different programs, if their
    records reach back to it, and the program each one ran last."""
    lines = []
    calls = {r: {e.call: e for e in log.entries if e.call is not None} for r, log in sorted(logs.items())}
    parted = first_difference(calls)
    if parted is not None:
        call, groups = parted

        def say(key, plural):
            if isinstance(key, int):
                return f"{'were' if plural else 'was'} done after call {key}"
            return f"ran {key.label} ({key.where})"

        reach = max(min(entries) for entries in calls.values() if entries)
        where = f"parted at call {call}" if reach == 1 else \
            f"first differ at call {call} of the calls their records hold (from call {reach} on)"
        lines.append(f"jaxrun: the processes {where}: {_sides(groups, say)}")
    last: dict[tuple, list[int]] = {}
    shown: dict[tuple, FlightEntry] = {}
    for rank, log in sorted(logs.items()):
        spanning = [e for e in log.entries if e.call is not None]
        entry = spanning[-1] if spanning else (log.entries[-1] if log.entries else None)
        if entry is not None:
            key = (entry.call, entry.fingerprint, entry.label, entry.file, entry.line)
            last.setdefault(key, []).append(rank)
            shown.setdefault(key, entry)
    if last:
        lines.append("jaxrun: " + _sides(last, lambda key, plural: f"last ran {_ran(shown[key])}"))
    return lines


def first_difference(calls: dict[int, dict[int, FlightEntry]]) -> tuple[int, dict[object, list[int]]] | None:
    """(call, sides) at the first call where the processes' records differ.
    A side is keyed by an entry (its program), or, for processes that made
    no such call, by the number of their last call.  Only calls that every
    record still holds, or that come after a record's last call, count."""
    held = {rank: entries for rank, entries in calls.items() if entries}
    if len(held) < 2:
        return None
    start = max(min(entries) for entries in held.values())
    end = max(max(entries) for entries in held.values())
    for call in range(start, end + 1):
        groups: dict[object, list[int]] = {}
        programs: dict[str, FlightEntry] = {}
        for rank, entries in held.items():
            entry = entries.get(call)
            key: object = max(entries) if entry is None else programs.setdefault(entry.fingerprint, entry)
            groups.setdefault(key, []).append(rank)
        if len(groups) > 1:
            return call, groups
    return None
