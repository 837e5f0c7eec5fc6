"""The SSH preflight's words: what each host's ControlMaster session checks
before a launch, between the launcher (``backends/ssh/connections.py``) and
the preflight (``backends/ssh/preflight.py``) at the far end.

The preflight writes one answer (a mark and a JSON object of facts, keyed by
``PreflightKey``), then one reply per request read on its stdin (``Listen``,
``Connect``, ``Unlisten``), until EOF.  Each line starts with its mark, since
a login shell may print lines of its own first.
"""

import enum
import json

from jaxrun.wire.encoding import Message, WireError, message

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


# -- requests ------------------------------------------------------------------------
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


# -- replies -------------------------------------------------------------------------
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
