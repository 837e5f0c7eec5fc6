"""Moving children's bytes: into per-process log files, and onto the console.

``pump_output`` runs in one thread per pipe.  It writes every byte to the log
file as it arrives (the file is the record; the console is a view), then hands
whole lines to the supervisor as one ``Output`` message per read.  A semaphore
bounds the chunks in flight, so a slow console slows the children down instead
of growing memory.
"""

from __future__ import annotations

import os
import queue
import re
import sys
import threading
from typing import BinaryIO, Callable

from jaxrun.events import Output, Stream, StreamClosed

CHUNK = 1 << 16
IN_FLIGHT = 64

# Lines JAX and its collectives print on every run; hidden on the console only.
NOISE_PREFIXES = (b"[Gloo] ",)
# Gloo writes its connection line in pieces from several threads, so a piece
# can land at the start of a line of its own.
_NOISE_ANYWHERE = re.compile(rb"is connected to \d+ peer ranks")
# A faulthandler dump: a thread header, then frame lines and blank lines.
_DUMP_HEAD = re.compile(rb"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
# (faulthandler writes "  Garbage-collecting" above the frames when the GC was running.)
_DUMP_BODY = re.compile(rb"^(  File \"|  <no Python frame>|  Garbage-collecting|\s*$)")


def pump_output(
    fd: int,
    log: BinaryIO,
    rank: int,
    stream: Stream,
    events: queue.SimpleQueue,
    credits: threading.Semaphore,
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
                events.put(Output(rank, stream, data[:cut].splitlines(keepends=True)))
        if partial:
            credits.acquire()
            events.put(Output(rank, stream, [partial]))
    finally:
        log.flush()
        events.put(StreamClosed(rank, stream))


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

    def lines(self, rank: int, stream: Stream, lines: list[bytes]) -> None:
        if self.mode != "stream":
            return
        sink = self.out if stream is Stream.STDOUT else self.err
        prefix = f"[{rank}] ".encode()
        text = b"".join(
            prefix + (line if line.endswith(b"\n") else line + b"\n")
            for line in lines
            if self._visible(rank, stream, line)
        )
        if text:
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
        for path, sink in ((stdout_path, self.out), (stderr_path, self.err)):
            sink.flush()
            with open(path, "rb") as f:
                for line in f:
                    if self.show_noise or not is_noise(line):
                        sink.write(line if line.endswith(b"\n") else line + b"\n")
            sink.flush()
        self.out.write(tail.encode() + b"\n")
        self.out.flush()
