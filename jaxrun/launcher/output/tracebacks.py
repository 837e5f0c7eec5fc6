"""The console's view of a Python traceback on a process's stderr: the
frames of installed libraries and of Python's own (JAX's, above all) folded
into one line, a long message capped, and a traceback that another process
showed already (every process's ``device_put`` of its own data fails alike)
said in one line.  A lost peer's traceback (Gloo's closed connection, the
coordination service gone: ``core.causes.LOST_PEER``) is a consequence of
another process's end, and goes with JAX's fatal-error pages (``lost``).  The
log keeps every byte, and each fold names it; ``-v`` shows the traceback whole.

Pure: lines in, the lines the console shows out, one ``TracebackFold`` per
console (one attempt).  A traceback is held until its exception line comes
(Python writes it at once); a process that dies in the middle of one leaves
the rest to its log.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from jaxrun.core.causes import LOST_PEER
from jaxrun.reporting.stacks import is_user_file

HEAD = b"Traceback (most recent call last):"
_FRAME = re.compile(rb'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in ')
_PACKAGE = re.compile(r"/(?:site|dist)-packages/([^/]+)")
MESSAGE_LINES = 3  # lines of an exception's message shown after its first
LINE_WIDTH = 400  # characters of the exception's line shown


def _library(path: str) -> str:
    """What a frame that is not the user's belongs to: its package's name."""
    found = _PACKAGE.search(path)
    if found:
        return found.group(1).removesuffix(".py")
    return "jaxrun" if "/jaxrun/" in path else "Python"


class _Reading:
    """One traceback, read up to its exception line: what will be shown of it."""

    def __init__(self) -> None:
        self.shown: list[bytes] = [HEAD + b"\n"]
        self.user: list[tuple[str, int]] = []  # the user's frames, outermost first
        self.folded = 0  # library frames in the run being folded
        self.libraries: dict[str, None] = {}
        self.in_library = False  # the last frame line was a library's: its source lines go too
        self.lines = 1  # the lines read of it

    def frame(self, file: str, line: int, text: bytes) -> None:
        self.lines += 1
        self.in_library = not is_user_file(file)
        if self.in_library:
            self.folded += 1
            self.libraries.setdefault(_library(file))
            return
        self.close_fold()
        self.user.append((file, line))
        self.shown.append(text)

    def body(self, text: bytes) -> None:
        """A source line, or the markers under it, of the last frame."""
        self.lines += 1
        if not self.in_library:
            self.shown.append(text)

    def close_fold(self) -> None:
        if self.folded:
            frames = "frame" if self.folded == 1 else "frames"
            self.shown.append(f"  ... {self.folded} {frames} of {', '.join(self.libraries)}\n".encode())
            self.folded, self.libraries = 0, {}


class TracebackFold:
    """``log_of(rank)``: the log that holds a process's stderr whole;
    ``lost(rank, lines)``: told of a lost peer's traceback, which is not shown
    (None: shown as any other)."""

    def __init__(self, log_of: Callable[[int], str], lost: Callable[[int, int], None] | None = None):
        self.log_of = log_of
        self.lost = lost
        self.reading: dict[int, _Reading] = {}
        self.message: dict[int, int] = {}  # rank -> the message's lines still shown (-1: said where the rest is)
        self.seen: dict[tuple, int] = {}  # (exception type, the user's frames) -> the process that showed it

    def active(self, rank: int) -> bool:
        """Whether the process's stderr is inside a traceback, or its message."""
        return rank in self.reading or rank in self.message

    def feed(self, rank: int, line: bytes) -> list[bytes]:
        """One line (with its newline) of a process's stderr; what to show."""
        bare = line.rstrip(b"\r\n")
        reading = self.reading.get(rank)
        if reading is not None:
            if not bare:  # no traceback after all: what was held, as it came
                del self.reading[rank]
                reading.close_fold()
                return [*reading.shown, line]
            if bare.startswith(b" "):
                found = _FRAME.match(bare)
                if found:
                    reading.frame(found["file"].decode(errors="replace"), int(found["line"]), line)
                else:
                    reading.body(line)
                return []
            del self.reading[rank]
            return self._raised(rank, reading, bare)
        if rank in self.message:
            if bare.startswith((b" ", b"\t")):
                left = self.message[rank]
                if left > 0:
                    self.message[rank] = left - 1
                    return [line]
                if left == 0:
                    self.message[rank] = -1
                    return [f"  ... (the rest of the message is in {self.log_of(rank)})\n".encode()]
                return []
            del self.message[rank]
        if bare == HEAD:
            self.reading[rank] = _Reading()
            return []
        return [line]

    def _raised(self, rank: int, reading: _Reading, bare: bytes) -> list[bytes]:
        """The exception's line ends the frames: the traceback as shown, or
        one line where another process showed the same one."""
        reading.close_fold()
        if self.lost is not None and LOST_PEER.search(bare.decode(errors="replace")):
            self.lost(rank, reading.lines + 1)
            self.message[rank] = -1
            return []
        kind = bare.split(b":", 1)[0].decode(errors="replace")
        key = (kind, tuple(reading.user))
        first = self.seen.setdefault(key, rank)
        where = f" at {reading.user[-1][0]}:{reading.user[-1][1]}" if reading.user else ""
        if first != rank:
            self.message[rank] = -1
            return [f"{kind}{where}, as process {first}'s above (its traceback: {self.log_of(rank)})\n".encode()]
        if len(bare) > LINE_WIDTH:
            self.message[rank] = -1
            return [*reading.shown, bare[:LINE_WIDTH] + b" [...]\n",
                    f"  ... (the whole message is in {self.log_of(rank)})\n".encode()]
        self.message[rank] = MESSAGE_LINES
        return [*reading.shown, bare + b"\n"]
