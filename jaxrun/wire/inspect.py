"""The control channel's messages: a command in another terminal (``jaxrun
stacks``, ``jaxrun top``, ``jaxrun profile``) asks a running jaxrun.

The running jaxrun listens on a Unix stream socket in the user's private
socket folder (``launcher/channel.py`` says where, and checks the peer's
user id); the commands' side is ``launcher/inspect/``.  One request per
connection: the asker sends one line (a request below), the job answers
with one line (its answer, or ``Refused``), and the connection closes.

- ``Describe`` -> ``JobInfo``: which run this is (how the commands find the
  newest job);
- ``AskStacks`` -> ``Stacks``: every process's stack dump, taken now;
- ``AskTable`` -> ``Table``: one ``TableRow`` per process, as ``jaxrun top``
  shows it;
- ``AskProfile`` -> ``ProfileTaken``: a trace of every process, gathered into
  one XProf session in the run's log folder (``jaxrun profile``).

A request kind is a message here and a handler registered for its type on
the server's side (``channel.handles``); a kind the server has no handler
for is answered with ``Refused``.
"""

from jaxrun.wire.encoding import Message, message

# The longest line either end reads: stack dumps of many processes fit.
MAX_LINE = 1 << 26
# The most of one process's stack dump that travels (its end: the dump is last).
MAX_DUMP = 1 << 16
# The most of one process's last output line that travels.
MAX_LAST_LINE = 400


@message("describe")
class Describe(Message):
    """Which run is this?"""


@message("job-info")
class JobInfo(Message):
    run_id: str
    pid: int  # jaxrun's own
    started: float  # wall clock
    argv: list
    log_dir: str


@message("ask-stacks")
class AskStacks(Message):
    """Dump every running process's Python stacks now; the processes go on."""

    wait: float = 5.0  # at most this long for the dumps to land in the logs


@message("stack-dump")
class StackDump(Message):
    """One process's dump: ``text`` is faulthandler's, as its stderr log holds it
    ("" where none came: a process not yet started, or ended)."""

    rank: int
    host: str
    pid: int | None
    life: int
    state: str
    text: str = ""


@message("stacks")
class Stacks(Message):
    dumps: tuple
    note: str = ""  # what the job says of them (those whose dump did not come)

    def __post_init__(self):
        dumps = tuple(d if isinstance(d, StackDump) else StackDump(*d) for d in self.dumps)
        object.__setattr__(self, "dumps", dumps)


@message("ask-table")
class AskTable(Message):
    """One row per process, now."""


@message("table-row")
class TableRow(Message):
    rank: int
    host: str
    pid: int | None
    life: int  # how often this process started again alone before this life
    state: str  # one of STATES
    cpu: float | None = None  # percent of one core since the last look (None: not measured here)
    memory: int | None = None  # resident bytes
    idle: float | None = None  # seconds since its last activity (0: busy now; None: not heard)
    last_line: str = ""  # its last line of output
    waiting: float | None = None  # its share of its time spent waiting for the others (None: no account yet)
    straggler: bool = False  # the others wait for it (the time account's rule)


# The states a row shows (the attempt's slots, read for a person).
STATES = ("starting", "joined", "working", "waiting", "finished", "failed", "restarting")


@message("table")
class Table(Message):
    run_id: str
    attempt: int  # 0 for the first
    restarts: int  # spent so far, of max_restarts
    max_restarts: int
    rows: tuple
    restarting: bool = False  # the attempt ended and the whole job starts again
    straggler: str = ""  # the straggler's line, where the rule names one now

    def __post_init__(self):
        rows = tuple(r if isinstance(r, TableRow) else TableRow(*r) for r in self.rows)
        object.__setattr__(self, "rows", rows)


# After a trace, how long the processes may take to write it and bring it
# home: the job waits this long at most, and the asker a little longer.
TRACE_SETTLE_WAIT = 30.0


@message("ask-profile")
class AskProfile(Message):
    """Trace every running process for ``seconds`` (jax.profiler), then
    gather the traces; answered once they are in."""

    seconds: float = 5.0


@message("profile-part")
class ProfilePart(Message):
    """One process's part of a session: its files' names there, or why none."""

    rank: int
    files: list
    problem: str = ""


@message("profile-taken")
class ProfileTaken(Message):
    root: str  # what XProf opens (its --logdir)
    folder: str  # the session's own folder
    command: str  # the one command that opens it
    parts: tuple

    def __post_init__(self):
        parts = tuple(p if isinstance(p, ProfilePart) else ProfilePart(*p) for p in self.parts)
        object.__setattr__(self, "parts", parts)


@message("refused")
class Refused(Message):
    """The job does not answer this request: why."""

    why: str
