"""GitHub Actions rendering: one collapsible group per process, and the root
cause as an ``::error`` annotation.

GitHub reads "workflow commands" from a step's output: ``::group::TITLE`` …
``::endgroup::`` fold lines, and ``::error title=T,file=F,line=N::MESSAGE``
puts a red annotation on the run page (and on the file, in a pull request).
Only the text format lives here; ``launch`` decides when to print it.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Mapping

from jaxrun import report
from jaxrun.supervisor import Outcome, StopReason

# (header for a rank, footer) in the shape ConsolePrinter's group_markers expects.
GROUP_MARKERS = (lambda rank: f"::group::process {rank}", "::endgroup::")

# A frame in a Python traceback, and the location line that ends a pytest failure.
_PY_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.M)
_PYTEST_LOCATION = re.compile(r"^(?P<file>[^\s:][^:\n]*\.py):(?P<line>\d+): \w", re.M)
_INSTALLED = re.compile(r"(^|/)(site-packages|dist-packages|\.venv|venv)/")


def printer_options() -> dict:
    """ConsolePrinter arguments for Actions: group markers, and one stream for
    everything.  GitHub reads stdout and stderr through separate pipes, so lines
    racing between the two could land outside their group."""
    return {"stdout": sys.stderr.buffer, "stderr": sys.stderr.buffer, "group_markers": GROUP_MARKERS}


def on_github_actions(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("GITHUB_ACTIONS") == "true"


def escape_data(text: str) -> str:
    """A command's message may not hold raw newlines; GitHub decodes these escapes."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def error_annotation(outcome: Outcome, workspace: str | None = None) -> str | None:
    """The ``::error`` line for a failed or timed-out run; None when there is nothing to flag."""
    if outcome.root_cause is not None:
        rec = outcome.records[outcome.root_cause]
        title = f"jaxrun: {report.where(rec)} failed first ({report.describe_exit(rec)})"
        err = report.error_info(rec)
        if err:
            message = f"{err['type']}: {err['message']}"
            location = user_location(err.get("traceback", ""), workspace)
        else:
            message = "\n".join(report.tail(rec.stderr_log) or report.tail(rec.stdout_log)) or title
            location = None
    elif outcome.reason is StopReason.TIMEOUT:
        title = "jaxrun: --timeout expired"
        frames = []
        for rec in outcome.records:
            frame = report.innermost_user_frame(rec.stderr_log)
            if frame:
                frames.append(f"{report.where(rec)} was at {frame[0]}:{frame[1]} in {frame[2]}")
        message = "\n".join(frames) or "every process was still running; stack dumps are in the logs"
        location = None
    else:
        return None
    props = [f"title={escape_property(title)}"]
    if location:
        props += [f"file={escape_property(location[0])}", f"line={location[1]}"]
    return f"::error {','.join(props)}::{escape_data(message)}"


def user_location(traceback_text: str, workspace: str | None) -> tuple[str, int] | None:
    """The innermost frame inside the checkout (``GITHUB_WORKSPACE``), as a
    relative path GitHub can link to.  Installed packages do not count."""
    if not workspace:
        return None
    hits = list(_PY_FRAME.finditer(traceback_text)) + list(_PYTEST_LOCATION.finditer(traceback_text))
    for m in sorted(hits, key=lambda m: m.start(), reverse=True):
        rel = os.path.relpath(os.path.abspath(m["file"]), workspace)
        if not rel.startswith("..") and not _INSTALLED.search(rel):
            return rel, int(m["line"])
    return None
