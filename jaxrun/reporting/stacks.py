"""Reading Python tracebacks and faulthandler stack dumps out of log text.

One set of patterns for every reader: the console hides dumps, the summary
and JUnit show where each process was, the GitHub annotation links the
innermost frame of the user's own code.
"""

from __future__ import annotations

import linecache
import os
import re
import stat

# A frame line, in a traceback (`File "f", line 3, in g`) or in a
# faulthandler dump (`File "f", line 3 in g`).
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)', re.M)
# The location line that ends a pytest failure report: `path.py:12: Error`.
PYTEST_LOCATION = re.compile(r"^(?P<file>[^\s:][^:\n]*\.py):(?P<line>\d+): \w", re.M)
# A faulthandler dump: a thread header, then frame lines and blank lines.
THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
DUMP_HEAD = re.compile(rb"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
# (faulthandler writes "  Garbage-collecting" above the frames when the GC was running.)
DUMP_BODY = re.compile(rb"^(  File \"|  <no Python frame>|  Garbage-collecting|\s*$)")

_LIBRARY_PARTS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_INSTALLED = re.compile(r"(^|/)(site-packages|dist-packages|\.venv|venv)/")
# How much of the end of a log the stack-dump reader looks at.  A dump is the
# last thing a stopped process writes, and even one of a hundred threads at
# faulthandler's hundred frames each fits; a log may be many gigabytes.
DUMP_TAIL = 1 << 20

# jaxrun's own package folder (not any folder that happens to be called jaxrun,
# such as a checkout of this repository holding the user's script).
_OWN_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def is_user_file(path: str) -> bool:
    return (
        not path.startswith(("<", _OWN_PACKAGE))
        and not any(p in path for p in _LIBRARY_PARTS)
        and "/lib/python" not in path
    )


def read_tail(path: str, size: int) -> bytes | None:
    """The last ``size`` bytes of a log file (all of a shorter one); None if it
    cannot be read.  Reports read logs only through this or ``read_small``,
    so a huge log costs neither memory nor time."""
    return _read_regular(path, size, from_end=True)


def read_small(path: str, limit: int) -> bytes | None:
    """A whole file of at most ``limit`` bytes; None if it is larger or cannot be read."""
    data = _read_regular(path, limit + 1, from_end=False)
    return None if data is None or len(data) > limit else data


def _read_regular(path: str, size: int, from_end: bool) -> bytes | None:
    # Only a regular file is read, and never through a symlink: a FIFO or a
    # device put in a log's place can neither block the report nor fill it.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            if from_end:
                f.seek(max(0, st.st_size - size))
            return f.read(size)
        except OSError:
            return None


def innermost_user_frame(stderr_path: str) -> tuple[str, int, str, str] | None:
    """From the last faulthandler dump in a log: the main thread's innermost frame
    in the user's own code, as (file, line, function, source text).  Only the
    log's last DUMP_TAIL bytes are read."""
    data = read_tail(stderr_path, DUMP_TAIL)
    if data is None:
        return None
    text = data.decode("utf-8", "replace")
    start = text.rfind("Current thread 0x")
    if start < 0:
        return None
    for line in text[start:].splitlines()[1:]:
        if THREAD.match(line) or not line.strip():
            break
        m = FRAME.match(line)
        if m and is_user_file(m["file"]):
            source = linecache.getline(m["file"], int(m["line"])).strip()
            return m["file"], int(m["line"]), m["func"], source
    return None


def user_location(traceback_text: str, workspace: str | None) -> tuple[str, int] | None:
    """The innermost frame inside the checkout ``workspace``, as a relative
    path.  Installed packages do not count."""
    if not workspace:
        return None
    hits = list(FRAME.finditer(traceback_text)) + list(PYTEST_LOCATION.finditer(traceback_text))
    for m in sorted(hits, key=lambda m: m.start(), reverse=True):
        rel = os.path.relpath(os.path.abspath(m["file"]), workspace)
        if not rel.startswith("..") and not _INSTALLED.search(rel):
            return rel, int(m["line"])
    return None
