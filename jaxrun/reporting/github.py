"""GitHub Actions rendering: one collapsible group per process, and the root
cause as an ``::error`` annotation.

GitHub reads "workflow commands" from a step's output: ``::group::TITLE`` …
``::endgroup::`` fold lines, and ``::error title=T,file=F,line=N::MESSAGE``
puts a red annotation on the run page (and on the file, in a pull request).
Only the text format lives here; the run loop decides when to print it.
"""

from __future__ import annotations

import sys

from jaxrun.core.outcome import Outcome
from jaxrun.reporting import diagnosis
from jaxrun.reporting.diagnosis import Kind, where
from jaxrun.reporting.stacks import user_location

# (header for a rank, footer) in the shape ConsolePrinter's group_markers expects.
GROUP_MARKERS = (lambda rank: f"::group::process {rank}", "::endgroup::")


def printer_options() -> dict:
    """ConsolePrinter arguments for Actions: group markers, and one stream for
    everything.  GitHub reads stdout and stderr through separate pipes, so lines
    racing between the two could land outside their group."""
    return {"stdout": sys.stderr.buffer, "stderr": sys.stderr.buffer, "group_markers": GROUP_MARKERS}


def escape_data(text: str) -> str:
    """A command's message may not hold raw newlines; GitHub decodes these escapes."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def error_annotation(outcome: Outcome, workspace: str | None = None) -> str | None:
    """The ``::error`` line for a failed or timed-out run; None when there is nothing to flag."""
    found = diagnosis.of(outcome)
    failure, root, location = found.engine, found.root, None
    if found.kind is Kind.START_ERROR:
        title, message = "jaxrun: the restart did not start", outcome.start_error
    elif found.kind is Kind.ENGINE_FAILURE:
        title = f"jaxrun: {failure.note.engine} failed first"
        message = "\n".join([failure.headline, *failure.log_tail])
    elif found.kind is Kind.PROCESS_FAILURE:
        title = f"jaxrun: {root.where} failed first ({root.exit})"
        if root.error:
            message = root.error.headline
            location = user_location(root.error.traceback, workspace)
        else:
            message = "\n".join(root.output) or title
    elif found.kind is Kind.SECOND_REGISTRATION:
        title = f"jaxrun: task {found.second_registration} registered a second time with the coordination service"
        message = "another process registered as it, and the service made every process of the job abort"
    elif found.kind is Kind.STALL:
        title, message = diagnosis.stall_lines(outcome.stall, outcome.records)
        title = f"jaxrun: {title}"
        place = outcome.stall.odd[0].place
        if place.file is not None:
            location = user_location(f'File "{place.file}", line {place.line}, in {place.func}', workspace)
    elif found.kind is Kind.TIMEOUT:
        title = "jaxrun: --timeout expired"
        frames = [f"{where(rec)} was at {facts.frame[0]}:{facts.frame[1]} in {facts.frame[2]}"
                  for rec, facts in zip(outcome.records, found.processes) if facts.frame]
        message = "\n".join(frames) or "every process was still running; stack dumps are in the logs"
    else:
        return None
    props = [f"title={escape_property(title)}"]
    if location:
        props += [f"file={escape_property(location[0])}", f"line={location[1]}"]
    return f"::error {','.join(props)}::{escape_data(message)}"
