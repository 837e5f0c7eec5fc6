"""``jaxrun logs``: a finished run's output, as the console showed it or
grouped per process, and the list of recent runs with their exit status.

What torchrun and Slurm users reach for after a run (``sacct``, ``cat
slurm-*.out``).  Every run leaves ``run.json`` in its log folder (written by
:func:`record_run` at the end); runs in the per-user default folder are
listed from there.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex

import click

from jaxrun.launcher import logfiles
from jaxrun.launcher.console import ConsolePrinter, read_lines_in_chunks
from jaxrun.launcher.events import Stream
from jaxrun.launcher.ranks import RankList

RECORD = "run.json"
LISTED = 20  # runs shown by a bare ``jaxrun logs``


def record_run(log_dir: str, argv: list[str], exit_code: int, started: float) -> None:
    """What ``jaxrun logs`` lists: written once the run is over (best effort)."""
    data = {"argv": argv, "exit_code": exit_code, "started": started, "ended": datetime.datetime.now().timestamp()}
    try:
        logfiles.write_atomically(os.path.join(log_dir, RECORD), json.dumps(data).encode())
    except OSError:
        pass


def runs(base: str) -> list[tuple[str, dict]]:
    """(folder, record) of each finished run under ``base``, newest first."""
    found = []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in names:
        path = os.path.join(base, name, RECORD)
        try:
            with open(path, encoding="utf-8") as f:
                found.append((os.path.join(base, name), json.load(f)))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda item: item[1].get("started", 0), reverse=True)


def ranks_in(folder: str) -> list[int]:
    ranks = set()
    for name in os.listdir(folder):
        head, _, tail = name.partition(".")
        if head.startswith("process-") and head[8:].isdigit() and tail in ("stdout", "stderr"):
            ranks.add(int(head[8:]))
    return sorted(ranks)


def show(folder: str, ranks: list[int], output: str) -> None:
    """The logs as the console shows them: rank-prefixed lines (one process
    after another: their interleaving in time is not recorded), or blocks."""
    printer = ConsolePrinter(output)  # stdout to stdout, stderr to stderr, as live
    for rank in ranks:
        out, err, _ = logfiles.log_paths(folder, rank)
        if output == "grouped":
            printer.grouped(rank, out, err)
            continue
        for path, stream in ((out, Stream.STDOUT), (err, Stream.STDERR)):
            try:
                with open(path, "rb") as f:
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
def command(run_id, last, ranks, output, base):
    """Show a finished run's logs, or list recent runs.

    \b
      jaxrun logs                    recent runs, newest first, with exit status
      jaxrun logs --last             the last run's output, grouped per process
      jaxrun logs RUN_ID --ranks 0   one process of that run
    """
    base = base or logfiles.default_base()
    found = runs(base)
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
        folder = os.path.join(base, run_id)
        if not os.path.isdir(folder):
            raise click.UsageError(f"no run {run_id!r} in {base}")
    present = ranks_in(folder)
    chosen = RankList().convert(ranks, None, None) if ranks else None
    wanted = [r for r in present if chosen is None or any(r in span for span in chosen)]
    show(folder, wanted, output)
