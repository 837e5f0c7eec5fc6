"""Moving children's bytes: into per-process log files, and to the console printer.

Local children's pipes go into their log files through the log writer's
thread (``output.logwriter``: the file is the record; the console is a view),
so a flood of output costs them no more than writing to a file would.
Remote children (SSH, srun, mpirun) reach jaxrun through pipes that this
pump reads, and writes their log files itself (``LogFile``).

``OutputPump`` is one thread that serves both kinds of source: it reads every
pipe as data arrives, and follows every local log file as it grows (woken by
inotify where the kernel has it, by a 10 Hz tick elsewhere).  It hands whole
lines to the console printer itself, one call per read, so a slow console
holds back the view, never memory.  While it follows files the thread runs at
the lowest CPU priority: on a busy machine the processes get the CPU first,
and the console catches up from the files.

A pipe may come with a ``StreamFilter`` (its child's ``stream_filter``): the
child's own way of taking in-band facts out of the stream.  The pump only
feeds it every read and closes it at the end of the stream; what the filter
passes on is what reaches the log and the console.

The pump never stops reading a pipe, whatever goes wrong downstream: a remote
process blocks once its pipe is full.  A log file that cannot be written (a
full disk) is given up on and reported once (``LogFile``), and its later bytes
still reach the console: a pipe's at once, a followed file's as the log
writer spills them (``spill``), after the file's last byte; a console that
went away is the printer's business.
"""

from __future__ import annotations

import collections
import os
import queue
import select
import selectors
import threading
import time
from collections.abc import Callable

from jaxrun import portable
from jaxrun.core.backend import RunHooks, StreamFilter, start_thread
from jaxrun.core.events import Stream, StreamClosed
from jaxrun.launcher.output.filewatch import FileWatch
from jaxrun.launcher.output.logwriter import LogFile

CHUNK = 1 << 18
FILE_CHUNK = 1 << 16  # one look at a followed file; small enough for malloc's heap
LONGEST_LINE = 1 << 16  # an unfinished line longer than this is shown as it is
CONSOLE_NICE = 19  # the output thread's niceness while it follows files
PIPE_SIZE = 1 << 20  # bigger pipes: fewer, larger reads under a flood
TRICKLE = 1 << 14  # a read smaller than this is a trickle, worth coalescing
COALESCE = 0.1  # seconds; the most a trickling console line is held back
# Followed files that keep growing are read less and less often, up to this:
# a job printing thousands of lines a second gets them in batches of half a
# second, at a fraction of the cost.  A quiet file is watched, so the first
# line after a pause still shows at once.
MAX_BATCH = 0.5
# A followed file's bytes that its writer could not put in it, held for the
# console: past this, a console that lags far behind does not get them.
SPILL_HELD = 1 << 23

class _Source:
    """One pipe being pumped, or one log file being followed: where its bytes
    go, and its unfinished last line."""

    def __init__(self, fd: int, log: LogFile | None, rank: int, stream: Stream,
                 on_close: Callable[[], None] = lambda: None, show: bool = True, path: str = ""):
        self.fd, self.log, self.rank, self.stream, self.on_close = fd, log, rank, stream, on_close
        self.path = path  # the log file's name
        # A followed file's: the bytes its writer could not put in it, in
        # order, once they are due (after the file's last byte); its writer is done.
        self.spilled: collections.deque[bytes] = collections.deque()
        self.spilled_bytes = 0
        self.complete = False
        self.filter: StreamFilter | None = None  # what the child takes out of a pipe's bytes
        self.show = show  # False: keep the log only, send nothing to the console
        self.partial = b""


class OutputPump:
    """One thread that moves every child's bytes, whatever the number of children.

    A pipe's bytes go to its log file at once; a followed file already holds
    them.  Complete lines then go to ``show`` (the console printer), one call
    per read; the supervisor hears only of each stream's end.
    When output trickles in (small reads, round after round) the pump waits
    ``coalesce`` seconds between rounds, so that a job printing a line every
    millisecond costs about 1/coalesce wake-ups a second instead of thousands.
    A flood (big reads) is never held back, and a quiet process's occasional
    line shows at once (for followed files: where inotify exists).
    """

    def __init__(self, events: queue.SimpleQueue, show: Callable[[int, Stream, bytes], None],
                 flush: Callable[[], None] = lambda: None, coalesce: float = COALESCE,
                 hooks: RunHooks | None = None):
        self.events, self.show, self.flush, self.coalesce = events, show, flush, coalesce
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)
        self.pending: list[_Source] = []
        self.files: list[_Source] = []
        self.watch: FileWatch | None = None
        self.finishing = False  # every process is gone: no pause holds back the last bytes
        self.lock = threading.Lock()
        self.stopped = False
        # The log writer moves a flood: the console, behind, reads one round
        # per ``MAX_BATCH`` instead of catching up at once.  Between rounds this
        # thread holds no interpreter lock, which the log writer needs after
        # each of its system calls (a process waits for it once its pipe is
        # full), and at its low priority it may be preempted holding it.
        self.yield_to: Callable[[], bool] = lambda: False
        self.thread = start_thread("jaxrun-output", self._run, hooks=hooks or RunHooks())

    def add(self, fd: int, log: LogFile, rank: int, stream: Stream, on_close: Callable[[], None],
            show: bool = True, path: str = "", stream_filter: StreamFilter | None = None) -> None:
        """Pump a pipe into ``log`` (the file at ``path``), through
        ``stream_filter`` if there is one: fed every read, closed at the end."""
        src = _Source(fd, log, rank, stream, on_close, show, path)
        src.filter = stream_filter
        with self.lock:
            self.pending.append(src)
        os.write(self.wake_w, b"+")

    def follow(self, path: str, rank: int, stream: Stream) -> tuple[Callable[[bytes], None], Callable[[], None]]:
        """Show a log file that the log writer writes, as it grows.  Returns
        what its writer calls with the bytes the file could not take
        (``spill``), and once the file is complete (``done``): the pump
        then reads it to its end and closes it."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        src = _Source(fd, None, rank, stream, path=path)
        with self.lock:
            self.pending.append(src)
        os.write(self.wake_w, b"+")

        def spill(data: bytes) -> None:
            if src.spilled_bytes < SPILL_HELD:
                src.spilled_bytes += len(data)
                src.spilled.append(data)
                self.wake()

        def done() -> None:
            src.complete = True
            self.wake()

        return spill, done

    def finish(self) -> None:
        """Every process is gone: no more coalescing pauses."""
        self.finishing = True
        self.wake()

    def wake(self) -> None:
        """Read at once instead of finishing a coalescing pause."""
        os.write(self.wake_w, b".")

    def stop(self) -> None:
        self.stopped = True
        os.write(self.wake_w, b"x")
        self.thread.join(timeout=5)
        for key in list(self.selector.get_map().values()):
            if isinstance(key.data, _Source):  # still open: a grandchild outlived its group
                key.data.on_close()
        for src in self.files:
            os.close(src.fd)
        if self.watch is not None:
            self.watch.disarm(wait=False)
        self.selector.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _run(self) -> None:
        last_round = 0.0
        behind = False  # a followed file holds more than one read's worth
        quiet = False  # the last look at the followed files found nothing new
        interval = self.coalesce  # between looks at followed files that grow
        while not self.stopped:
            now = time.monotonic()
            timeout = None  # pipes only: sleep until one is readable
            if behind:
                timeout = max(0.0, last_round + MAX_BATCH - now) if self.yield_to() else 0
            elif self.files:
                # Growing files are polled, less often the longer they keep
                # growing; quiet files are watched, after one more look to
                # catch a write that raced the arming.
                timeout = max(0.0, last_round + interval - now)
                if quiet and self._arm():
                    quiet, behind = self._read_files()
                    timeout = None if quiet else 0
            trickle = True
            for key, _ in self.selector.select(timeout):
                if key.data is None:
                    os.read(self.wake_r, 4096)
                    self._take_pending()
                elif key.data is self.watch:
                    self._disarm()
                elif not self._pump(key.data):
                    trickle = False
            if self.files:
                self._disarm()
                self._close_files()
                quiet, behind = self._read_files()
                interval = self.coalesce if quiet else min(2 * interval, MAX_BATCH)
                last_round = time.monotonic()
                self.flush()
                continue
            self.flush()
            if trickle and now - last_round < self.coalesce and not self.finishing:
                # Hold back, unless woken: a process exiting means its last
                # bytes and EOF are waiting, and the job's end should not wait
                # (nor, once every process is gone, any stream's EOF).
                select.select([self.wake_r], [], [], self.coalesce)
            last_round = now

    def _arm(self) -> bool:
        if self.watch is None:
            self.watch = FileWatch()
        fd = self.watch.arm([src.path for src in self.files])
        if fd is None:
            return False
        self.selector.register(fd, selectors.EVENT_READ, self.watch)
        return True

    def _disarm(self) -> None:
        """Stop watching the followed files (``FileWatch.release``); ``stop`` closes the watch."""
        if self.watch is not None and self.watch.watches:
            self.selector.unregister(self.watch.fd)
            self.watch.release()

    def _take_pending(self) -> None:
        with self.lock:
            for src in self.pending:
                if src.log is None:
                    if not self.files:
                        self._step_back()
                    self.files.append(src)
                else:
                    self.selector.register(src.fd, selectors.EVENT_READ, src)
            self.pending.clear()

    @staticmethod
    def _step_back() -> None:
        """Yield the CPU to the job: a followed file's writer never waits for
        the console, so the view may lag under load and catch up later.  (Not
        for pipes: a remote process blocks while its pipe is full.)"""
        portable.lower_thread_priority(CONSOLE_NICE)  # where it cannot, the thread keeps its priority

    def _pump(self, src: _Source) -> bool:
        """Read once from a ready pipe; True if the read was small (or the end)."""
        try:
            data = os.read(src.fd, CHUNK)
        except OSError:
            data = b""
        end = not data
        if src.filter is not None:
            data = src.filter.feed(data) if data else b""
            if end:
                data += src.filter.close()
        if data:
            self._keep(src, data)
            self._lines(src, data)
        if end:
            self.selector.unregister(src.fd)
            self._end(src)
            return True
        return len(data) < TRICKLE

    def _keep(self, src: _Source, data: bytes) -> None:
        src.log.write(data)  # what the file cannot take is counted there; the console still gets it

    def _read_files(self) -> tuple[bool, bool]:
        """Read what each followed file gained, a chunk at most, and at its
        end what its writer spilled.  Returns (nothing was new, a file holds
        more: its writer is ahead of the console)."""
        quiet, behind = True, False
        for src in self.files:
            due = len(src.spilled)  # spilled before this read: after every byte it finds
            data = os.read(src.fd, FILE_CHUNK)
            if not data and due:
                data = b"".join(src.spilled.popleft() for _ in range(due))
            if data:
                self._lines(src, data)
                quiet, behind = False, behind or len(data) >= FILE_CHUNK
        return quiet, behind

    def _close_files(self) -> None:
        """Read each file its writer is done with to its end, spilled bytes
        last, and close it."""
        for src in [src for src in self.files if src.complete]:
            while data := os.read(src.fd, CHUNK):
                self._lines(src, data)
            while src.spilled:
                self._lines(src, src.spilled.popleft())
            os.close(src.fd)
            self._end(src)
            self.files.remove(src)

    def _lines(self, src: _Source, data: bytes) -> None:
        if not src.show:
            return
        data = src.partial + data
        cut = data.rfind(b"\n") + 1
        if len(data) - cut > LONGEST_LINE:  # say, progress bars redrawn with \r for hours
            cut = len(data)
        src.partial = data[cut:]
        if cut:
            self.show(src.rank, src.stream, data[:cut])

    def _end(self, src: _Source) -> None:
        if src.partial:
            self.show(src.rank, src.stream, src.partial)
        self.flush()  # before the supervisor hears of it and prints its summary
        src.on_close()
        self.events.put(StreamClosed(src.rank, src.stream))


def enlarge_pipe(fd: int) -> None:
    portable.set_pipe_size(fd, PIPE_SIZE)  # where it cannot, the pipe keeps its default size
