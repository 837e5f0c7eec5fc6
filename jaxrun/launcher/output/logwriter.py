"""Every process's log files, written by jaxrun, so that no write error of
theirs ever reaches the process.

A local process's stdout and stderr are pipes, and ``LogWriter``, one thread
at the launcher's own priority, moves them into the log files (``splice``:
inside the kernel, at the speed of the process writing the file itself; a
copy where the system has no splice).  The console is a view: the output
pump follows the files at a low priority, as they grow.  A remote process's
pipes are the output pump's, and it writes their logs through ``LogFile``
too.

A log file that cannot be written (a full disk, a quota, an I/O error) is
given up on at its first failed write, never the process: the process's
pipe is still read at once, what the file lacks is counted in its
``LogLoss`` (the report's and the summary's "which file stopped, when, how
much was lost"), stderr's last bytes are kept in memory for the summary
(the traceback), and the console is handed what it would have read from
the file (``spill``), where it shows this process.
"""

from __future__ import annotations

import os
import queue
import selectors
import sys
import threading
import time
from collections.abc import Callable

from jaxrun import portable
from jaxrun.core.backend import RunHooks, start_thread
from jaxrun.core.events import LogWriteFailed, Stream, StreamClosed
from jaxrun.core.logfiles import open_pumped_log
from jaxrun.core.outcome import LogLoss

CHUNK = 1 << 20  # one move from a pipe: a whole enlarged pipe
PIPE_SIZE = 1 << 20  # bigger pipes: a process writes on while jaxrun's thread waits for a CPU
PIPE_DEFAULT = 1 << 16  # Linux's own
# What a run's local pipes may hold in all: a user's pipes past the kernel's
# fs.pipe-user-pages-soft (64 MiB by default) get a single page each.
PIPES_BUDGET = 1 << 25
BUSY = 0.05  # seconds since a pipe last had bytes, within which the writer counts as busy
SWITCH = 0.001  # seconds: the launcher's interpreter lock changes hands at least this often


class LogFile:
    """One log file that jaxrun writes for a process, and what it could not
    write there (``loss``: None while every write went in)."""

    def __init__(self, path: str, rank: int, stream: Stream, events: queue.SimpleQueue,
                 on_loss: Callable[[LogLoss], None]):
        self.path, self.rank, self.stream, self.events, self.on_loss = path, rank, stream, events, on_loss
        self.file = open_pumped_log(path)
        self.fd = self.file.fileno()
        self.size = 0  # bytes in the file
        self.loss: LogLoss | None = None
        self.splices = True  # False: this system or this file takes no splice

    def write(self, data: bytes) -> bytes:
        """Every byte of ``data`` into the file, however many writes it takes;
        what did not go in (counted in ``loss``)."""
        view = memoryview(data)
        if self.loss is None:
            try:
                while view:
                    done = os.write(self.fd, view)
                    self.size += done
                    view = view[done:]
            except OSError as e:
                self.stopped(e)
        if view:
            self.loss.missed(bytes(view))
        return bytes(view)

    def move(self, pipe: int) -> int | None:
        """Move what ``pipe`` holds into the file in the kernel: how many bytes
        (0: the pipe's end); None: read the pipe instead (no splice, or the
        file was given up on, now or before)."""
        if self.loss is not None or not self.splices:
            return None
        try:
            moved = portable.move_from_pipe(pipe, self.fd, CHUNK)
        except OSError as e:
            self.stopped(e)
            return None
        if moved is None:
            self.splices = False
        else:
            self.size += moved
        return moved

    def stopped(self, error: OSError) -> None:
        """The first failed write: the file is given up on, said once."""
        why = error.strerror or str(error)
        self.loss = LogLoss(self.stream.value, self.path, why, time.time(), self.size)
        self.on_loss(self.loss)
        self.events.put(LogWriteFailed(self.rank, self.path, why))

    def close(self) -> None:
        self.file.close()


class _Pipe:
    def __init__(self, fd: int, log: LogFile, spill: Callable[[bytes], None] | None,
                 done: Callable[[], None] | None):
        self.fd, self.log, self.spill, self.done = fd, log, spill, done


class LogWriter:
    """One thread that moves every local process's pipes into its log files.

    It never waits for anything but the pipes: not the console (which
    follows the files), not a slow disk beyond its own writes.  A process
    blocks only once its pipe (``PIPE_SIZE``) is full, as it would writing
    to a slow file itself."""

    def __init__(self, events: queue.SimpleQueue, hooks: RunHooks | None = None, processes: int = 1):
        self.events = events
        self.pipe_size = pipe_size(processes)
        # After each system call this thread needs the interpreter lock back,
        # and a process waits for it once its pipe is full: another thread of
        # the launcher's that holds the lock gives it up within this, not 5 ms.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH))
        self.moved_at = float("-inf")  # when a pipe last had bytes (time.monotonic)
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)
        self.pending: list[_Pipe] = []
        self.lock = threading.Lock()
        self.stopped = False
        self.thread = start_thread("jaxrun-logs", self._run, hooks=hooks or RunHooks())

    def add(self, fd: int, log: LogFile, spill: Callable[[bytes], None] | None = None,
            done: Callable[[], None] | None = None) -> None:
        """Move the pipe ``fd`` into ``log`` until the pipe's end, then close
        both and call ``done``; ``spill``: where the bytes the file could not
        take go (the console's view of this stream), None: nowhere."""
        if self.pipe_size > PIPE_DEFAULT:
            portable.set_pipe_size(fd, self.pipe_size)  # where it cannot, the pipe keeps its default size
        with self.lock:
            self.pending.append(_Pipe(fd, log, spill, done))
        os.write(self.wake_w, b"+")

    def stop(self) -> None:
        """After the attempt: close what is still open (a grandchild outlived its group)."""
        self.stopped = True
        os.write(self.wake_w, b"x")
        self.thread.join(timeout=5)
        for key in list(self.selector.get_map().values()):
            if isinstance(key.data, _Pipe):
                self._close(key.data)
        self.selector.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _run(self) -> None:
        while not self.stopped:
            for key, _ in self.selector.select():
                if key.data is None:
                    os.read(self.wake_r, 4096)
                    with self.lock:
                        for pipe in self.pending:
                            self.selector.register(pipe.fd, selectors.EVENT_READ, pipe)
                        self.pending.clear()
                elif not self._move(key.data):
                    self.selector.unregister(key.data.fd)
                    self._close(key.data)
                    if key.data.done is not None:
                        key.data.done()
                    self.events.put(StreamClosed(key.data.log.rank, key.data.log.stream))

    def busy(self) -> bool:
        """Bytes are flowing: the console's thread, which needs the same
        interpreter lock, then takes turns with this one (``OutputPump``)."""
        return time.monotonic() - self.moved_at < BUSY

    def _move(self, pipe: _Pipe) -> bool:
        """One move from a ready pipe; False at its end."""
        self.moved_at = time.monotonic()
        moved = pipe.log.move(pipe.fd)
        if moved is not None:
            return moved > 0
        try:
            data = os.read(pipe.fd, CHUNK)
        except OSError:
            data = b""
        if not data:
            return False
        lost = pipe.log.write(data)
        if lost and pipe.spill is not None:
            pipe.spill(lost)
        return True

    @staticmethod
    def _close(pipe: _Pipe) -> None:
        pipe.log.close()
        os.close(pipe.fd)


def pipe_size(processes: int) -> int:
    """Each local pipe's size, for a run of this many processes: as large as
    ``PIPE_SIZE``, the whole run's within ``PIPES_BUDGET``."""
    size = PIPE_SIZE
    while size > PIPE_DEFAULT and 2 * processes * size > PIPES_BUDGET:
        size //= 2
    return size
