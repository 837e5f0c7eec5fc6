"""Moving children's bytes: into per-process log files, and onto the console.

``pump_output`` runs in one thread per pipe.  It writes every byte to the log
file as it arrives (the file is the record; the console is a view), then hands
whole lines to the supervisor as one ``Output`` message per read.  A semaphore
bounds the chunks in flight, so a slow console slows the children down instead
of growing memory.
"""

from __future__ import annotations

import fcntl
import os
import queue
import re
import sys
import threading
import time
from typing import BinaryIO, Callable

from jaxrun.events import Output, Stream, StreamClosed

CHUNK = 1 << 18
IN_FLIGHT = 32
PIPE_SIZE = 1 << 20  # bigger pipes: fewer, larger reads under a flood
TRICKLE = 1 << 14  # a read smaller than this is a trickle, worth coalescing
COALESCE = 0.03  # seconds; the most a console line is held back

# Lines JAX and its collectives print on every run; hidden on the console only.
NOISE_PREFIXES = (b"[Gloo] ",)
# Gloo writes its connection line in pieces from several threads, so a piece
# can land at the start of a line of its own.
_NOISE_ANYWHERE = re.compile(rb"is connected to \d+ peer ranks")
# A faulthandler dump: a thread header, then frame lines and blank lines.
_DUMP_HEAD = re.compile(rb"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_DUMP_BODY = re.compile(rb"^(  File \"|  <no Python frame>|\s*$)")
# Substrings that mark a chunk as possibly holding a line to hide.  Plain
# substring tests run at memchr speed; a regex alternation over megabytes doesn't.
_HIDDEN_MARKS = (b"[Gloo] ", b"peer ranks", b"most recent call first")


def _maybe_hidden(data: bytes) -> bool:
    return any(mark in data for mark in _HIDDEN_MARKS)


def pump_output(
    fd: int,
    log: BinaryIO,
    rank: int,
    stream: Stream,
    events: queue.SimpleQueue,
    credits: threading.Semaphore,
    coalesce: float = COALESCE,
) -> None:
    partial = b""
    try:
        while True:
            try:
                data = os.read(fd, CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            log.write(data)
            data = partial + data
            cut = data.rfind(b"\n") + 1
            partial = data[cut:]
            if cut:
                credits.acquire()
                events.put(Output(rank, stream, data[:cut]))
            if len(data) < TRICKLE:
                # Trickling output: let a few lines gather so that a process
                # printing every millisecond costs tens of wake-ups a second,
                # not thousands.  Floods (full reads) never wait.
                time.sleep(coalesce)
        if partial:
            credits.acquire()
            events.put(Output(rank, stream, partial))
    finally:
        log.flush()
        events.put(StreamClosed(rank, stream))


def enlarge_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass  # not Linux, or over /proc/sys/fs/pipe-max-size: keep the default


def is_noise(line: bytes) -> bool:
    return line.startswith(NOISE_PREFIXES) or bool(_NOISE_ANYWHERE.search(line))


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
        """Complete lines (or a final partial one) as the console shows them."""
        if not data.endswith(b"\n"):
            data += b"\n"
        if self.show_noise or (rank not in self.in_dump and not _maybe_hidden(data)):
            # The common case, done in C: prefix every line of the chunk at once.
            return prefix + data[:-1].replace(b"\n", b"\n" + prefix) + b"\n" if prefix else data
        return b"".join(
            prefix + line for line in data.splitlines(keepends=True) if self._visible(rank, stream, line)
        )

    def write(self, rank: int, stream: Stream, data: bytes) -> None:
        """Live output (stream mode): every line prefixed with its rank."""
        if self.mode != "stream":
            return
        text = self.render(rank, stream, data, f"[{rank}] ".encode())
        if text:
            sink = self.out if stream is Stream.STDOUT else self.err
            sink.write(text)
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
