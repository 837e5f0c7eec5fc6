"""The console view of the job: rank-prefixed live lines, or one block per
process at the end, with JAX's per-run noise, its fatal-error pages (counted
on the summary's last line: ``pages.said()``), the checks' diagnoses (the
summary gives the job's one) and stack dumps left to the logs.  Every
backend's output comes through here.

The console is a view; the log files are the record.  When the console's
reader goes away (``jaxrun ... | head -1``) or it fails otherwise, jaxrun stops
writing to it, points it at /dev/null so that nothing later trips over it
either, and the job goes on and ends as it would have.
"""

from __future__ import annotations

import io
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO, TextIO

from jaxrun import contract
from jaxrun.core.events import Stream
from jaxrun.core.logfiles import log_paths
from jaxrun.core.noise import PAGE_MARKS, TEARDOWN_MARKS, FatalPages, is_noise, read_lines_in_chunks, without_noise
from jaxrun.launcher.output.tracebacks import HEAD, TracebackFold
from jaxrun.reporting import stacks

FLUSH_AT = 1 << 20  # console bytes gathered before a write, at most

# The flight recorder's block (contract.flight_block), which a controller
# writes into its stderr after each stack dump: like the dump, it is for the
# log and the summary, and would flood the console (up to thousands of lines
# per process).
_FLIGHT_MARK = b"jaxrun: flight["
_FLIGHT_LINE = re.compile(rb"^jaxrun: flight\[\d+\] (?:begin: |#\d+ |end\r?$)")
# The line a check writes before its diagnosis (contract.DIAGNOSIS_HEAD).
_DIAGNOSIS_HEAD = contract.DIAGNOSIS_HEAD.encode()
# Substrings that mark a chunk as possibly holding a line to hide.  Plain
# substring tests run at memchr speed; a regex alternation over megabytes doesn't.
# Gloo's noise is on stdout; faulthandler's dumps, the flight block and the
# note a scheduler step leaves in each task's log when it ends under them are
# on stderr (the step says that once on the console, for all its tasks).
_HIDDEN_MARKS = {Stream.STDOUT: (b"peer ranks", b"[Gloo]"),
                 Stream.STDERR: (b"most recent call first", HEAD, _FLIGHT_MARK, *contract.ENGINE_NOTE_MARKS,
                                 *TEARDOWN_MARKS, *PAGE_MARKS, _DIAGNOSIS_HEAD)}
# Back to the start of the line and erase it: where a live status line was.
ERASE_LINE = b"\r\x1b[K"


class ConsolePrinter:
    """Shows output live with a rank prefix (``stream``) or per process at the end
    (``grouped``, in the block format of the guide's bash loop).

    ``ranks`` limits the console to those processes (None: all of them); the
    others' output is in their log files only.
    """

    def __init__(
        self,
        mode: str = "stream",
        show_noise: bool = False,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
        group_markers: tuple[Callable[[int], str], str] | None = None,
        ranks: frozenset[int] | None = None,
        timestamps: bool = False,
        quiet: bool = False,
        log_dir: str | None = None,
        fold: bool = True,
    ):
        self.mode = mode
        self.quiet = quiet  # -q: jaxrun's routine lines are left out
        self.timestamps = timestamps  # each live line starts with the wall-clock time it arrived
        self.ranks = ranks
        self.show_noise = show_noise
        self.out = stdout or sys.stdout.buffer
        self.err = stderr or sys.stderr.buffer
        self.group_markers = group_markers
        self.in_dump: set[int] = set()  # ranks whose stderr is inside a stack dump
        self.pages = FatalPages()  # JAX's fatal-error pages, and a lost peer's tracebacks with them
        self.judged: set[int] = set()  # ranks past a check's diagnosis head: their jaxrun lines are its
        # Tracebacks folded on the console; each fold names the log (its folder: -v shows them whole).
        # (`jaxrun logs`, a log read back, shows them whole: fold=False.)
        self.tracebacks = TracebackFold(lambda rank: log_paths(log_dir, rank)[1] if log_dir else "its stderr log",
                                        self.pages.enter) if fold else None
        self.pending: dict[Stream, list] = {Stream.STDOUT: [], Stream.STDERR: []}
        self.pending_bytes = 0
        self.gone: set[int] = set()  # ids of sinks whose reader went away
        # The live status line (see ``status``), drawn last on stderr: erased
        # before anything else is written to the console, drawn again after.
        # The pump thread writes and the supervisor's thread notes: one lock.
        self.live: bytes | None = None
        self.lock = threading.RLock()

    def can_show_status(self) -> bool:
        """Whether a live line can be redrawn in place: stderr is a terminal
        that understands the erase sequence."""
        try:
            return self.err.isatty() and os.environ.get("TERM", "") != "dumb"
        except (OSError, ValueError, AttributeError):
            return False

    def status(self, line: str | None) -> None:
        """Draw ``line`` as the live status line in place of the last one;
        None erases it.  Only on a terminal (``can_show_status``)."""
        with self.lock:
            if line is None:
                if self.live is not None:
                    self.live = None
                    self._emit(self.err, ERASE_LINE)
                return
            self.live = self._fit(line).encode(errors="replace")
            self._emit(self.err, ERASE_LINE + self.live)

    def _fit(self, line: str) -> str:
        """Cut to the terminal's width: a line that wraps cannot be redrawn."""
        try:
            width = os.get_terminal_size(self.err.fileno()).columns
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            width = 0
        width = width or 80  # a terminal that never said its size (a bare pty)
        return line[: max(width - 1, 1)]

    def shows(self, rank: int) -> bool:
        """Whether this process's output is shown live."""
        return self.mode == "stream" and (self.ranks is None or rank in self.ranks)

    def _visible(self, rank: int, stream: Stream, line: bytes) -> list[bytes]:
        """The lines the console shows for this one: stack dumps, flight
        blocks and noise stay in the log files, the summary points at them;
        a traceback is folded (``tracebacks``)."""
        if stream is Stream.STDERR:
            shown = self._hidden(rank, line)
            if shown is None:
                return []
            return [shown] if self.tracebacks is None else self.tracebacks.feed(rank, shown)
        kept = without_noise(line) if is_noise(line) else line
        return [] if kept is None else [kept]

    def _hidden(self, rank: int, line: bytes) -> bytes | None:
        """A line of stderr, or None where it is a dump's, a flight block's,
        an engine's note, a fatal-error page's, a check's diagnosis or noise."""
        if stacks.DUMP_HEAD.match(line):
            self.in_dump.add(rank)
            return None
        if rank in self.in_dump:
            if stacks.DUMP_BODY.match(line):
                return None
            self.in_dump.discard(rank)
        if self.pages.hides(rank, line):
            return None
        if line.startswith(_DIAGNOSIS_HEAD):
            self.judged.add(rank)
            return None
        if rank in self.judged and line.startswith(b"jaxrun: "):
            return None
        if line.startswith(_FLIGHT_MARK) and _FLIGHT_LINE.match(line):
            return None
        if contract.parse_engine_note(line.decode(errors="replace")):
            return None
        return without_noise(line) if is_noise(line) else line

    def render(self, rank: int, stream: Stream, data: bytes, prefix: bytes = b"") -> bytes:
        """Complete lines (or a final partial one) as the console shows them.

        With a prefix, the result starts without it and ends with it: the
        caller writes the prefix first and drops the trailing one, which saves
        copying a whole chunk twice more under a flood.
        """
        if not data.endswith(b"\n"):
            data += b"\n"
        folding = stream is Stream.STDERR and self.tracebacks is not None and self.tracebacks.active(rank)
        quiet = rank not in self.in_dump and not folding and rank not in self.pages.inside and rank not in self.judged
        if self.show_noise or (quiet and not any(m in data for m in _HIDDEN_MARKS[stream])):
            # The common case, done in C: prefix every line of the chunk at once.
            return data.replace(b"\n", b"\n" + prefix) if prefix else data
        kept = [shown for line in data.splitlines(keepends=True) for shown in self._visible(rank, stream, line)]
        return b"".join(line + prefix for line in kept) if prefix else b"".join(kept)

    def write(self, rank: int, stream: Stream, data: bytes) -> None:
        """Live output (stream mode): every line prefixed with its rank."""
        if not self.shows(rank):
            return
        prefix = f"[{rank}] ".encode()
        if self.timestamps:
            now = time.time()
            prefix = time.strftime("%H:%M:%S", time.localtime(now)).encode() + b".%03d " % (now % 1 * 1000) + prefix
        text = self.render(rank, stream, data, prefix)
        if text:
            with self.lock:
                pending = self.pending[stream]
                pending.append(prefix)
                pending.append(memoryview(text)[: -len(prefix)])
                self.pending_bytes += len(text)
                if self.pending_bytes > FLUSH_AT:
                    self.flush()

    def flush(self, extra: bytes = b"") -> None:
        """Write what ``write`` gathered: the pump calls this once a round, so
        a round costs one write per console stream, not two per chunk.
        ``extra`` goes to stderr after it, before the live line is redrawn."""
        with self.lock:
            chunks = [(sink, b"".join(self.pending[stream])) for stream, sink in
                      ((Stream.STDOUT, self.out), (Stream.STDERR, self.err)) if self.pending[stream]]
            if extra:
                chunks.append((self.err, extra))
            for pending in self.pending.values():
                pending.clear()
            self.pending_bytes = 0
            if not chunks:
                return
            if self.live is not None:
                self._emit(self.err, ERASE_LINE)
            for sink, data in chunks:
                self._emit(sink, data)
            if self.live is not None:
                self._emit(self.err, self.live)

    def note(self, line: str) -> None:
        """One line of jaxrun's own, on stderr at once, after what is pending."""
        self.flush(line.encode(errors="replace") + b"\n")

    def _emit(self, sink: BinaryIO, data: bytes) -> None:
        if id(sink) in self.gone:
            return
        try:
            sink.write(data)
            sink.flush()
        except (OSError, ValueError):  # BrokenPipeError above all; ValueError: closed
            self.gone.add(id(sink))
            silence(sink)

    def grouped(self, rank: int, stdout_path: str, stderr_path: str) -> None:
        """Print one process's whole output, as the bash loop's final ``cat`` does."""
        if self.mode != "grouped" or (self.ranks is not None and rank not in self.ranks):
            return
        head, tail = self.group_markers or (
            lambda r: f"=================== process {r} output ===================",
            "",
        )
        self._emit(self.out, head(rank).encode() + b"\n")
        for path, sink, stream in ((stdout_path, self.out, Stream.STDOUT), (stderr_path, self.err, Stream.STDERR)):
            # The guarded reader: a log swapped for a FIFO or a symlink is not
            # followed; a chunk at a time, however long the log.
            f = contract.open_regular(path)
            if f is None:
                continue  # never written (the process did not start); the summary says why
            try:
                with f:
                    for chunk in read_lines_in_chunks(f):
                        self._emit(sink, self.render(rank, stream, chunk))
            except OSError:
                pass
        self._emit(self.out, tail.encode() + b"\n")


def silence(stream) -> None:
    """Point a console stream whose reader went away at /dev/null, so that
    later writes (and the interpreter's flush at exit) succeed quietly."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, io.UnsupportedOperation):
        return
    os.dup2(devnull, fd)
    os.close(devnull)


class SafeConsole(io.TextIOBase):
    """jaxrun's own text lines: a console that went away is silenced, never
    an error (the job and its logs do not depend on it)."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            self.stream.write(text)
        except (OSError, ValueError):
            silence(self.stream)
        return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            silence(self.stream)

    def fileno(self) -> int:
        return self.stream.fileno()
