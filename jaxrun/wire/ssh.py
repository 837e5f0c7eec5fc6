"""What the SSH far ends and the launcher say to each other.

- A host agent (``backends/ssh/host_agent.py``, one per host) takes one
  connection per stream of each process.  Each begins with a ``Channel`` line
  (the process's key, the stream's role); the control channel's second line
  is a ``Spawn`` (what to run, where), then ``Signal`` lines go one way and
  ``Started`` (the controller's own pid) and ``Exit`` come back.  A ``ping``
  channel is answered ``CHANNEL_PONG`` and closed: the launcher's check
  that the agent is there.
- The environment travels to a host on its session's stdin, never on a
  command line, in an environment frame (``env_frame``).
- A session agent (``backends/ssh/session_agent.py``, one per SSH session,
  where a host refuses channels) reads ``Signal`` lines on the session's
  stdin.
- Either agent has only the controller's stderr to answer on: there, in
  band, it marks the controller's join and activity (``JOINED_MARKER``,
  ``ACTIVITY_MARKERS``) and ends with the report home (``home_report``).
  The launcher's side takes them off the stream (``backends/ssh/stream.py``);
  they never reach the log.

The checks each host's session runs first are in ``preflight``.
"""

import json
from typing import ClassVar

from jaxrun import contract
from jaxrun.wire.controller import (
    CONTROL as CONTROL,
    STDERR as STDERR,
    STDOUT as STDOUT,
    Exit as Exit,
    Signal as Signal,
    Started as Started,
)
from jaxrun.wire.encoding import Message, message

PING = "ping"  # is the host agent there? (answered CHANNEL_PONG)
CHANNEL_PONG = b"pong\n"  # the answer to a "ping" channel


@message("channel")
class Channel(Message):
    """First line of each connection to a host agent: which process, which stream."""

    key: str  # one process's, chosen by the launcher
    role: str  # one of ROLES

    ROLES: ClassVar[tuple[str, ...]] = (CONTROL, STDOUT, STDERR, PING)


@message("spawn")
class Spawn(Message):
    """Second line of a process's control connection: what to run, and where."""

    argv: list
    env: dict  # what the process's environment adds to the host agent's
    cwd: str
    server: str = ""  # the host's preloading server, "" for none


# -- the environment frame ---------------------------------------------------------
# Ten ASCII digits (the length), then that many bytes of JSON.
ENV_FRAME_DIGITS = 10


def env_frame(env: dict) -> bytes:
    payload = json.dumps(env).encode()
    return b"%0*d" % (ENV_FRAME_DIGITS, len(payload)) + payload


# -- in band, on a session agent's stderr -------------------------------------------
# The report home: a far end's last bytes on stderr, after the controller and
# everything it started are gone.  This mark, a JSON object (the error record
# and the resources the controller used), a newline.  (NUL and ESC first: a
# mark no text output contains by chance.)  The bytes are the same as jaxrun
# 0.1's "record trailer", so either end may be the older.
HOME_REPORT_MARK = b"\x00\x1bjaxrun-error-record "
MAX_HOME_REPORT = 1 << 20  # a longer "report" is the process's own bytes after all
# Written once on stderr, in one write (atomic in a pipe), when the controller
# has arrived at the job's rendezvous (see contract.JOINED_FILE).  It may land
# anywhere in the stream, even inside a line of the process's own; the
# launcher cuts it out wherever it is.
JOINED_MARKER = b"\x00\x1bjaxrun-joined\n"
# The same, from a controller that enabled recoverability (contract.RECOVERABLE).
JOINED_RECOVERABLE_MARKER = b"\x00\x1bjaxrun-joined-recoverable\n"
# Written the same way each time the controller's stall-watchdog sampler
# changes state (see contract.ACTIVITY_FILE): the activity line between the
# marker's head and a newline.  busy, idle, parked and finished are these fixed
# markers; a SPIN line carries its details ("spin 2 1.97"), and so does the
# account's TIME line (contract.TimeSplit: "time 1733390000.000 10.020
# ..."), so their markers are read by ``detail_marker`` and
# ``detail_marker_start``.
MARKER_HEAD = b"\x00\x1bjaxrun-"  # what every in-band marker begins with
ACTIVITY_MARKERS = {state: MARKER_HEAD + b"%s\n" % state.encode()
                    for state in (contract.BUSY, contract.IDLE, contract.PARKED, contract.FINISHED)}
DETAIL_HEADS = tuple(MARKER_HEAD + word.encode() + b" " for word in (contract.SPIN, contract.TIME))
DETAIL_MARKER_MAX = len(MARKER_HEAD) + max(contract.ACTIVITY_LINE_MAX, contract.TIME_LINE_MAX) + 1
_DETAIL_BYTES = frozenset(b"0123456789. ")


def activity_marker(said: str) -> bytes:
    """The marker that tells an activity line (``contract.read_activity_file``'s)
    or a TIME line."""
    return ACTIVITY_MARKERS.get(said) or MARKER_HEAD + said.encode() + b"\n"


def _said(said: str) -> bool:
    return contract.Spinning.of(said) is not None or contract.TimeSplit.of(said) is not None


def detail_marker(data: bytes, at: int) -> tuple[str, int] | None:
    """(the SPIN or TIME line, where its marker ends) if a whole, well-formed
    such marker begins at ``data[at]``; None otherwise."""
    head = next((h for h in DETAIL_HEADS if data.startswith(h, at)), None)
    if head is None:
        return None
    end = data.find(b"\n", at + len(head), at + DETAIL_MARKER_MAX)
    if end < 0:
        return None
    said = data[at + len(MARKER_HEAD):end].decode("ascii", "replace")
    return (said, end + 1) if _said(said) else None


def detail_marker_start(data: bytes) -> int:
    """How many of ``data``'s last bytes may begin a SPIN or TIME marker,
    the rest of which a later read brings (0: none)."""
    at = data.find(b"\x00", max(0, len(data) - DETAIL_MARKER_MAX + 1))
    while at >= 0:
        tail = data[at:]
        for head in DETAIL_HEADS:
            if head.startswith(tail) or (tail.startswith(head) and _DETAIL_BYTES.issuperset(tail[len(head):])):
                return len(tail)
        at = data.find(b"\x00", at + 1)
    return 0


# What a report home may say about the controller's end besides its record and
# resources (each optional: an older far end leaves them out), with its type:
# its own pid on its host, and when its reaper saw it end, by which machine's
# clock (``core.causes.clock_id``); what it spent on compiles and checkpoint
# saves (``contract.Marks.to_dict``).
HOME_REPORT_FACTS = {"pid": int, "reaped_at": float, "clock": str, "marks": dict}


def home_report(error_json: str | None, resources: dict | None, **facts) -> bytes:
    """The report home: the controller's error record (``ErrorRecord.to_json``,
    or None), what it used (``Resources.to_dict``, or None), and the facts of
    its end (``HOME_REPORT_FACTS``)."""
    data = {"error": error_json, "resources": resources}
    data.update((k, v) for k, v in facts.items() if k in HOME_REPORT_FACTS and v is not None)
    return HOME_REPORT_MARK + json.dumps(data).encode() + b"\n"


def parse_home_report(tail: bytes) -> tuple[str | None, dict | None, dict] | None:
    """(error record JSON, resources dict, facts) if ``tail`` (from the mark
    to the end of the stream) is exactly one report home, with None for
    whatever it lacks, and only the well-typed ``HOME_REPORT_FACTS`` in
    ``facts``; None if ``tail`` is the process's own bytes."""
    if not tail.startswith(HOME_REPORT_MARK) or not tail.endswith(b"\n") or tail.count(b"\n") != 1:
        return None
    try:
        data = json.loads(tail[len(HOME_REPORT_MARK):-1].decode(errors="replace"))
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None, None, {}
    error, resources = data.get("error"), data.get("resources")
    facts = {}
    for key, kind in HOME_REPORT_FACTS.items():
        value = data.get(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, kind) and not isinstance(value, bool):
            facts[key] = value
    return (error if isinstance(error, str) else None), (resources if isinstance(resources, dict) else None), facts
