"""The contract between jaxrun's parts: the one module every side imports.

The launcher (``jaxrun.launcher``), the backends and their far-end agents
(``jaxrun.backends``), the child side (``jaxrun.child``) and the reports
(``jaxrun.reporting``) never import each other's internals to agree on a
name.  Everything they must agree on is here:

- every environment variable jaxrun sets or reads (no ``JAXRUN_*`` name is
  spelled anywhere else);
- the module names put on command lines, and the shim's command line;
- the argument placeholders and their substitution;
- exit statuses: Popen's negative signal numbers against the shell's 128+N;
- the error record a child leaves behind for the run summary;
- how a part picks a port: bind one address, never a wildcard.

The messages that cross a socket are in :mod:`jaxrun.wire`.  Nothing here
imports jax.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import signal
import socket
import time
from typing import Mapping, Sequence

# -- what every child gets ---------------------------------------------------
COORDINATOR_ADDRESS = "JAXRUN_COORDINATOR_ADDRESS"
COORDINATOR_BIND_ADDRESS = "JAXRUN_COORDINATOR_BIND_ADDRESS"
NUM_PROCESSES = "JAXRUN_NUM_PROCESSES"
PROCESS_ID = "JAXRUN_PROCESS_ID"
LOCAL_PROCESS_ID = "JAXRUN_LOCAL_PROCESS_ID"
LOCAL_PROCESS_COUNT = "JAXRUN_LOCAL_PROCESS_COUNT"
RUN_ID = "JAXRUN_RUN_ID"
RESTART_COUNT = "JAXRUN_RESTART_COUNT"
# Read end of a pipe whose write end only the launcher holds.  EOF means the
# launcher is gone, and the shim kills its own process group.
LIFELINE_FD = "JAXRUN_LIFELINE_FD"
# Where the shim records an uncaught exception (see ErrorRecord).
ERROR_FILE = "JAXRUN_ERROR_FILE"
# A path the shim creates (empty, 0600, never through a symlink) when the
# process arrives at the job's rendezvous, right before the real
# jax.distributed.initialize() call: how the launcher counts joined processes.
JOINED_FILE = "JAXRUN_JOINED_FILE"
# Optional mesh spec, e.g. "i=4,j=2", and its axis types ("auto"/"explicit").
MESH = "JAXRUN_MESH"
MESH_AXIS_TYPES = "JAXRUN_MESH_AXIS_TYPES"
# "1" makes the shim print the startup preflight table from process 0.
VERBOSE = "JAXRUN_VERBOSE"
# Where the rank comes from: "jaxrun" (the variables above), or a scheduler
# named in RANK_SOURCES.
RANK_SOURCE = "JAXRUN_RANK_SOURCE"

# -- read by the launcher and its helpers -------------------------------------
NO_PRELOAD = "JAXRUN_NO_PRELOAD"  # "1": --no-preload by default
# The scheduler task channel: host:port of the launcher's listener, and the
# per-run secret that proves a connection belongs to the run.
TASK_CHANNEL = "JAXRUN_TASK_CHANNEL"
TASK_SECRET = "JAXRUN_TASK_SECRET"
# Optional, read by the launcher: the address (or name) the task channel binds
# and tells the tasks, for a launcher host whose name resolves to an address
# the compute nodes cannot reach (a loopback alias, the wrong network).
TASK_CHANNEL_HOST = "JAXRUN_TASK_CHANNEL_HOST"
# --devices-per-process K under a scheduler: which tasks share a node is known
# only once the step starts, so each task's agent turns its local rank r into
# JAX_LOCAL_DEVICE_IDS r*K ... r*K+K-1 itself.
TASK_DEVICES_PER_PROCESS = "JAXRUN_TASK_DEVICES_PER_PROCESS"
# The pytest plugin's private folder for one marked test's controllers.
PYTEST_WORKDIR = "JAXRUN_PYTEST_WORKDIR"
# Failure injection for jaxrun's own tests: comma-separated names of launcher
# threads that raise at once when they start (see backends.base.start_thread).
INJECT_THREAD_FAULT = "JAXRUN_INJECT_THREAD_FAULT"
# "1": take the portable path wherever jaxrun could use a Linux-only facility
# (read only by jaxrun.portable), so that the tests prove those paths on Linux.
PORTABLE = "JAXRUN_PORTABLE"
# Where a process cannot be a child subreaper, it puts this variable with a
# value of its own in its children's environment, so that its daemons can be
# found once they have left its process tree (see backends.reaper).
ORPHAN_MARK = "JAXRUN_ORPHAN_MARK"

# JAX's own variables, set for code that reads them directly.
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
JAX_COORDINATOR_BIND_ADDRESS = "JAX_COORDINATOR_BIND_ADDRESS"
JAX_PLATFORMS = "JAX_PLATFORMS"
JAX_NUM_CPU_DEVICES = "JAX_NUM_CPU_DEVICES"
JAX_LOCAL_DEVICE_IDS = "JAX_LOCAL_DEVICE_IDS"

# Variables forwarded to remote hosts in addition to user-chosen ones.
CONTRACT_PREFIXES = ("JAXRUN_", "JAX_")

# (rank, count, local rank) variables of the schedulers a child can take its
# rank from; "mpi" is the older name of "mpirun", still accepted.
RANK_SOURCES = {
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    "mpirun": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
}
RANK_SOURCES["mpi"] = RANK_SOURCES["mpirun"]
LAUNCHER_RANK_NAMES = (PROCESS_ID, NUM_PROCESSES, LOCAL_PROCESS_ID)


def process_env(*, coordinator: str, num_processes: int, process_id: int | str, local_process_id: int | str,
                local_process_count: int | str, run_id: str, restart_count: int | str = 0) -> dict[str, str]:
    """The variables that tell a child who it is and where to join.  Values
    may be strings, so that a manifest can put references in them."""
    return {
        COORDINATOR_ADDRESS: coordinator,
        JAX_COORDINATOR_ADDRESS: coordinator,
        NUM_PROCESSES: str(num_processes),
        PROCESS_ID: str(process_id),
        LOCAL_PROCESS_ID: str(local_process_id),
        LOCAL_PROCESS_COUNT: str(local_process_count),
        RUN_ID: run_id,
        RESTART_COUNT: str(restart_count),
        "PYTHONUNBUFFERED": "1",
    }


def bind_env(address: str) -> dict[str, str]:
    """For process 0: listen exactly there (JAX's default is every interface)."""
    return {COORDINATOR_BIND_ADDRESS: address, JAX_COORDINATOR_BIND_ADDRESS: address}


def cpu_env(devices: int) -> dict[str, str]:
    return {JAX_PLATFORMS: "cpu", JAX_NUM_CPU_DEVICES: str(devices)}


# -- command lines ---------------------------------------------------------------
# The stable entry users may put in their own scripts (Slurm recipes, manifests).
SHIM_MODULE = "jaxrun.shim"
FORKSERVER_AGENT_MODULE = "jaxrun.backends.forkserver_agent"
SSH_AGENT_MODULE = "jaxrun.backends.ssh_agent"
SCHEDULER_AGENT_MODULE = "jaxrun.backends.scheduler_agent"
PYTEST_CONTROLLER_MODULE = "jaxrun.child.pytest_controller"


def target_args(name: str, args: Sequence[str], is_module: bool) -> tuple[str, ...]:
    """What follows ``python -m jaxrun.shim``: ``-- SCRIPT ARGS`` or ``-m MODULE ARGS``."""
    return ("-m" if is_module else "--", name, *args)


def shim_argv(python: str, shim_args: Sequence[str]) -> tuple[str, ...]:
    return (python, "-m", SHIM_MODULE, *shim_args)


# -- placeholders ------------------------------------------------------------------
PLACEHOLDERS = ("process_id", "num_processes", "local_process_id", "coordinator")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


def placeholder_values(process_id: object, num_processes: object, local_process_id: object,
                       coordinator: object) -> dict[str, object]:
    return {"process_id": process_id, "num_processes": num_processes,
            "local_process_id": local_process_id, "coordinator": coordinator}


def substitute(arg: str, values: Mapping[str, object]) -> str:
    """Replace {process_id}-style placeholders; other braces are left alone."""
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), arg)


# -- exit statuses -------------------------------------------------------------------
def exit_status(returncode: int) -> int:
    """Popen's returncode (negative: killed by that signal) as a shell status, 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def returncode_from_status(status: int) -> int:
    """The inverse, for an agent that reported its child's death by signal N as
    128+N.  255 is ssh's own failure and stays as it is."""
    if 128 < status < 128 + signal.NSIG:
        return -(status - 128)
    return status


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# -- the error record ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ErrorRecord:
    """What a controller's uncaught exception was, left for the run summary."""

    type: str
    message: str
    traceback: str = ""
    at: float = 0.0  # the wall-clock time it was recorded (0: unknown)

    @classmethod
    def of(cls, exc: BaseException, text: str) -> "ErrorRecord":
        return cls(type(exc).__qualname__, str(exc), text, time.time())

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ErrorRecord | None":
        try:
            data = json.loads(text)
            return cls(str(data["type"]), str(data["message"]), str(data.get("traceback", "")),
                       float(data.get("at", 0.0)))
        except (ValueError, KeyError, TypeError):
            return None

    def dump(self, path: str) -> None:
        """Written 0600, as a new file that is never a symlink planted in a
        shared log folder (an old record is replaced, not written through)."""
        try:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
        except OSError:
            pass

    @classmethod
    def load(cls, path: str | None) -> "ErrorRecord | None":
        if not path:
            return None
        try:
            with open(path) as f:
                return cls.from_json(f.read())
        except OSError:
            return None

    @classmethod
    def take(cls, path: str) -> "ErrorRecord | None":
        """Load a record an agent kept in a private folder of its own, and
        remove both (the record travels home another way)."""
        record = cls.load(path)
        for remove, target in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
            try:
                remove(target)
            except OSError:
                pass
        return record

    @property
    def headline(self) -> str:
        return f"{self.type}: {self.message}"


# -- what a process used --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Resources:
    """What one controller used, measured where it ran, when it ended: the
    peak resident set and the CPU time of the process and of the children it
    waited for (``wait4``), and, where it was SIGKILLed, why jaxrun thinks the
    kernel's OOM killer did it (None otherwise)."""

    peak_rss_bytes: int
    cpu_seconds: float
    oom: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> "Resources | None":
        """None for anything but a well-formed dict (a far end of another version)."""
        if not isinstance(data, dict):
            return None
        try:
            peak, cpu, oom = int(data["peak_rss_bytes"]), float(data["cpu_seconds"]), data.get("oom")
        except (KeyError, TypeError, ValueError):
            return None
        return cls(peak, cpu, None if oom is None else str(oom))


def format_bytes(n: float) -> str:
    """A size as every part of jaxrun prints it: "163.1 MiB"."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# -- a scheduler step that ended under its tasks ---------------------------------------
# When srun or mpirun ends before a task reported its exit, that task's stderr
# log ends with this one line.  The console leaves it out (the step says it once
# for every such task), and the summary finds it to name the engine failure once.
@dataclasses.dataclass(frozen=True)
class EngineNote:
    engine: str  # "srun", "mpirun"
    how: str  # "exited with code 1", "was killed by SIGKILL"
    started: bool  # whether any task of the step had reached jaxrun
    log: str  # the engine's own output, engine.log

    @classmethod
    def of(cls, engine: str, returncode: int, started: bool, log: str) -> "EngineNote":
        how = f"was killed by {signal_name(-returncode)}" if returncode < 0 else f"exited with code {returncode}"
        return cls(engine, how, started, log)

    @property
    def when(self) -> str:
        return "before this task reported back" if self.started else "before any task started"

    def line(self) -> str:
        return f"jaxrun: {self.engine} {self.how} {self.when} (see {self.log})\n"


# Cheap to look for in a chunk of output before any line is parsed.
ENGINE_NOTE_MARKS = (b" before this task reported back (see ", b" before any task started (see ")
_ENGINE_NOTE = re.compile(r"jaxrun: (\S+) (exited with code -?\d+|was killed by \S+(?: \d+)?) "
                          r"before (this task reported back|any task started) \(see (.*)\)\n?")


def parse_engine_note(line: str) -> EngineNote | None:
    m = _ENGINE_NOTE.fullmatch(line)
    return None if m is None else EngineNote(m[1], m[2], m[3] == "this task reported back", m[4])


def mark_joined(path: str | None) -> bool:
    """Create the empty file that says "this process has joined" (see
    JOINED_FILE): new, 0600, never a symlink followed.  False when it could
    not be made (it is a progress hint; nothing depends on it)."""
    if not path:
        return False
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        return True  # an earlier join of this process (a checked no-op initialize)
    except OSError:
        return False
    return True


# -- divergence: --flight-recorder and --check-divergence ------------------------------
# "K": each controller keeps its last K executions of compiled programs and writes
# them into its stderr log with every stack dump (the block below).  Unset: off.
FLIGHT_RECORDER = "JAXRUN_FLIGHT_RECORDER"
FLIGHT_RECORDER_DEFAULT = 64
# The most entries a block may hold: the summary reads a log's last megabyte only.
FLIGHT_RECORDER_MAX = 4096
# "1": before each execution of a program that spans processes, the processes agree
# on it through the coordination service; the first to differ stops the job.
CHECK_DIVERGENCE = "JAXRUN_CHECK_DIVERGENCE"

# Where a controller was when it wrote its block.  A process whose script returned
# but which has not exited waits for its peers in JAX's shutdown barrier.
IN_SCRIPT = "in the script"
SCRIPT_RETURNED = "finished the script"
IN_SHUTDOWN = "finished the script, waiting in JAX's shutdown"


@dataclasses.dataclass(frozen=True)
class FlightEntry:
    """One execution of a compiled program, as the flight recorder keeps it."""

    seq: int  # this process's executions, from 1
    call: int | None  # among executions that span processes, from 1; None: this process's devices only
    function: str
    occurrence: int  # this process's executions of this function, this one included
    fingerprint: str
    inputs: str  # "f32[8,4],i32[]"
    file: str  # the innermost frame of the user's code that made the call
    line: int

    @property
    def label(self) -> str:
        return f"{self.function}#{self.occurrence}"

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def to_line(self, rank: int) -> str:
        call = "local" if self.call is None else f"call {self.call}"
        return (f"jaxrun: flight[{rank}] #{self.seq} {call} {self.label} fp={self.fingerprint} "
                f"in={self.inputs or '-'} at {self.file}:{self.line}")


@dataclasses.dataclass(frozen=True)
class FlightLog:
    """The last block a controller wrote: where it was, and its last entries."""

    rank: int
    runs: int  # programs run in all, of which ``entries`` are the last
    state: str
    entries: tuple[FlightEntry, ...]


_FLIGHT_BEGIN = re.compile(r"^jaxrun: flight\[(\d+)\] begin: the last \d+ of (\d+) programs run, "
                           r"oldest first; (.+)$", re.M)
_FLIGHT_ENTRY = re.compile(r"^jaxrun: flight\[(\d+)\] #(\d+) (?:call (\d+)|local) (\S+)#(\d+) fp=(\S+) "
                           r"in=(\S+) at (.+):(\d+)$")


def flight_block(rank: int, runs: int, state: str, entries: Sequence[FlightEntry]) -> str:
    """The recorder's block, as a controller writes it into its stderr: a line
    a person can read and the summary can find, then one line per entry."""
    lines = [f"jaxrun: flight[{rank}] begin: the last {len(entries)} of {runs} programs run, oldest first; {state}"]
    lines.extend(e.to_line(rank) for e in entries)
    lines.append(f"jaxrun: flight[{rank}] end")
    return "\n".join(lines) + "\n"


def parse_flight_block(text: str) -> FlightLog | None:
    """The last block in a log's text; None if there is none.  Lines other
    writers put between its lines are skipped."""
    begins = list(_FLIGHT_BEGIN.finditer(text))
    if not begins:
        return None
    head = begins[-1]
    rank = int(head[1])
    entries = []
    for line in text[head.end():].splitlines():
        if line == f"jaxrun: flight[{rank}] end":
            break
        m = _FLIGHT_ENTRY.match(line)
        if m and int(m[1]) == rank:
            entries.append(FlightEntry(int(m[2]), None if m[3] is None else int(m[3]), m[4], int(m[5]), m[6],
                                       "" if m[7] == "-" else m[7], m[8], int(m[9])))
    return FlightLog(rank, int(head[2]), head[3], tuple(entries))


# -- addresses -------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now.  Always one address: the services
    jaxrun starts have no authentication, so nothing listens on a wildcard."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(address: str | None) -> bool:
    """True for a loopback IP address, or a name that resolves to one."""
    if not address:
        return False
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        pass
    try:
        return ipaddress.ip_address(socket.gethostbyname(address)).is_loopback
    except (OSError, ValueError):
        return False


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- KEY=VALUE ---------------------------------------------------------------------------
# Portable variable names: what POSIX shells, env(1) and Kubernetes all accept.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

def parse_env_pair(text: str) -> tuple[str, str]:
    """``--env KEY=VALUE``: ValueError unless KEY is a plain variable name."""
    key, sep, value = text.partition("=")
    if not sep or not _ENV_NAME.fullmatch(key):
        raise ValueError(f"{text!r} is not KEY=VALUE")
    return key, value


# -- tables -------------------------------------------------------------------------------
def align_columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as text lines, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
