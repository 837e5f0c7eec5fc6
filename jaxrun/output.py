"""Moving children's bytes: into per-process log files, and onto the console.

``OutputPump`` is one thread that reads every child's pipes.  It writes each
byte to the log file as it arrives (the file is the record; the console is a
view), then hands whole lines to the supervisor as one ``Output`` message per
read.  A semaphore bounds the chunks in flight, so a slow console slows the
children down instead of growing memory.
"""

from __future__ import annotations

import fcntl
import os
import queue
import re
import select
import selectors
import sys
import threading
import time
from typing import BinaryIO, Callable

from jaxrun.events import Output, Stream, StreamClosed

CHUNK = 1 << 18
IN_FLIGHT = 32
PIPE_SIZE = 1 << 20  # bigger pipes: fewer, larger reads under a flood
TRICKLE = 1 << 14  # a read smaller than this is a trickle, worth coalescing
COALESCE = 0.1  # seconds; the most a trickling console line is held back

# Lines JAX and its collectives print on every run; hidden on the console only.
# Gloo's "[Gloo] Rank 0 is connected to 3 peer ranks. ..." is written in
# pieces from several threads, so a piece can land at the start of a line.
_NOISE = re.compile(rb"is connected to \d+ peer ranks")
# A faulthandler dump: a thread header, then frame lines and blank lines.
_DUMP_HEAD = re.compile(rb"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
# (faulthandler writes "  Garbage-collecting" above the frames when the GC was running.)
_DUMP_BODY = re.compile(rb"^(  File \"|  <no Python frame>|  Garbage-collecting|\s*$)")
# Substrings that mark a chunk as possibly holding a line to hide.  Plain
# substring tests run at memchr speed; a regex alternation over megabytes doesn't.
# One marker per stream keeps the scan of a flood cheap: Gloo's noise is on
# stdout, faulthandler's dumps on stderr.
_HIDDEN_MARK = {Stream.STDOUT: b"peer ranks", Stream.STDERR: b"most recent call first"}


class _Source:
    """One pipe being pumped: where its bytes go, and its unfinished last line."""

    def __init__(self, fd: int, log: BinaryIO, rank: int, stream: Stream, on_close: Callable[[], None]):
        self.fd, self.log, self.rank, self.stream, self.on_close = fd, log, rank, stream, on_close
        self.partial = b""


class OutputPump:
    """One thread that moves every child's bytes, whatever the number of children.

    Each read goes to the log file at once.  Complete lines then go to the
    supervisor as one ``Output`` per read.  When output trickles in (small
    reads, round after round) the pump waits ``coalesce`` seconds between
    rounds, so that a job printing a line every millisecond costs about
    1/coalesce wake-ups a second instead of thousands.  A flood (big reads) is
    never held back, and a quiet process's occasional line shows at once.
    """

    def __init__(self, events: queue.SimpleQueue, credits: threading.Semaphore, coalesce: float = COALESCE):
        self.events, self.credits, self.coalesce = events, credits, coalesce
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)
        self.pending: list[_Source] = []
        self.lock = threading.Lock()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="jaxrun-output", daemon=True)
        self.thread.start()

    def add(self, fd: int, log: BinaryIO, rank: int, stream: Stream, on_close: Callable[[], None]) -> None:
        with self.lock:
            self.pending.append(_Source(fd, log, rank, stream, on_close))
        os.write(self.wake_w, b"+")

    def wake(self) -> None:
        """Read at once instead of finishing a coalescing pause."""
        os.write(self.wake_w, b".")

    def stop(self) -> None:
        self.stopped = True
        os.write(self.wake_w, b"x")
        self.credits.release(IN_FLIGHT)  # never leave the thread stuck on a full queue
        self.thread.join(timeout=5)
        for key in list(self.selector.get_map().values()):
            if key.data is not None:  # still open: a grandchild outlived its group
                key.data.on_close()
        self.selector.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _run(self) -> None:
        last_round = 0.0
        while not self.stopped:
            trickle = True
            for key, _ in self.selector.select():
                if key.data is None:
                    os.read(self.wake_r, 4096)
                    with self.lock:
                        for src in self.pending:
                            self.selector.register(src.fd, selectors.EVENT_READ, src)
                        self.pending.clear()
                elif not self._pump(key.data):
                    trickle = False
            now = time.monotonic()
            if trickle and now - last_round < self.coalesce:
                # Hold back, unless woken: a process exiting means its last
                # bytes and EOF are waiting, and the job's end should not wait.
                select.select([self.wake_r], [], [], self.coalesce)
            last_round = now

    def _pump(self, src: _Source) -> bool:
        """Read once from a ready pipe; True if the read was small (or the end)."""
        try:
            data = os.read(src.fd, CHUNK)
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(src.fd)
            if src.partial:
                self._emit(src, src.partial)
            src.on_close()
            self.events.put(StreamClosed(src.rank, src.stream))
            return True
        src.log.write(data)
        data = src.partial + data
        cut = data.rfind(b"\n") + 1
        src.partial = data[cut:]
        if cut:
            self._emit(src, data[:cut])
        return len(data) < TRICKLE

    def _emit(self, src: _Source, data: bytes) -> None:
        self.credits.acquire()
        self.events.put(Output(src.rank, src.stream, data))


def enlarge_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass  # not Linux, or over /proc/sys/fs/pipe-max-size: keep the default


def is_noise(line: bytes) -> bool:
    return bool(_NOISE.search(line))


class ConsolePrinter:
    """Shows output live with a rank prefix (``stream``) or per process at the end
    (``grouped``, in the block format of the guide's bash loop)."""

    def __init__(
        self,
        mode: str = "stream",
        show_noise: bool = False,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
        group_markers: tuple[Callable[[int], str], str] | None = None,
    ):
        self.mode = mode
        self.show_noise = show_noise
        self.out = stdout or sys.stdout.buffer
        self.err = stderr or sys.stderr.buffer
        self.group_markers = group_markers
        self.in_dump: set[int] = set()  # ranks whose stderr is inside a stack dump

    def _visible(self, rank: int, stream: Stream, line: bytes) -> bool:
        """Stack dumps and noise stay in the log files; the summary points at them."""
        if self.show_noise:
            return True
        if stream is Stream.STDERR:
            if _DUMP_HEAD.match(line):
                self.in_dump.add(rank)
                return False
            if rank in self.in_dump:
                if _DUMP_BODY.match(line):
                    return False
                self.in_dump.discard(rank)
        return not is_noise(line)

    def render(self, rank: int, stream: Stream, data: bytes, prefix: bytes = b"") -> bytes:
        """Complete lines (or a final partial one) as the console shows them.

        With a prefix, the result starts without it and ends with it: the
        caller writes the prefix first and drops the trailing one, which saves
        copying a whole chunk twice more under a flood.
        """
        if not data.endswith(b"\n"):
            data += b"\n"
        if self.show_noise or (rank not in self.in_dump and _HIDDEN_MARK[stream] not in data):
            # The common case, done in C: prefix every line of the chunk at once.
            return data.replace(b"\n", b"\n" + prefix) if prefix else data
        kept = [line for line in data.splitlines(keepends=True) if self._visible(rank, stream, line)]
        return b"".join(line + prefix for line in kept) if prefix else b"".join(kept)

    def write(self, rank: int, stream: Stream, data: bytes) -> None:
        """Live output (stream mode): every line prefixed with its rank."""
        if self.mode != "stream":
            return
        prefix = f"[{rank}] ".encode()
        text = self.render(rank, stream, data, prefix)
        if text:
            sink = self.out if stream is Stream.STDOUT else self.err
            sink.write(prefix)
            sink.write(memoryview(text)[: -len(prefix)])
            sink.flush()

    def grouped(self, rank: int, stdout_path: str, stderr_path: str) -> None:
        """Print one process's whole output, as the bash loop's final ``cat`` does."""
        if self.mode != "grouped":
            return
        head, tail = self.group_markers or (
            lambda r: f"=================== process {r} output ===================",
            "",
        )
        self.out.write(head(rank).encode() + b"\n")
        for path, sink, stream in ((stdout_path, self.out, Stream.STDOUT), (stderr_path, self.err, Stream.STDERR)):
            sink.flush()
            with open(path, "rb") as f:
                for chunk in read_lines_in_chunks(f):
                    sink.write(self.render(rank, stream, chunk))
            sink.flush()
        self.out.write(tail.encode() + b"\n")
        self.out.flush()


def read_lines_in_chunks(f: BinaryIO, size: int = CHUNK):
    """Yield runs of complete lines (the last may lack its newline)."""
    partial = b""
    while True:
        data = f.read(size)
        if not data:
            break
        data = partial + data
        cut = data.rfind(b"\n") + 1
        partial = data[cut:]
        if cut:
            yield data[:cut]
    if partial:
        yield partial
