"""``jaxrun top``: a running job's processes, one row each, as the job sees
them now: host, pid, state, CPU, memory, the time since its last activity,
its share of its time spent waiting for the others (the straggler they wait
for marked, and its line under the table) and its last line of output; the
attempt and the restarts on top.

The live view is drawn by rich (``rich.live.Live``), imported here only, as
this command runs; ``--once`` prints one plain table, with no escape codes,
for scripts, as does a ``jaxrun top`` whose output is no terminal (a pipe, a
file: a live view would draw nothing there until the job ended).  CPU and
memory are measured where the launcher can see the process (a local job's);
elsewhere they show as "-".
"""

from __future__ import annotations

import re
import sys
import time

import click

from jaxrun.launcher.inspect import find
from jaxrun.wire import inspect as words

COLUMNS = ("RANK", "HOST", "PID", "STATE", "CPU", "MEM", "IDLE", "WAIT", "LAST LINE")
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")  # escape sequences first


def cpu_text(cpu: float | None) -> str:
    return "-" if cpu is None else f"{cpu:.0f}%"


def memory_text(size: int | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f}{unit}"
    return f"{size}B"


def idle_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def wait_text(row: words.TableRow) -> str:
    """Its share of its time spent waiting for the others; the straggler marked."""
    share = "-" if row.waiting is None else f"{row.waiting:.0%}"
    return f"{share} straggler" if row.straggler else share


def clean(line: str) -> str:
    """A process's line as one safe cell: no escape sequences, no control characters."""
    return _CONTROL.sub("", line.replace("\t", " "))


def state_text(row: words.TableRow) -> str:
    return row.state if row.life == 0 else f"{row.state} (life {row.life})"


def cells(row: words.TableRow) -> tuple[str, ...]:
    return (str(row.rank), row.host, str(row.pid) if row.pid else "-", state_text(row), cpu_text(row.cpu),
            memory_text(row.memory), idle_text(row.idle), wait_text(row), clean(row.last_line))


def heading(table: words.Table) -> str:
    line = (f"jaxrun: run {table.run_id}  attempt {table.attempt}  "
            f"restarts {table.restarts} of {table.max_restarts}  processes {len(table.rows)}")
    return line + ("  (restarting the whole job)" if table.restarting else "")


def plain(table: words.Table) -> list[str]:
    """The table as plain lines: columns padded with spaces, the last one as is."""
    body = [cells(row) for row in sorted(table.rows, key=lambda r: r.rank)]
    widths = [max(len(c[i]) for c in [COLUMNS, *body]) for i in range(len(COLUMNS) - 1)]
    lines = [heading(table)]
    for row in [COLUMNS, *body]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    if table.straggler:
        lines.append(f"jaxrun: {clean(table.straggler)}")
    return [line.rstrip() for line in lines]


def drawn(table: words.Table):
    """The table as rich draws it.  Only the last line gives way to a narrow
    terminal: every other cell keeps its width (a pid cut to "115…" names no
    process), and the columns are parted by two spaces, not boxes, so that
    the table fits 80 columns with a straggler's "WAIT" mark."""
    from rich.table import Table

    caption = f"jaxrun: {clean(table.straggler)}" if table.straggler else None
    shown = Table(title=heading(table), title_justify="left", expand=False, caption=caption,
                  caption_justify="left", box=None, pad_edge=False, padding=(0, 1))
    rows = [cells(row) for row in sorted(table.rows, key=lambda r: r.rank)]
    for i, name in enumerate(COLUMNS):
        if name == "LAST LINE":
            shown.add_column(name, no_wrap=True, overflow="ellipsis", max_width=80)
        else:
            shown.add_column(name, no_wrap=True, min_width=max(len(c[i]) for c in [COLUMNS, *rows]))
    for row in rows:
        shown.add_row(*row)
    return shown


def live(path: str, info: words.JobInfo, table: words.Table, interval: float) -> None:
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        find.fail("jaxrun top's live view needs rich (pip install rich); --once prints one plain table without it")
    console = Console()
    try:
        with Live(drawn(table), console=console, refresh_per_second=4, transient=False) as view:
            while True:
                time.sleep(interval)
                try:
                    table = fetch(path)
                except (OSError, find.NoJob):
                    break
                view.update(drawn(table))
    except KeyboardInterrupt:
        return
    console.print(f"jaxrun: run {info.run_id} has ended")


def fetch(path: str) -> words.Table:
    answer = find.ask(path, words.AskTable())
    if not isinstance(answer, words.Table):
        raise find.NoJob(f"the job answered {answer.WORD!r}, not a table")
    return answer


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@find.run_option
@click.option("--once", is_flag=True, help="Print one plain table and exit (for scripts).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, metavar="SECONDS",
              help="How often the live view asks the job.")
def command(run_id, once, interval):
    """A live table of a running job's processes: host, pid, state, CPU,
    memory, the time since each one's last activity, its last line.

    \b
      jaxrun top                    the newest job you started, until it ends (Ctrl-C leaves)
      jaxrun top --once             one plain table (so does top without a terminal)
      jaxrun top --run RUN_ID       that job
    """
    path, info, answer = find.asked(run_id, words.AskTable())
    if not isinstance(answer, words.Table):
        find.fail(f"run {info.run_id} answered {answer.WORD!r}, not a table")
    if once or not sys.stdout.isatty():
        click.echo("\n".join(plain(answer)))
        return
    live(path, info, answer, interval)
    sys.stdout.flush()
