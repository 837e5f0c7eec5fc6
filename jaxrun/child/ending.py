"""How a controller ends when something went wrong: at once, with a record.

A process that waited for a normal interpreter exit would sit in JAX's
shutdown barrier (up to 300 s) for peers that may be stuck in a collective
with it.  So on an uncaught exception or a non-zero exit the shim leaves at
once, after flushing, and leaves an error record for the run summary.
"""

from __future__ import annotations

import os
import sys

from jaxrun import contract


def exit_now(code: int) -> None:
    """Flush and leave without running atexit hooks (JAX's shutdown barrier)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def record_error(exc: BaseException, text: str) -> None:
    path = os.environ.get(contract.ERROR_FILE)
    if path:
        contract.ErrorRecord.of(exc, text).dump(path)


def fail(exc: BaseException) -> None:
    """jaxrun's own reason to stop this process: one line, a record, exit 1."""
    print(f"jaxrun: {exc}", file=sys.stderr)
    record_error(exc, f"{type(exc).__name__}: {exc}\n")
    exit_now(1)


def judged(error: BaseException, text: str, record: str) -> None:
    """A check's stop: its lines (``text``) on stderr under the head that
    keeps every process's copy off the console (the summary shows the root
    cause's, from ``record``, once for the job), the record, exit 1."""
    sys.stderr.write(f"{contract.DIAGNOSIS_HEAD}\n{text}")
    record_error(error, record)
    exit_now(1)
