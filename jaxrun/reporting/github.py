"""GitHub Actions rendering: one collapsible group per process, and the root
cause as an ``::error`` annotation.

GitHub reads "workflow commands" from a step's output: ``::group::TITLE`` …
``::endgroup::`` fold lines, and ``::error title=T,file=F,line=N::MESSAGE``
puts a red annotation on the run page (and on the file, in a pull request).
Only the text format lives here; the run loop decides when to print it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from jaxrun.core.outcome import Outcome, StopReason
from jaxrun.reporting import summary
from jaxrun.reporting.stacks import innermost_user_frame, user_location

# (header for a rank, footer) in the shape ConsolePrinter's group_markers expects.
GROUP_MARKERS = (lambda rank: f"::group::process {rank}", "::endgroup::")


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
    failure = summary.engine_failure(outcome)
    if outcome.start_error is not None:
        title, message, location = "jaxrun: the restart did not start", outcome.start_error, None
    elif failure is not None:
        title = f"jaxrun: {failure.note.engine} failed first"
        message = "\n".join([failure.headline, *summary.tail(failure.note.log)])
        location = None
    elif outcome.root_cause is not None:
        rec = outcome.records[outcome.root_cause]
        title = f"jaxrun: {summary.where(rec)} failed first ({summary.describe_exit(rec)})"
        err = summary.error_info(rec)
        if err:
            message = err.headline
            location = user_location(err.traceback, workspace)
        else:
            message = "\n".join(summary.last_output(rec)[1]) or title
            location = None
    elif outcome.reason is StopReason.TIMEOUT:
        title = "jaxrun: --timeout expired"
        frames = []
        for rec in outcome.records:
            frame = innermost_user_frame(rec.stderr_log)
            if frame:
                frames.append(f"{summary.where(rec)} was at {frame[0]}:{frame[1]} in {frame[2]}")
        message = "\n".join(frames) or "every process was still running; stack dumps are in the logs"
        location = None
    else:
        return None
    props = [f"title={escape_property(title)}"]
    if location:
        props += [f"file={escape_property(location[0])}", f"line={location[1]}"]
    return f"::error {','.join(props)}::{escape_data(message)}"
