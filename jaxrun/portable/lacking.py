"""What ``-v`` says this system goes without: one line per facility, each
naming the portable path jaxrun takes instead."""

from __future__ import annotations

from jaxrun import contract
from jaxrun.portable import files, processes, threads
from jaxrun.portable.probe import forced


def notes() -> list[str]:
    """One line for each facility this launcher goes without, for ``-v``."""
    lines = []
    if forced():
        lines.append(f"jaxrun: {contract.PORTABLE} is set: every Linux-only facility is off")
    if processes.refused_orphans():
        lines.append("jaxrun: no subreaper on this system: daemons that leave the process group are found "
                     f"by a process-tree walk and by the {contract.ORPHAN_MARK} in their environment")
    if files.inotify() is None:
        lines.append("jaxrun: no inotify on this system: quiet log files are polled ten times a second")
    if not threads.thread_ids_are_pids():
        lines.append("jaxrun: no per-thread priority on this system: the console thread competes with "
                     "the job for the CPU")
    if not files.pipes_resize():
        lines.append("jaxrun: pipes cannot be enlarged on this system: remote output is read in "
                     "smaller pieces")
    return lines
