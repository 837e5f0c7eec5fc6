"""The interactive session's messages (``jaxrun -i`` and the Jupyter kernel).

The launcher talks to process 0 only, over one TCP connection that process 0
opens to the launcher's listener (``contract.CONSOLE_ADDRESS``).  Its first
line is a ``SessionHello`` carrying the session's secret
(``contract.CONSOLE_SECRET``); the launcher drops a connection whose secret
is wrong.  Then the launcher sends one ``Execute`` per statement (or cell)
and process 0 answers each with one ``Reply``: the ``Result`` of every
process, in rank order.  A ``Quit`` ends the session.

Process 0 hands each request to the other processes, and they hand their
results back, through JAX's coordination service key-value store, under the
keys below: every process that joined a job has that store, whatever started
it (a fork here, SSH, Slurm, mpirun, Ray).

The kernel (``launcher/interactive/kernel.py``) speaks the same words with
``jaxrun -i``'s pipe frontend, on its stdin and stdout: ``SessionReady`` once
process 0 is there, then an ``Execute`` in and a ``Reply`` out per cell.
"""

from jaxrun.wire.encoding import Message, message

# A request's modes: "single" as Python's console compiles a statement (an
# expression's value is printed); "cell" as a notebook runs a cell (the last
# expression's value is the cell's result, not printed).
SINGLE = "single"
CELL = "cell"
# The most text one process sends back for one statement, per stream.
MAX_TEXT = 1 << 18
MAX_LINE = 1 << 26  # a longer line is no message of a session's


@message("session-hello")
class SessionHello(Message):
    secret: str


@message("session-ready")
class SessionReady(Message):
    """The pipe frontend's first line: process 0 is there, cells may come."""


@message("execute")
class Execute(Message):
    """Run ``code`` in every process."""

    code: str
    mode: str = SINGLE
    number: int = 0  # counts the session's requests from 0 (the launcher's session numbers them)


@message("quit")
class Quit(Message):
    """End the session: every process exits 0."""

    number: int = 0


@message("result")
class Result(Message):
    """What one process's run of one request gave."""

    rank: int
    out: str = ""  # what it wrote on sys.stdout while it ran (in single mode, a value's repr too)
    err: str = ""  # what it wrote on sys.stderr, the traceback aside
    error: str | None = None  # the traceback, as Python's console prints it
    error_name: str | None = None  # the exception's type, "KeyboardInterrupt"
    value: dict | None = None  # cell mode, process 0: the last expression's MIME bundle
    displays: tuple = ()  # process 0: the MIME bundles it displayed, in order

    def __post_init__(self):
        object.__setattr__(self, "displays", tuple(self.displays or ()))


@message("reply")
class Reply(Message):
    number: int
    results: tuple[Result, ...]

    def __post_init__(self):
        # Each result travels as its fields; a reply rebuilds them.
        results = tuple(r if isinstance(r, Result) else Result(*r) for r in self.results)
        object.__setattr__(self, "results", results)


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
