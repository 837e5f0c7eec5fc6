"""An attempt as the control channel shows it, read from another thread
(``launcher/channel.py``): one row per process, and every process's stack
dump, taken now.

Nothing here changes the attempt or waits on its loop.  A row reads a
slot's state, its activity (``attempt.activity``), the tail of its logs and,
where the process runs on this machine, its CPU and memory.  The dumps are
asked for the way ``kill -USR1`` on jaxrun asks (an event on the
supervisor's queue: its loop signals every live process, and every far end
forwards the signal); they land in the stderr logs, where the console
already leaves them (``output.printer``), and are read from there.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable

from jaxrun import contract
from jaxrun.core.events import SignalReceived
from jaxrun.core.noise import is_noise
from jaxrun.core.outcome import Verdict
from jaxrun.launcher.attempt.activity import log_size, read_after
from jaxrun.launcher.attempt.slots import LIVE, Slot, State
from jaxrun.reporting import stacks
from jaxrun.wire import inspect as words

TAIL = 8192  # of each log, for its last line
_DUMP_START = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+", re.M)
_SHOWN = {State.STARTED: "starting", State.JOINED: "joined", State.WORKING: "working", State.WAITING: "waiting",
          State.FINISHED: "finished"}


def shown_state(slot: Slot, restarting: bool = False) -> str:
    """The slot's state as ``jaxrun top`` names it (``wire.inspect.STATES``):
    a process on its way back (a later life, or a later attempt, not yet at
    the job's rendezvous) is restarting, as is the whole job between attempts."""
    if restarting:
        return "restarting"
    if slot.state in (State.PENDING, State.STARTED):
        return "restarting" if again(slot) else "starting"
    if slot.state is State.ENDED:
        if slot.record.verdict is Verdict.RESTARTED:
            return "restarting"
        return "finished" if slot.record.returncode == 0 else "failed"
    return _SHOWN[slot.state]


def again(slot: Slot) -> bool:
    """A later life of its process, or a life in a later attempt."""
    attempt = int(slot.record.spec.env.get(contract.RESTART_COUNT, "0"))  # the attempt's count plus the life's
    return slot.record.life > 0 or attempt > 0


def last_line(record) -> str:
    """The last line the process printed, on either stream, as the console
    shows lines: its stack dumps and JAX's noise are not lines here.  The
    newer log's goes first, unless that log ends in a dump (which made it
    the newer one): then the line before the dump may be the older."""
    found = []
    for path in (record.stdout_log, record.stderr_log):
        line, dumped = _last_in(contract.read_tail(path, TAIL) or b"")
        if line:
            found.append((not dumped, _mtime(path), line))
    return max(found)[2].decode("utf-8", "replace")[-words.MAX_LAST_LINE:] if found else ""


def _last_in(data: bytes) -> tuple[bytes, bool]:
    """(the last line shown of ``data``, whether a dump came after it)."""
    dumped = False
    for line in reversed(data.splitlines()):
        if stacks.DUMP_HEAD.match(line) or stacks.DUMP_BODY.match(line):
            dumped = dumped or bool(line.strip())
        elif not is_noise(line):
            return line, dumped
    return b"", dumped


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


class Usage:
    """CPU and memory of processes on this machine: the CPU as a share of
    one core since the last look at the same process (since its start, the
    first time)."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.last: dict[int, tuple[float, float]] = {}  # pid -> (wall, CPU seconds) at the last look

    def of(self, pid: int) -> tuple[float | None, int | None]:
        import psutil

        try:
            process = psutil.Process(pid)
            with process.oneshot():
                times, memory, began = process.cpu_times(), process.memory_info().rss, process.create_time()
        except (psutil.Error, OSError):
            return None, None
        now, used = self.clock(), times.user + times.system
        then, before = self.last.get(pid, (began, 0.0))
        self.last[pid] = (now, used)
        share = 100.0 * (used - before) / (now - then) if now - then > 1e-3 else None
        return (None if share is None else max(0.0, share)), memory


def local(supervisor) -> bool:
    """Whether the attempt's pids are its controllers on this machine: a local
    backend's are; elsewhere they are helpers here (an ssh client, a scheduler
    step) until each controller's own comes with its end."""
    return supervisor.backend.writes_log_files


def shown_pid(slot: Slot, here: bool) -> int | None:
    return slot.record.pid if here or slot.state is State.ENDED else None


def rows(supervisor, usage: Usage | None, restarting: bool = False) -> list[words.TableRow]:
    """One row per process of the attempt; CPU and memory where ``usage``
    can see them (a local job's)."""
    now = supervisor.clock()
    activity = supervisor.activity
    shares, straggler = activity.stragglers.now if activity is not None else ({}, None)
    made = []
    here = local(supervisor)
    for slot in supervisor.slots:
        record = slot.record
        cpu = memory = idle = None
        if slot.state in LIVE and usage is not None and here and record.pid:
            cpu, memory = usage.of(record.pid)
        if slot.state in (State.WORKING, State.WAITING, State.FINISHED) and activity is not None:
            since = activity.idle_since.get(slot.rank)
            idle = 0.0 if slot.state is State.WORKING else (None if since is None else max(0.0, now - since))
        made.append(words.TableRow(slot.rank, record.spec.host.name, shown_pid(slot, here), record.life,
                                   shown_state(slot, restarting), cpu, memory, idle, last_line(record),
                                   shares.get(slot.rank), straggler is not None and straggler.rank == slot.rank))
    return made


def table(supervisor, run_id: str, max_restarts: int, usage: Usage | None, restarting: bool) -> words.Table:
    attempt = int(supervisor.specs[0].env.get(contract.RESTART_COUNT, "0")) if supervisor.specs else 0
    straggler = supervisor.activity.stragglers.now[1] if supervisor.activity is not None else None
    return words.Table(run_id, attempt, supervisor.policy.spent, max_restarts,
                       tuple(rows(supervisor, usage, restarting)), restarting,
                       straggler.line() if straggler is not None else "")


def dumps(supervisor, post: Callable[[object], None], wait: float, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> words.Stacks:
    """Every live process's stack dump, asked for now; each that has not
    landed in its log within ``wait`` seconds comes back empty."""
    live = [slot for slot in supervisor.slots if slot.state in LIVE]
    logs = {slot.rank: slot.record.stderr_log for slot in live}
    offsets = {rank: log_size(path) for rank, path in logs.items()}
    if live:
        post(SignalReceived(signal.SIGUSR1))
    texts: dict[int, str] = {}
    sizes: dict[int, int] = {}
    end = clock() + wait
    while logs:
        settled = True
        for rank, path in logs.items():
            size = log_size(path)
            texts[rank] = dump_in(read_after(path, offsets[rank])) if size > offsets[rank] else ""
            # Whole once a main thread's block is there and the log stopped growing.
            settled &= "Current thread 0x" in texts[rank] and sizes.get(rank) == size
            sizes[rank] = size
        if settled or clock() >= end:
            break
        sleep(0.1)
    here = local(supervisor)
    made = [words.StackDump(slot.rank, slot.record.spec.host.name, shown_pid(slot, here), slot.record.life,
                            shown_state(slot), texts.get(slot.rank, "")) for slot in supervisor.slots]
    missing = [d.rank for d in made if not d.text and d.rank in logs]
    note = f"no stack dump came from process {','.join(map(str, missing))} within {wait:g} s" if missing else ""
    return words.Stacks(tuple(made), note)


def dump_in(text: str) -> str:
    """The dump in ``text``: from its first thread's header on, at most ``MAX_DUMP`` characters."""
    found = _DUMP_START.search(text)
    return "" if found is None else text[found.start():found.start() + words.MAX_DUMP]
