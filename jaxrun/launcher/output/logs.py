"""``jaxrun logs``: a finished run's output, as the console showed it or
grouped per process, and the list of recent runs with their exit status;
``--trace FILE``: a run's timeline (``reporting.timeline``) as a Chrome trace.

What torchrun and Slurm users reach for after a run (``sacct``, ``cat
slurm-*.out``).  The runs are found from their ``run.json``
(:mod:`jaxrun.reporting.history`).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex

import click

from jaxrun import contract
from jaxrun.core import logfiles
from jaxrun.core.events import Stream
from jaxrun.core.noise import read_lines_in_chunks
from jaxrun.core.ranks import parse_ranks
from jaxrun.launcher.output.printer import ConsolePrinter
from jaxrun.reporting import timeline
from jaxrun.reporting.history import foreign, ranks_in, runs

LISTED = 20  # runs shown by a bare ``jaxrun logs``


def show(folder: str, ranks: list[int], output: str) -> None:
    """The logs as the console shows them: rank-prefixed lines (one process
    after another: their interleaving in time is not recorded), or blocks."""
    printer = ConsolePrinter(output, fold=False)  # stdout to stdout, stderr to stderr, as live; tracebacks whole
    every_life = ((rank, life, paths) for rank in ranks for life, paths in enumerate(logfiles.life_paths(folder, rank)))
    for rank, life, (out, err, _) in every_life:
        if life:  # a recoverable job's process that started again alone: each life apart
            click.echo(f"jaxrun: process {rank}, life {life + 1} (started again alone):")
        if output == "grouped":
            printer.grouped(rank, out, err)
            continue
        for path, stream in ((out, Stream.STDOUT), (err, Stream.STDERR)):
            f = contract.open_regular(path)  # never a FIFO or a link in a log's place
            if f is None:
                continue
            try:
                with f:
                    for chunk in read_lines_in_chunks(f):
                        printer.write(rank, stream, chunk)
            except OSError:
                pass
        printer.flush()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_id", required=False)
@click.option("--last", is_flag=True, help="The most recent run.")
@click.option("--ranks", metavar="RANKS", help="Only these processes, e.g. 0 or 0,2-3.")
@click.option("--output", type=click.Choice(["grouped", "stream"]), default="grouped", show_default=True,
              help="One block per process, or rank-prefixed lines.")
@click.option("--log-dir", "base", metavar="DIR", help="Where runs are (default: your private log folder).")
@click.option("--trace", "trace", metavar="FILE",
              help="Write the run's timeline (the last run's, running or not, without RUN_ID) to FILE as a "
                   "Chrome trace, which ui.perfetto.dev opens.")
def command(run_id, last, ranks, output, base, trace):
    """Show a finished run's logs, or list recent runs.

    \b
      jaxrun logs                    recent runs, newest first, with exit status
      jaxrun logs --last             the last run's output, grouped per process
      jaxrun logs RUN_ID --ranks 0   one process of that run
      jaxrun logs --trace t.json     the last run's timeline, for ui.perfetto.dev
    """
    if not base:
        base = logfiles.default_base()
        if os.path.lexists(base) and not contract.ours_alone(base):  # another user made the usual name first
            click.echo(f"jaxrun: {base} is not yours alone (another user made it first?): only runs of yours in it "
                       "are shown", err=True)
    if trace:
        write_trace(base, run_id, trace)
        return
    skipped: list[str] = []
    found = runs(base, skipped)
    for line in skipped:
        click.echo(line, err=True)
    if not run_id and not last:
        if not found:
            click.echo(f"jaxrun: no finished runs in {base}")
            return
        for folder, record in found[:LISTED]:
            when = datetime.datetime.fromtimestamp(record.get("started", 0)).strftime("%Y-%m-%d %H:%M:%S")
            click.echo(f"{os.path.basename(folder)}  exit {record.get('exit_code')}  {when}  "
                       f"{shlex.join(record.get('argv', []))}")
        return
    if last:
        if not found:
            raise click.UsageError(f"no finished runs in {base}")
        folder = found[0][0]
    else:
        folder = own_run(base, run_id)
    present = ranks_in(folder)
    try:
        chosen = parse_ranks(ranks) if ranks else None
    except ValueError:
        raise click.BadParameter(f"{ranks!r} is not a list of ranks like 0 or 0,2-3 (or all, or none)",
                                 param_hint="'--ranks'") from None
    wanted = [r for r in present if chosen is None or any(r in span for span in chosen)]
    show(folder, wanted, output)
    show_probe(folder)


def show_probe(folder: str) -> None:
    """The probe's table, where the run had one (`jaxrun probe`, --probe)."""
    data = contract.read_small(os.path.join(folder, logfiles.PROBE_TABLE), 1 << 20)
    if data:
        click.echo("jaxrun: the probe's table (probe.json holds its figures):")
        click.echo(data.decode(errors="replace").rstrip("\n"))


def write_trace(base: str, run_id: str | None, path: str) -> None:
    """The run's timeline as a Chrome trace at ``path``; without a run id,
    the run that began last, finished or still running."""
    if run_id:
        folder = own_run(base, run_id)
    else:
        folder = newest_timeline(base)
        if folder is None:
            fail(f"no run in {base} has a timeline ({timeline.FILE})")
    events = timeline.read(os.path.join(folder, timeline.FILE))
    if events is None:
        fail(f"run {os.path.basename(folder)} has no timeline ({timeline.FILE}): it ran before jaxrun kept one")
    trace = timeline.chrome_trace(events)
    try:
        logfiles.write_atomically(path, json.dumps(trace).encode())
    except OSError as e:
        fail(f"--trace {path}: cannot write it ({e.strerror or e})")
    processes = {e["pid"] for e in trace["traceEvents"] if e["pid"] != timeline.JOB_PID}
    attempts = sum(1 for e in events if e["event"] == timeline.ATTEMPT)
    click.echo(f"jaxrun: wrote the timeline of run {os.path.basename(folder)} ({len(processes)} processes, "
               f"{attempts} attempt{'s' if attempts != 1 else ''}) to {path}; open it at https://ui.perfetto.dev "
               "(Open trace file) or in chrome://tracing")


def own_run(base: str, run_id: str) -> str:
    """Run ``run_id``'s folder in ``base``, where it is this user's."""
    folder = os.path.join(base, run_id)
    if not os.path.isdir(folder):
        raise click.UsageError(f"no run {run_id!r} in {base}")
    why = foreign(folder)
    if why:
        fail(f"run {run_id} in {base} is not shown: {why}")
    return folder


def newest_timeline(base: str) -> str | None:
    try:
        names = [name for name in os.listdir(base) if foreign(os.path.join(base, name)) is None]
    except OSError:
        return None
    began = {name: timeline.began(os.path.join(base, name, timeline.FILE)) for name in names}
    found = [(when, name) for name, when in began.items() if when is not None]
    return os.path.join(base, max(found)[1]) if found else None


def fail(line: str) -> None:
    """One line, exit 1: the run is there, what was asked of it is not."""
    click.echo(f"jaxrun: error: {line}", err=True)
    raise click.exceptions.Exit(1)
