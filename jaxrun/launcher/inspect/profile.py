"""``jaxrun profile``: a trace of every process of a running job, as one XProf session.

The job does the work (``AskProfile``): every process traces itself with
``jax.profiler`` for ``--seconds``, the traces come home (over SSH, from
each host) and are moved into one session of the run's log folder, a host
name per process.  This side waits for that, then prints where the session
is and the one command that opens it.
"""

from __future__ import annotations

import click

from jaxrun import contract
from jaxrun.launcher.inspect import find
from jaxrun.wire import inspect as words

DEFAULT_SECONDS = 5.0
LONGEST = 300.0  # the job refuses a longer trace


def lines(run_id: str, taken: words.ProfileTaken) -> list[str]:
    return contract.session_lines("jaxrun:", f"run {run_id}: ", taken.parts, taken.folder, taken.command)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@find.run_option
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True, max=LONGEST), default=DEFAULT_SECONDS,
              show_default=True, metavar="SECONDS", help="How long every process traces.")
def command(run_id, seconds):
    """Trace every process of a running job with jax.profiler, into one XProf session in its log folder.

    \b
      jaxrun profile                   the newest job you started, 5 s
      jaxrun profile --seconds 20 --run RUN_ID
    """
    wait = seconds + 2 * words.TRACE_SETTLE_WAIT + 10  # the job bounds its own wait: this is for a lost job
    _, info, answer = find.asked(run_id, words.AskProfile(seconds), timeout=wait)
    if not isinstance(answer, words.ProfileTaken):
        find.fail(f"run {info.run_id} answered {answer.WORD!r}, not a profile")
    for line in lines(info.run_id, answer):
        print(line, flush=True)
    if not any(part.files for part in answer.parts):
        raise SystemExit(1)
