"""The JSON run report (``--report FILE.json``): every attempt, every process."""

from __future__ import annotations

import dataclasses
import json
import sys

from jaxrun.contract import signal_name
from jaxrun.core.logfiles import write_atomically
from jaxrun.core.outcome import Outcome, ProcessRecord, Straggler
from jaxrun.reporting import diagnosis
from jaxrun.reporting.goodput import Account


def report_dict(outcomes: list[Outcome], run_id: str, log_dirs: list[str], not_restarted: str | None = None,
                account: Account | None = None) -> dict:
    """``not_restarted``: why a restart that was due did not happen (too few
    hosts left for ``--min-hosts``, the same failure twice), recorded on the
    last attempt too.  ``account``: the run's goodput so far.  Each attempt's diagnosis is the one kept on its
    outcome, where the run loop kept one."""
    attempts = []
    for outcome, log_dir in zip(outcomes, log_dirs):
        placement = outcome.placement
        attempts.append(
            {
                "log_dir": log_dir,
                # When the attempt began (wall clock, null if unknown): its
                # --timeout counts from here, placement and start-up included.
                "began_at": outcome.began_at,
                # Where it ran, and the hosts left out before it (lost in the
                # attempt before, or failing their check again), with why.
                "hosts": list(placement.hosts) if placement else None,
                "num_processes": placement.num_processes if placement else len(outcome.records),
                "dropped": [{"host": host, "why": why} for host, why in placement.dropped] if placement else [],
                "exit_code": outcome.exit_code,
                "stop_reason": outcome.reason.value if outcome.reason else None,
                "signal": signal_name(outcome.signum) if outcome.signum else None,
                "root_cause": _root_cause(diagnosis.of(outcome)),
                # The task id the coordination service saw register a second time
                # (from outside the job, or a process joining twice), or null.
                "second_registration": diagnosis.of(outcome).second_registration,
                # Why the attempt never started its processes (then ``processes`` is
                # empty), or null.
                "not_started": outcome.start_error,
                "processes": [_process_dict(r, outcome) for r in outcome.records],
                # The processes did not share fate (a recoverable job): a failed
                # process other than 0 left the others running.
                "recoverable": outcome.recoverable,
                # The process the others waited for, window after window (the
                # time account's rule, docs/time.md), or null.
                "straggler": straggler_dict(outcome.straggler),
                # Each window the straggler rule judged (docs/time.md): the process
                # that waited least, and how much more of their time the others waited.
                "windows": [{"least": least, "gap": by} for least, by in outcome.windows[-WINDOWS_KEPT:]],
                "not_restarted": None,
            }
        )
    last = attempts[-1]
    last["not_restarted"] = not_restarted
    return {
        "run_id": run_id,
        "exit_code": last["exit_code"],
        # Every restart jaxrun began, one that stopped in its start-up included:
        # each has its entry in ``attempts``.
        "restarts": len(attempts) - 1,
        "root_cause": last["root_cause"],
        "processes": last["processes"],
        "straggler": last["straggler"],
        "attempts": attempts,
        "not_restarted": not_restarted,
        # Where the run's wall time went, from jaxrun's start to this report:
        # parts (reporting.goodput.PARTS) that sum to "wall".
        "goodput": account.to_dict() if account is not None else None,
    }


WINDOWS_KEPT = 1000  # the report keeps the last this many windows of an attempt


def straggler_dict(found: Straggler | None) -> dict | None:
    if found is None:
        return None
    return {
        "rank": found.rank,
        "host": found.host,
        # The share of the other processes' accounted time they spent waiting (0..1).
        "lost": round(found.lost, 4),
        # What it spent its own time on, in seconds, and as a multiple of the others' median.
        "work": round(found.work, 3),
        "programs": round(found.programs, 3),
        "work_ratio": round(found.work_ratio, 3),
        "programs_ratio": round(found.programs_ratio, 3),
        "windows": found.windows,  # the windows that accused it, of those judged
        "judged": found.judged,
    }


def _root_cause(found: diagnosis.Diagnosis) -> dict | None:
    root, failure = found.root, found.engine
    if root is None:
        return None
    return {
        # "process failure", "engine failure" or "stall": what the fields below name
        "kind": found.kind.value,
        "process_id": root.rank,
        "host": root.host,
        "exit": root.exit,
        "exception": dataclasses.asdict(root.error) if root.error else None,
        "at": root.at,  # FILE:LINE of the user's code where it failed, where the logs say
        "stderr_tail": list(root.stderr_tail),
        # The scheduler step failed under its tasks: the process above is only
        # the first of those it ended.
        "engine": None if failure is None else {
            "name": failure.note.engine,
            "message": failure.headline,
            "process_ids": list(failure.ranks),
            "log": failure.note.log,
            "log_tail": list(failure.log_tail),
        },
        # The stall watchdog stopped the job: how long nobody moved, where most
        # processes waited (null: no place held more than the others), those
        # that stood out, the first of which is the process above, and those
        # whose own threads spun while their Python stood still (how many
        # threads, their CPU in cores).
        "stall": None if found.stall is None else {
            "seconds": found.stall.seconds,
            "waiting": _group(found.stall.waiting),
            "stand_out": [_group(g) for g in found.stall.odd],
            "spinning": [{"process_id": rank, "threads": s.threads, "cores": s.cores}
                         for rank, s in found.stall.spinning],
        },
    }


def _group(group) -> dict | None:
    if group is None:
        return None
    place = group.place
    return {"process_ids": list(group.ranks), "at": place.at, "function": place.func, "source": place.source,
            "state": place.state}


def _life_dict(r: ProcessRecord) -> dict:
    code = r.returncode
    return {
        "pid": r.pid,
        "exit_code": code if code is not None and code >= 0 else None,
        "signal": signal_name(-code) if code is not None and code < 0 else None,
        "verdict": r.verdict.value if r.verdict else None,
        "started_at": r.started_at,
        "ended_at": r.ended_at,
        # When jaxrun heard that its script returned (null: it never did, or
        # the stall watchdog's sampler was off, --stall-timeout 0).
        "finished_at": r.finished_at,
        "joined_at": r.joined_at,  # when jaxrun heard it reach the job's rendezvous (null: never)
        # When the process that reaped it saw it end, by that machine's clock
        # (null where its far end does not say).
        "reaped_at": r.reaped_at,
        "stdout_log": r.stdout_log,
        "stderr_log": r.stderr_log,
        # Each log file jaxrun stopped writing while the process went on (a
        # full disk): which, when, why, the bytes it holds and those it lacks.
        "logs_lost": [loss.to_dict() for loss in r.losses],
        "resources": r.resources.to_dict() if r.resources else None,
        # What it spent on compiles and checkpoint saves, and the steps it
        # marked, as its shim heard them (contract.Marks; null: it left none).
        "marks": r.marks.to_dict() if r.marks else None,
    }


def _process_dict(r: ProcessRecord, outcome: Outcome) -> dict:
    """The process's last life, and every life it had in the attempt: more
    than one where it restarted alone (a recoverable job)."""
    return {
        "process_id": r.spec.rank,
        "local_process_id": r.spec.local_rank,
        "host": r.spec.host.name,
        **_life_dict(r),
        # It failed first, at teardown, once every process's script had
        # returned: the work was done, and the run was not restarted.
        "finished_then_failed": outcome.work_finished and r.spec.rank == outcome.root_cause,
        "restarts": r.life,  # how many times it started again alone
        "lives": [_life_dict(life) for life in r.lives],
        # Where its time went since its join, its newest account (contract.TimeSplit's
        # fields, seconds; null where none came: --no-account, or it never joined).
        "time": split_dict(outcome.splits.get(r.spec.rank)),
    }


def split_dict(split) -> dict | None:
    if split is None:
        return None
    return {name: round(getattr(split, name), 3) for name in split.FIELDS}


def write_report(path: str, data: dict) -> None:
    """Atomically (a reader never sees half a report).  The folder was checked
    before the run; if it has gone since, say so in one line and carry on, so
    that the job's exit status and its remaining restarts are kept."""
    write_or_warn("--report", path, json.dumps(data, indent=2).encode())


def write_or_warn(option: str, path: str, data: bytes) -> None:
    try:
        write_atomically(path, data)
    except OSError as e:
        print(f"jaxrun: {option} {path}: cannot write it ({e.strerror or e})", file=sys.stderr, flush=True)
