"""The interactive session's messages (``jaxrun -i`` and the Jupyter kernel).

The launcher talks to process 0 only, over one TCP connection that process 0
opens to the launcher's listener (``CONSOLE_ADDRESS``).  Its first line is a
``Hello`` carrying the session's secret (``CONSOLE_SECRET``); the launcher
drops a connection whose secret is wrong.  Then the launcher sends one
``Request`` per statement (or cell) and process 0 answers each with one
``Reply``: the ``Result`` of every process, in rank order.

Process 0 hands each request to the other processes, and they hand their
results back, through JAX's coordination service key-value store, under the
keys below: every process that joined a job has that store, whatever started
it (a fork here, SSH, Slurm, mpirun, Ray).

The launcher imports no ``jaxrun.wire`` (its backends do), so these messages
live in the contract, which both sides read.  Each one is a JSON object on
one line.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

# A request's modes: "single" as Python's console compiles a statement (an
# expression's value is printed); "cell" as a notebook runs a cell (the last
# expression's value is the cell's result, not printed).
SINGLE = "single"
CELL = "cell"
RUN = "run"
QUIT = "quit"
# The most text one process sends back for one statement, per stream.
MAX_TEXT = 1 << 18
MAX_LINE = 1 << 26  # a longer line is no message of a session's


@dataclasses.dataclass(frozen=True)
class Hello:
    secret: str


@dataclasses.dataclass(frozen=True)
class Request:
    op: str  # RUN or QUIT
    number: int = 0  # counts the session's requests from 0
    code: str = ""
    mode: str = SINGLE


@dataclasses.dataclass(frozen=True)
class Result:
    """What one process's run of one request gave."""

    rank: int
    out: str = ""  # what it wrote on sys.stdout while it ran (in single mode, a value's repr too)
    err: str = ""  # what it wrote on sys.stderr, the traceback aside
    error: str | None = None  # the traceback, as Python's console prints it
    error_name: str | None = None  # the exception's type, "KeyboardInterrupt"
    value: dict | None = None  # cell mode, process 0: the last expression's MIME bundle
    displays: tuple = ()  # process 0: the MIME bundles it displayed, in order


@dataclasses.dataclass(frozen=True)
class Reply:
    number: int
    results: tuple[Result, ...]


def encode(message: Hello | Request | Reply | Result) -> bytes:
    return json.dumps(dataclasses.asdict(message), separators=(",", ":")).encode() + b"\n"


def _fields(cls, data: Any) -> dict:
    if not isinstance(data, dict):
        raise ValueError(f"not a {cls.__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def decode_hello(line: bytes) -> Hello:
    return Hello(**_fields(Hello, json.loads(line)))


def decode_request(line: bytes | str) -> Request:
    return Request(**_fields(Request, json.loads(line)))


def decode_result(data: Any) -> Result:
    fields = _fields(Result, data)
    fields["displays"] = tuple(fields.get("displays") or ())
    return Result(**fields)


def decode_reply(line: bytes) -> Reply:
    data = json.loads(line)
    fields = _fields(Reply, data)
    return Reply(int(fields["number"]), tuple(decode_result(r) for r in fields["results"]))


# -- the key-value store ------------------------------------------------------------
PREFIX = "jaxrun/console"


def request_key(number: int) -> str:
    return f"{PREFIX}/{number}/request"


def result_key(number: int, rank: int) -> str:
    return f"{PREFIX}/{number}/result/{rank}"


def clip(text: str) -> str:
    """At most MAX_TEXT characters: the end kept, where a traceback's point is."""
    if len(text) <= MAX_TEXT:
        return text
    return f"[... {len(text) - MAX_TEXT} characters left out; the log holds them]\n" + text[-MAX_TEXT:]
