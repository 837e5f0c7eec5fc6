"""The run's timeline: the event log the launcher keeps during a run, and
its picture, a Chrome trace that Perfetto and chrome://tracing open.

The launcher appends one JSON object a line to ``timeline.jsonl`` in the
run's log folder (its writer is ``launcher.output.timeline``), each with
``t`` (the wall clock, ``time.time()``) and ``event``, one of the words
below.  ``attempt`` is the attempt's number (0: the first), ``rank`` the
process, ``life`` its life in the attempt (0: its first start; more where a
recoverable job's process started again alone):

- ``attempt``: an attempt begins (``log_dir``); its ``t`` is the report's
  ``began_at``;
- ``state``: a process's state changed (``state``: started, joined, working,
  waiting, finished, ended; pending: a new life, to be started again
  alone), with its ``host``, its ``pid`` once started, its ``exit`` (shell
  style) once ended;
- ``join``: a process reached the job's rendezvous;
- ``signal``: jaxrun sent ``signal`` to ``ranks`` (SIGUSR1: stack dumps
  asked; SIGTERM, SIGINT forwarded; SIGKILL);
- ``attempt_end``: the attempt is over (``exit_code``, ``reason``, and
  ``processes``: each life's ``verdict`` and ``exit``);
- ``restart``: the whole job starts again (``why``, ``elastic``);
- ``goodput``: at the run's end, the run's goodput as the report has it
  (``wall``, ``parts``, ``share``, ``no_checkpoint``), with ``spans``: each
  ``[part, begin, end, attempt]`` that lies at a known time (start-up, work,
  lost, stall, teardown, restart; compiles, saves, waiting and the host's
  input and idle time are sums inside the work, given in its span's arguments).

``chrome_trace`` turns the events into the Trace Event Format: a track
group per process (``process N (host)``) with a row of its lives and a row
of its states, a group for the attempts, instants for joins, signals, ends
and restarts.  Times are the wall clock in microseconds, as in the events.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import BinaryIO

from jaxrun import contract

FILE = "timeline.jsonl"
# The words of the event log (``event``).
ATTEMPT, STATE, JOIN, SIGNAL, ATTEMPT_END, RESTART = "attempt", "state", "join", "signal", "attempt_end", "restart"
GOODPUT = "goodput"
# The states a ``state`` line names (a slot's states, as words).
STARTED, ENDED, PENDING = "started", "ended", "pending"
# What a state's span is called in the picture.
SPAN_NAMES = {STARTED: "starting", "joined": "joined", "working": "working", "waiting": "waiting",
              "finished": "finished (script returned)"}
DUMP = signal.Signals.SIGUSR1.name
MAX_LINE = 1 << 16  # longer is not one of ours

JOB_PID = 0  # the attempts' group; process N's is N + 1
LIVES_TID, STATES_TID, GOODPUT_TID = 1, 2, 3


def read(path: str) -> list[dict] | None:
    """The events in the file, in the order written; None: there is none
    (a run from before the timeline).  A line cut short (a run still
    writing, a full disk) is skipped."""
    f = contract.open_regular(path)
    if f is None:
        return None
    events = []
    with f:
        for line in lines(f):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("t"), (int, float)) and "event" in event:
                events.append(event)
    return events


def lines(f: BinaryIO) -> Iterator[bytes]:
    """Whole lines of at most MAX_LINE bytes; a longer one is skipped."""
    too_long = False
    while line := f.readline(MAX_LINE):
        whole = line.endswith(b"\n")
        if not too_long and (whole or len(line) < MAX_LINE):
            yield line
        too_long = not whole and len(line) == MAX_LINE


def began(path: str) -> float | None:
    """When the run of this timeline began: its first event's time."""
    f = contract.open_regular(path)
    if f is None:
        return None
    with f:
        try:
            first = json.loads(f.readline(MAX_LINE))
        except ValueError:
            return None
    return first.get("t") if isinstance(first, dict) and isinstance(first.get("t"), (int, float)) else None


def micros(t: float) -> int:
    return round(t * 1_000_000)


class TraceBuilder:
    """One pass over the events; spans still open at the end (a run that
    goes on, or a jaxrun that was killed) end at the last event, marked so."""

    def __init__(self) -> None:
        self.out: list[dict] = []
        self.hosts: dict[int, list[str]] = {}
        self.lives: dict[tuple, dict] = {}  # (attempt, rank, life) -> its span, filled in as heard
        self.states: dict[tuple, tuple[str, float]] = {}  # an open life's state and since when
        self.attempts: dict[int, dict] = {}
        self.verdicts: dict[tuple, dict] = {}
        self.last = 0.0
        self.goodput: dict | None = None  # the run's goodput line, once read

    def add(self, event: dict) -> None:
        t = float(event["t"])
        self.last = max(self.last, t)
        handler = getattr(self, f"on_{event['event']}", None)
        if handler is None:  # a word from a later jaxrun: left out
            return
        try:
            handler(event, t)
        except (KeyError, TypeError, ValueError):  # not a line this jaxrun wrote: left out
            pass

    def on_attempt(self, event: dict, t: float) -> None:
        self.attempts[event.get("attempt", 0)] = {"begin": t, "log_dir": event.get("log_dir")}

    def on_attempt_end(self, event: dict, t: float) -> None:
        attempt = event.get("attempt", 0)
        span = self.attempts.setdefault(attempt, {"begin": t})
        span.update(end=t, exit_code=event.get("exit_code"), reason=event.get("reason"))
        for process in event.get("processes", ()):
            self.verdicts[(attempt, process.get("rank"), process.get("life", 0))] = process

    def on_restart(self, event: dict, t: float) -> None:
        elastic = " (elastic)" if event.get("elastic") else ""
        self.instant(JOB_PID, LIVES_TID, f"restart{elastic}", t, {"why": event.get("why")}, scope="p")

    def on_goodput(self, event: dict, t: float) -> None:
        """The run's goodput, a row of the jaxrun group: a span per part where it lies."""
        parts = event["parts"]
        sums = {p: parts.get(p) for p in ("compile", "checkpoint", "waiting", "input", "idle")}
        for part, begin, end, attempt in event["spans"]:
            args = {"attempt": attempt, **(sums if part == "work" else {})}
            self.span(JOB_PID, GOODPUT_TID, part, float(begin), float(end), args)
        self.goodput = event

    def on_join(self, event: dict, t: float) -> None:
        self.instant(event["rank"] + 1, LIVES_TID, "joined", t, {"attempt": event.get("attempt")})

    def on_signal(self, event: dict, t: float) -> None:
        name = event.get("signal")
        label = "stack dump asked" if name == DUMP else f"{name} sent"
        for rank in event.get("ranks", ()):
            self.instant(rank + 1, LIVES_TID, label, t, {"attempt": event.get("attempt")})

    def on_state(self, event: dict, t: float) -> None:
        rank, state = event["rank"], event["state"]
        key = (event.get("attempt", 0), rank, event.get("life", 0))
        host = event.get("host")
        if host and host not in self.hosts.setdefault(rank, []):
            self.hosts[rank].append(host)
        if state == PENDING:
            self.instant(rank + 1, LIVES_TID, "started again alone", t, {"life": key[2] + 1})
            return
        if state == STARTED:
            self.lives[key] = {"begin": t, "pid": event.get("pid"), "host": host}
        life = self.lives.get(key)
        if life is None or "end" in life:  # heard after its end, or never started
            return
        self.close_state(key, t)
        if state == ENDED:
            life.update(end=t, exit=event.get("exit"))
            self.instant(rank + 1, LIVES_TID, f"ended (exit {event.get('exit')})", t, {"attempt": key[0]})
        else:
            self.states[key] = (state, t)

    def close_state(self, key: tuple, t: float, unfinished: bool = False) -> None:
        if key not in self.states:
            return
        state, since = self.states.pop(key)
        args = {"attempt": key[0], "life": key[2] + 1, **({"unfinished": True} if unfinished else {})}
        self.span(key[1] + 1, STATES_TID, SPAN_NAMES.get(state, state), since, t, args)

    def instant(self, pid: int, tid: int, name: str, t: float, args: dict, scope: str = "t") -> None:
        self.out.append({"name": name, "ph": "i", "s": scope, "ts": micros(t), "pid": pid, "tid": tid,
                         "args": args})

    def span(self, pid: int, tid: int, name: str, begin: float, end: float, args: dict) -> None:
        self.out.append({"name": name, "ph": "X", "ts": micros(begin), "dur": max(0, micros(end) - micros(begin)),
                         "pid": pid, "tid": tid, "args": args})

    def finish(self) -> list[dict]:
        for key in list(self.states):
            self.close_state(key, self.last, unfinished=True)
        for (attempt, rank, life), span in sorted(self.lives.items()):
            name = f"attempt {attempt}" + (f", life {life + 1}" if life else "")
            verdict = self.verdicts.get((attempt, rank, life), {})
            args = {"attempt": attempt, "life": life + 1, "pid": span.get("pid"), "host": span.get("host"),
                    "exit": span.get("exit", verdict.get("exit")), "verdict": verdict.get("verdict")}
            if "end" not in span:
                args["unfinished"] = True
            self.span(rank + 1, LIVES_TID, name, span["begin"], span.get("end", self.last), args)
        for attempt, span in sorted(self.attempts.items()):
            args = {"exit_code": span.get("exit_code"), "reason": span.get("reason"), "log_dir": span.get("log_dir")}
            if "end" not in span:
                args["unfinished"] = True
            self.span(JOB_PID, LIVES_TID, f"attempt {attempt}", span["begin"], span.get("end", self.last), args)
        return self.names() + sorted(self.out, key=lambda e: (e["pid"], e["ts"], -e.get("dur", 0)))

    def names(self) -> list[dict]:
        """The tracks' names and order: the attempts first, then each process by rank."""
        meta = [self.meta(JOB_PID, None, "process_name", "jaxrun"), self.meta(JOB_PID, None, "process_sort_index", 0),
                self.meta(JOB_PID, LIVES_TID, "thread_name", "attempts")]
        if self.goodput is not None:
            meta.append(self.meta(JOB_PID, GOODPUT_TID, "thread_name",
                                  f"goodput {self.goodput.get('share', 0):.0%} of {self.goodput.get('wall', 0):.1f} s"))
        for rank in sorted(set(self.hosts) | {k[1] for k in self.lives}):
            hosts = ", ".join(self.hosts.get(rank, [])) or "?"
            meta += [self.meta(rank + 1, None, "process_name", f"process {rank} ({hosts})"),
                     self.meta(rank + 1, None, "process_sort_index", rank + 1),
                     self.meta(rank + 1, LIVES_TID, "thread_name", "lives"),
                     self.meta(rank + 1, STATES_TID, "thread_name", "state")]
        return meta

    @staticmethod
    def meta(pid: int, tid: int | None, kind: str, value) -> dict:
        key = "sort_index" if kind.endswith("sort_index") else "name"
        event = {"name": kind, "ph": "M", "pid": pid, "args": {key: value}}
        if tid is not None:
            event["tid"] = tid
        return event


def chrome_trace(events: list[dict]) -> dict:
    """The Trace Event Format's JSON object for these events."""
    builder = TraceBuilder()
    for event in events:
        builder.add(event)
    return {"traceEvents": builder.finish(), "displayTimeUnit": "ms"}
