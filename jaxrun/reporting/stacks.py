"""Reading Python tracebacks and faulthandler stack dumps out of log text.

One set of patterns for every reader: the console hides dumps, the summary
and JUnit show where each process was, the GitHub annotation links the
innermost frame of the user's own code.  The patterns read text; the logs are
read once, by ``reporting.diagnosis``, through the contract's guarded reader.
"""

from __future__ import annotations

import linecache
import os
import re

from jaxrun import contract

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


Frame = tuple[str, int, str, str]  # (file, line, function, source text)


# The main thread's outermost frame where the interpreter ran a module
# (``python -m``: every way jaxrun starts a controller): a dump's main-thread
# block that reaches it is whole.
_ENTRY_FRAME = re.compile(r'^  File "[^"]*runpy[^"]*", line \d+ in _run_module_as_main$')


def dump_complete(text: str) -> bool:
    """Whether the last faulthandler dump in ``text`` has its main thread's
    block whole: down to the interpreter's entry frame, or followed by another
    thread's block.  False for none, for one still being written, and for one
    of another shape (cut at faulthandler's 100 frames, or a controller not
    started by ``python -m``): the reader then waits its full time."""
    start = text.rfind("Current thread 0x")
    if start < 0:
        return False
    for line in text[start:].splitlines(keepends=True)[1:]:
        if not line.endswith("\n"):
            return False  # the last line, still being written
        if _ENTRY_FRAME.match(line.rstrip("\n")):
            return True
        if THREAD.match(line) or not line.strip():
            return True
    return False


def user_frame(text: str) -> Frame | None:
    """From the last faulthandler dump in ``text``: the main thread's innermost
    frame in the user's own code, with its source line (read from the file).
    A fatal error's dump (a runtime thread aborted: Gloo's size mismatch) has
    the main thread among the other threads: the block that reaches the
    interpreter's entry frame."""
    start, fatal = text.rfind("Current thread 0x"), text.rfind("Fatal Python error:")
    if fatal > start:  # the thread that aborted runs no Python: no "Current thread" block
        return _block_frame(text, _fatal_main(text, fatal))
    if start < 0:
        return None
    head = text.rfind("Fatal Python error:", 0, start)  # a Python thread aborted: the main one may be another
    return _block_frame(text, start) or _block_frame(text, _fatal_main(text, head))


def last_place(text: str) -> Frame | None:
    """Where a process was when it ended: the innermost frame of the user's
    code in its last traceback or its last stack dump, whichever came later
    (a dump asked for before the process raised is an older place).  A dump
    after a traceback that holds none of the user's frames (the process in
    jaxrun's ending of that exception) leaves the traceback's, unless it
    found the process past its script, in JAX's shutdown."""
    tb = text.rfind(TRACEBACK_HEAD)
    dump = max(text.rfind("Current thread 0x"), text.rfind("Fatal Python error:"))
    if tb > dump:
        return traceback_frame(text[tb:])
    frame = user_frame(text)
    if frame is None and tb >= 0 and dumped_state(text) != contract.IN_SHUTDOWN:
        return traceback_frame(text[tb:dump])
    return frame


TRACEBACK_HEAD = "Traceback (most recent call last):"


def traceback_frame(text: str) -> Frame | None:
    """The innermost frame of the user's code in a traceback, with its source line."""
    found = None
    for m in FRAME.finditer(text):
        if is_user_file(m["file"]):
            found = m
    if found is None:
        return None
    file, line = found["file"], int(found["line"])
    return file, line, found["func"], linecache.getline(file, line).strip()


def _fatal_main(text: str, head: int) -> int:
    """Where the main thread's block starts in the fatal error's dump that
    begins at ``head`` (-1: none)."""
    if head < 0:
        return -1
    for m in _THREAD_LINE.finditer(text, head):
        end = text.find("\n\n", m.end())
        block = text[m.start():end if end >= 0 else len(text)]
        if any(_ENTRY_FRAME.match(line) for line in block.splitlines()):
            return m.start()
    return -1


_THREAD_LINE = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+", re.M)


def _block_frame(text: str, start: int) -> Frame | None:
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


# JAX's own files: a main thread whose innermost frame is one of them waits
# inside JAX (a collective, a result), not in the user's code.
_JAX_PARTS = (os.sep + "jax" + os.sep, os.sep + "jaxlib" + os.sep)


def waits_inside_jax(text: str) -> bool:
    """Whether the last faulthandler dump in ``text`` found the main thread
    with JAX's own frame innermost."""
    start = text.rfind("Current thread 0x")
    if start < 0:
        return False
    for line in text[start:].splitlines()[1:]:
        m = FRAME.match(line)
        if m:
            return any(part in m["file"] for part in _JAX_PARTS)
        if THREAD.match(line) or not line.strip():
            break
    return False


def raised_at(traceback_text: str) -> tuple[str, int] | None:
    """From a traceback (most recent call last): the innermost frame in the
    user's own code, as (file, line)."""
    found = None
    for m in FRAME.finditer(traceback_text):
        if is_user_file(m["file"]):
            found = m["file"], int(m["line"])
    return found


# The shim's frames that run the script (its lifeline thread's frame is in
# the same file), and the file of JAX's shutdown barrier.
_SHIM_FILE = "/jaxrun/child/shim.py"
_SCRIPT_RUNNERS = ("run_target", "run_script", "run_module")
_JAX_SHUTDOWN_FILE = "/jax/_src/distributed.py"
# jaxrun's own exit hook, run just before JAX's shutdown: the strict checks'
# board waits there for its peers' last entries (a process that finished the
# script while another runs on waits in it first).
_SETTLE = ("/jaxrun/child/checks/agreement.py", "settle")


def in_shutdown(file: str, func: str) -> bool:
    """Whether a frame is the exit's wait for the other processes: JAX's
    shutdown, or the checks' settle before it."""
    return file.endswith(_JAX_SHUTDOWN_FILE) or (file.endswith(_SETTLE[0]) and func == _SETTLE[1])


def runs_the_script(file: str, func: str) -> bool:
    """Whether a dumped frame is the shim's, running the script: the frames
    above it are the user's."""
    return file.endswith(_SHIM_FILE) and func in _SCRIPT_RUNNERS


def dumped_state(text: str) -> str | None:
    """Where the last faulthandler dump in ``text`` found the main thread:
    inside the shim's run of the script, or past it, in JAX's shutdown (or
    the checks' settle, just before it);
    None when the dump shows neither (or there is none)."""
    start = text.rfind("Current thread 0x")
    if start < 0:
        return None
    frames = []
    for line in text[start:].splitlines()[1:]:
        if THREAD.match(line) or not line.strip():
            break
        m = FRAME.match(line)
        if m:
            frames.append((m["file"], m["func"]))
    if any(runs_the_script(file, func) for file, func in frames):
        return contract.IN_SCRIPT
    if any(in_shutdown(file, func) for file, func in frames):
        return contract.IN_SHUTDOWN
    return None


def has_traceback(text: str) -> bool:
    """Whether an error record's text is a traceback (a Python one, or a
    pytest report's, which ends at FILE:LINE: ...), and not only a check's
    lines or jaxrun's one line: the log it was written to then holds one."""
    return TRACEBACK_HEAD in text or bool(PYTEST_LOCATION.search(text))


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
