"""``jaxrun stacks``: every process's Python stacks now, grouped.

The job takes the dumps (``AskStacks``: the SIGUSR1 that ``kill -USR1`` on
jaxrun sends, into each process's stderr log; the processes go on) and
sends them here as faulthandler wrote them.  This side reads each one's
main thread, groups the processes whose main threads stand on the same
frames (file, line, function, every one of them), and prints each group
once, with its ranks and hosts, the smallest groups first: the process that
is somewhere else than all the others ("1 against N-1") comes first.
"""

from __future__ import annotations

import dataclasses

import click

from jaxrun.core.ranks import format_ranks
from jaxrun.launcher.inspect import find
from jaxrun.reporting import stacks
from jaxrun.wire import inspect as words

DEFAULT_WAIT = 5.0
Frame = tuple[str, int, str]  # (file, line, function)


@dataclasses.dataclass(frozen=True)
class Group:
    frames: tuple[Frame, ...]  # the main thread's, innermost first; () for no dump
    dumps: tuple[words.StackDump, ...]

    @property
    def ranks(self) -> list[int]:
        return [d.rank for d in self.dumps]


def threads(text: str) -> list[tuple[str, list[Frame]]]:
    """A faulthandler dump's threads: (header, frames innermost first)."""
    found: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        if stacks.THREAD.match(line):
            found.append((line, []))
            continue
        m = stacks.FRAME.match(line)
        if m and found:
            found[-1][1].append((m["file"], int(m["line"]), m["func"]))
    return found


def main_frames(text: str) -> tuple[Frame, ...]:
    """The main thread's frames from the script's own outermost frame in:
    the thread that runs the script through the shim (the shim's frames and
    those that started it left out), else the one faulthandler calls
    current, else the first."""
    found = threads(text)
    if not found:
        return ()
    for _, frames in found:
        runner = next((i for i, (file, _, func) in enumerate(frames) if is_runner(file, func)), None)
        if runner is not None:
            return tuple(frames[:runner])
    current = [frames for header, frames in found if header.startswith("Current thread")]
    return tuple(current[0] if current else found[0][1])


def is_runner(file: str, func: str) -> bool:
    """The shim's frame that runs the script."""
    return stacks.runs_the_script(file, func)


def grouped(dumps: tuple[words.StackDump, ...]) -> list[Group]:
    """Processes on the same main-thread frames together; the smallest groups
    first, then by their first rank; those without a dump last."""
    by_frames: dict[tuple[Frame, ...], list[words.StackDump]] = {}
    for dump in sorted(dumps, key=lambda d: d.rank):
        by_frames.setdefault(main_frames(dump.text), []).append(dump)
    made = [Group(frames, tuple(members)) for frames, members in by_frames.items()]
    return sorted(made, key=lambda g: (not g.frames, len(g.dumps), g.ranks[0]))


def who(group: Group) -> str:
    """ "process 1 on hostB (pid 77)", "processes 0,2-3 on localhost", or per host."""
    ranks = group.ranks
    hosts: dict[str, list[int]] = {}
    for dump in group.dumps:
        hosts.setdefault(dump.host, []).append(dump.rank)
    if len(ranks) == 1:
        dump = group.dumps[0]
        return f"process {dump.rank} on {dump.host}" + (f" (pid {dump.pid})" if dump.pid else "")
    where = next(iter(hosts)) if len(hosts) == 1 else ", ".join(f"{h} ({format_ranks(r)})" for h, r in hosts.items())
    return f"processes {format_ranks(ranks)} on {where}"


def render(answer: words.Stacks, run_id: str, log_dir: str = "") -> list[str]:
    groups = grouped(answer.dumps)
    total = len(answer.dumps)
    lines = [f"jaxrun: run {run_id}: {total} process{'es' if total != 1 else ''} in {len(groups)} "
             f"group{'s' if len(groups) != 1 else ''} by the main thread's stack (most recent call first)"]
    for group in groups:
        lines.append("")
        if not group.frames:
            states = sorted({d.state for d in group.dumps})
            lines.append(f"{who(group)}: no stack dump ({', '.join(states)})")
            continue
        lines.append(f"{who(group)}: {len(group.dumps)} of {total}")
        lines.extend(f'  File "{file}", line {line} in {func}' for file, line, func in group.frames)
    lines.append("")
    if answer.note:
        lines.append(f"jaxrun: {answer.note}")
    if log_dir:
        lines.append(f"jaxrun: every thread's stack is in each process's stderr log, under {log_dir}")
    return lines[:-1] if lines[-1] == "" else lines


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@find.run_option
@click.option("--wait", type=click.FloatRange(min=0.5, max=60), default=DEFAULT_WAIT, show_default=True,
              metavar="SECONDS", help="How long the dumps may take to arrive (from far hosts too).")
def command(run_id, wait):
    """Print every process's Python stacks now, grouped by the main thread's
    frames; the processes go on running.

    \b
      jaxrun stacks                 the newest job you started
      jaxrun stacks --run RUN_ID    that one
    """
    _, info, answer = find.asked(run_id, words.AskStacks(wait), timeout=wait + find.ASK_TIMEOUT)
    if not isinstance(answer, words.Stacks):
        find.fail(f"run {info.run_id} answered {answer.WORD!r}, not stacks")
    if not answer.dumps:
        find.fail(f"run {info.run_id}: {answer.note or 'no process runs now'}")
    click.echo("\n".join(render(answer, info.run_id, info.log_dir)))
