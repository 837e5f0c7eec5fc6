"""The messages that cross a socket or a pipe between jaxrun's parts.

Both ends of every channel import this module, so a message is spelled once:

- the fork server (``backends/forkserver.py`` and its agent): ``ForkRequest``
  one way; ``Ready``, ``Started`` and ``ChildExited`` back, each in a frame
  (``send_frame``) of a stream socket;
- the SSH far ends (``backends/ssh_host.py``, the host agent, and
  ``backends/ssh/session_agent.py``, the session agent): ``Channel`` and ``Spawn``
  open a process's channels, then ``Signal`` lines on its control channel
  (or the session's stdin), and ``Started`` (the controller's own pid) and
  ``Exit`` back on a host agent's; its report home and joined mark travel at
  the end of, and within, its stderr;
- the scheduler task channel (``backends/scheduler_channel.py`` and the task
  agent, ``scheduler/task_agent.py``): a ``Hello`` opens each connection, then
  ``Coordinator``, ``Joined``, ``Progress``, ``Error``, ``Exit`` from the task and ``Start``, ``Signal``,
  ``Ack`` from the launcher.

A message is one line: a word, a space, and its fields as a JSON array, so a
field may hold spaces, newlines or any bytes of text.  Signals travel by name,
since their numbers differ between operating systems.
"""

import dataclasses
import enum
import json
import os
import signal
import socket
import struct
from collections.abc import Sequence
from typing import ClassVar

from jaxrun import contract


class WireError(ValueError):
    """A line that is not a message this version of jaxrun knows."""


_BY_WORD: dict[str, type] = {}


def message(word: str):
    """Register a frozen dataclass as the message spelled ``word``."""

    def register(cls):
        cls = dataclasses.dataclass(frozen=True)(cls)
        cls.WORD = word
        _BY_WORD[word] = cls
        return cls

    return register


class Message:
    WORD: ClassVar[str]

    def encode(self) -> bytes:
        """The message as one line, without its newline."""
        fields = [getattr(self, f.name) for f in dataclasses.fields(self)]
        return f"{self.WORD} {json.dumps(fields, separators=(',', ':'))}".encode()

    def line(self) -> bytes:
        return self.encode() + b"\n"


def decode(data: bytes) -> Message:
    word, _, rest = data.decode("utf-8", "replace").strip().partition(" ")
    cls = _BY_WORD.get(word)
    if cls is None:
        raise WireError(f"unknown message {word[:40]!r}")
    try:
        values = json.loads(rest or "[]")
        return cls(*values)
    except (ValueError, TypeError) as e:
        raise WireError(f"malformed {word} message: {e}") from None


# -- the SSH host agent ------------------------------------------------------------
# The environment travels to a host on the session's stdin, never on a command
# line: ten ASCII digits (the length), then that many bytes of JSON.
ENV_FRAME_DIGITS = 10
# The report home: a far end's last bytes on stderr, after the controller and
# everything it started are gone.  This mark, a JSON object (the error record
# and the resources the controller used), a newline.  The launcher's side of
# the backend takes it off the stream; it never reaches the log.  (NUL and ESC
# first: a mark no text output contains by chance.)  The bytes are the same as
# jaxrun 0.1's "record trailer", so either end may be the older.
HOME_REPORT_MARK = b"\x00\x1bjaxrun-error-record "
MAX_HOME_REPORT = 1 << 20  # a longer "report" is the process's own bytes after all
# Written once on stderr, in one write (atomic in a pipe), when the controller
# has arrived at the job's rendezvous (see contract.JOINED_FILE).  It may land
# anywhere in the stream, even inside a line of the process's own; the
# launcher cuts it out wherever it is, and it never reaches the log.
JOINED_MARKER = b"\x00\x1bjaxrun-joined\n"
# The same, from a controller that enabled recoverability (contract.RECOVERABLE).
JOINED_RECOVERABLE_MARKER = b"\x00\x1bjaxrun-joined-recoverable\n"
# Written the same way each time the controller's stall-watchdog sampler
# changes between busy and idle (see contract.ACTIVITY_FILE).
ACTIVITY_MARKERS = {state: b"\x00\x1bjaxrun-%s\n" % state.encode() for state in (contract.BUSY, contract.IDLE)}


def env_frame(env: dict) -> bytes:
    payload = json.dumps(env).encode()
    return b"%0*d" % (ENV_FRAME_DIGITS, len(payload)) + payload


# What a report home may say about the controller's end besides its record and
# resources (each optional: an older far end leaves them out), with its type:
# its own pid on its host, and when its reaper saw it end, by which machine's
# clock (``core.causes.clock_id``).
HOME_REPORT_FACTS = {"pid": int, "reaped_at": float, "clock": str}


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


# -- the fork server ------------------------------------------------------------
# Its messages cross a SOCK_STREAM Unix socket (macOS has no SOCK_SEQPACKET
# for AF_UNIX), one frame each: the message's length in four bytes, big
# endian, then the message.  File descriptors ride on the frame's first byte
# (SCM_RIGHTS), and a reader takes exactly one frame's bytes at a time, so the
# descriptors of the next frame never come with this one.  An environment of
# any size fits in one frame; a longer "length" is a peer speaking something
# else.
FRAME_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 26  # 64 MiB


def send_frame(sock: socket.socket, payload: bytes, fds: Sequence[int] = ()) -> None:
    """Send one frame, with ``fds`` attached, whatever its size."""
    data = memoryview(FRAME_HEADER.pack(len(payload)) + payload)
    sent = socket.send_fds(sock, [data], list(fds)) if fds else 0
    sock.sendall(data[sent:])


def recv_frame(sock: socket.socket, max_fds: int = 0) -> tuple[bytes, list[int]] | None:
    """One frame and the descriptors that came with it; None once the peer
    has closed (even mid-frame).  OSError and WireError pass through."""
    header, fds = b"", []
    try:
        while len(header) < FRAME_HEADER.size:
            want = FRAME_HEADER.size - len(header)
            if max_fds:
                data, got, _, _ = socket.recv_fds(sock, want, max_fds)
                fds += got
            else:
                data = sock.recv(want)
            if not data:
                break
            header += data
        if len(header) < FRAME_HEADER.size:
            raise EOFError
        (length,) = FRAME_HEADER.unpack(header)
        if length > MAX_FRAME:
            raise WireError(f"a frame of {length} bytes: not a jaxrun peer")
        body = bytearray(length)
        view, got = memoryview(body), 0
        while got < length:
            n = sock.recv_into(view[got:])
            if not n:
                raise EOFError
            got += n
        return bytes(body), fds
    except EOFError:
        close_all(fds)
        return None
    except BaseException:
        close_all(fds)
        raise


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


@message("fork")
class ForkRequest(Message):
    """Fork one controller; its stdout, stderr and lifeline travel as fds."""

    shim_args: list
    env: dict
    cwd: str = ""  # where the controller runs; "" for the server's own folder


@message("ready")
class Ready(Message):
    """The server has imported jax and the preload modules (``error`` empty),
    or could not (``error`` says why, and the server exits)."""

    error: str


@message("started")
class Started(Message):
    """A controller was started (forked by the fork server, or by an SSH
    host agent): its pid on that machine."""

    pid: int


@message("exited")
class ChildExited(Message):
    pid: int
    returncode: int  # Popen style: negative for a signal
    resources: dict | None = None  # contract.Resources.to_dict(), measured by the server
    reaped_at: float | None = None  # the server's wall clock as it reaped it (None: an older server)


# -- signals (SSH agent and task channel) ------------------------------------------
@message("signal")
class Signal(Message):
    name: str

    @classmethod
    def of(cls, signum: int) -> "Signal":
        return cls(signal.Signals(signum).name)

    @property
    def signum(self) -> int:
        try:
            return signal.Signals[self.name]
        except KeyError:
            raise WireError(f"unknown signal {self.name!r}") from None


# -- the streams of one process, as both far ends name them --------------------------
# Each process's connections (an SSH host agent's channels, a scheduler task's
# connections) are one of these; the words are spelled here only.
CONTROL = "ctrl"  # wire messages, both ways
STDOUT = "stdout"  # the controller's own bytes, untouched
STDERR = "stderr"
PING = "ping"  # an SSH host agent's activity probe (answered CHANNEL_PONG)


# -- an SSH host's channels (see backends.ssh_host) --------------------------------
@message("channel")
class Channel(Message):
    """First line of each connection to a host agent: which process, which stream."""

    key: str  # one process's, chosen by the launcher
    role: str  # one of ROLES

    ROLES: ClassVar[tuple[str, ...]] = (CONTROL, STDOUT, STDERR, PING)


CHANNEL_PONG = b"pong\n"  # the answer to a "ping" channel


@message("spawn")
class Spawn(Message):
    """Second line of a process's control connection: what to run, and where."""

    argv: list
    env: dict  # what the process's environment adds to the host agent's
    cwd: str
    server: str = ""  # the host's preloading server, "" for none


# -- the scheduler task channel -----------------------------------------------------
@message("hello")
class Hello(Message):
    """First line of each task connection: which run, which rank, which stream."""

    secret: str
    rank: int
    kind: str  # one of STREAM_KINDS

    STREAM_KINDS: ClassVar[tuple[str, ...]] = (CONTROL, STDOUT, STDERR)


@message("coordinator")
class Coordinator(Message):
    """Task 0's choice of coordinator address, on its own node."""

    address: str


@message("start")
class Start(Message):
    """Every task may start its controller, which joins ``address``."""

    address: str


@message("joined")
class Joined(Message):
    """The controller has arrived at the job's rendezvous (``recoverable``: it enabled JAX's fault tolerance)."""

    recoverable: bool = False


@message("activity")
class Activity(Message):
    """The controller's sampler changed state: ``contract.BUSY`` or ``contract.IDLE``."""

    state: str


@message("error")
class Error(Message):
    """The controller's error record (``contract.ErrorRecord.to_json``)."""

    record: str


@message("exit")
class Exit(Message):
    """A far end's controller has ended (a task agent's, a host agent's).
    The fields after ``resources`` are optional: an older far end leaves
    them out."""

    returncode: int  # Popen style
    resources: dict | None = None  # contract.Resources.to_dict(), measured by the far end
    reaped_at: float | None = None  # its wall clock as it reaped the controller
    clock: str | None = None  # which machine's clock that is (core.causes.clock_id)
    pid: int | None = None  # the controller's own pid there


@message("ack")
class Ack(Message):
    """The launcher has the exit code; the task may end."""


# -- the SSH preflight (backends/ssh/preflight.py, and the launcher's connections) --
# Each host's ControlMaster session runs the preflight: one answer, then one
# reply per request on stdin, until EOF.  Each line starts with its mark, since
# a login shell may print lines of its own first.
PREFLIGHT_ANSWER = b"jaxrun-preflight "  # then a JSON object: PreflightKey -> value
PREFLIGHT_REPLY = b"jaxrun-reply "  # then one message (Listening, Reached, Closed, Failed)
# Its command line, after the module: each flag is optional.
PREFLIGHT_CHDIR = "--chdir"  # =FOLDER: the job's folder (created later by --sync)
PREFLIGHT_SCRIPT = "--script"  # =PATH: the script, checked in that folder
PREFLIGHT_SYNC = "--sync"  # the folder is still to come: enter and check nothing
PREFLIGHT_HOLD = "--hold"  # listen on a free port for the coordinator at once (the first host)
PREFLIGHT_SERVER = "--server"  # NAME MODULE...: start the host's preloading server


class PreflightKey(enum.StrEnum):
    """The keys of the preflight's answer, each optional.  A host whose
    jaxrun is missing, or another version, answers the first four only."""

    PYTHON = "python"  # platform.python_version()
    EXECUTABLE = "executable"
    JAXRUN = "jaxrun"  # its version, None where it cannot be imported
    JAXRUN_ERROR = "jaxrun_error"  # why not
    JAXRUN_PATH = "jaxrun_path"
    ADDRESS = "address"  # where the launcher reached the host (SSH_CONNECTION)
    CHDIR_ERROR = "chdir_error"
    SCRIPT_MISSING = "script_missing"  # the script's path there
    CHANNELS = "channels"  # the host agent's socket
    CHANNELS_ERROR = "channels_error"
    JAX = "jax"  # its version, None where it is not installed
    JAXLIB = "jaxlib"
    RSYNC = "rsync"  # whether it is on PATH there
    MACHINE = "machine"  # hostname/machine-id: which hosts are one machine
    GPUS = "gpus"  # how many nvidia-smi lists
    PORT = "port"  # held for the coordinator (with PREFLIGHT_HOLD)


def preflight_answer(facts: dict) -> bytes:
    return PREFLIGHT_ANSWER + json.dumps(facts).encode() + b"\n"


def parse_preflight_answer(line: bytes) -> dict:
    """The facts of one answer line (its mark included); WireError if it is none."""
    try:
        facts = json.loads(line[len(PREFLIGHT_ANSWER):]) if line.startswith(PREFLIGHT_ANSWER) else None
    except ValueError:
        facts = None
    if not isinstance(facts, dict):
        raise WireError(f"not a preflight answer: {line[:200]!r}")
    return facts


@message("listen")
class Listen(Message):
    """Bind and listen there (port 0: any free port), until the next request."""

    address: str
    port: int


@message("connect")
class Connect(Message):
    """Connect there within ``seconds``: does this host reach the coordinator?"""

    address: str
    port: int
    seconds: float


@message("unlisten")
class Unlisten(Message):
    """Let the port go (any request does)."""


@message("listening")
class Listening(Message):
    port: int


@message("reached")
class Reached(Message):
    """Connected, and closed again."""


@message("closed")
class Closed(Message):
    """The port is free."""


@message("failed")
class Failed(Message):
    reason: str  # a request that failed, and why
