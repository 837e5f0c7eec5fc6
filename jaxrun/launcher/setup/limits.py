"""The open files a run needs, against the limit (``ulimit -n``).

The launcher's own descriptors and each process's are measured, not
guessed (``FDS_RESERVED``, each backend entry's ``fds_per_process``;
``bench/fds.py`` measures them), and what is open before jaxrun looks
(descriptors inherited from the shell) counts against the same limit.
A job that cannot fit the hard limit however little is open is bad input
(exit 2); one that would fit but for what is open already is ``OutOfFiles``
(exit 70), and so is a start-up that runs out anyway (EMFILE, ENFILE:
``out_of_files_line``).  ``System`` (``configure``) answers for the machine.
"""

from __future__ import annotations

import errno
import os
import resource

from jaxrun.core.config import BackendEntry, LaunchError, OutOfFiles

# File descriptors jaxrun opens for itself, whatever the backend, beside
# those open before it looks (``System.open_files``): the lifeline pipe,
# the pump's and the log writer's selectors and wake pipes, inotify, the
# control channel, the fork server's socket, a process being started.
# Measured on a local run (2026-12-05, bench/fds.py): the launcher's peak
# was 26 at -n 1 (about 4 open before the check, 6 for the process), 44 at
# -n 4 and 116 at -n 16; so 16 of its own, and 24 with room for a restart
# and a `jaxrun top` connected.  (Each process's own
# cost is its backend entry's.)
FDS_RESERVED = 24


def check_scale(num_processes: int, entry: BackendEntry, system) -> None:
    """Refuse a job this machine cannot hold, naming the limit, before a plan
    of that size is even built: exit 2 where the limit is too low for it,
    exit 70 (OutOfFiles) where what is open already leaves too little.  When
    the soft open-file limit is too low for it, raise it to the hard one."""
    soft, hard = system.open_file_limits()
    already = system.open_files()
    problem = scale_problem(num_processes, entry.fds_per_process, entry.kind, hard, system.pid_max())
    if problem:
        raise LaunchError(problem)
    need = fds_needed(num_processes, entry.fds_per_process, already)
    if hard != resource.RLIM_INFINITY and need > hard:
        raise OutOfFiles(f"-n {num_processes}: jaxrun needs about {need - already} more open files "
                         f"({entry.fds_per_process} for each process, {entry.kind} run), but {already} are open "
                         f"already (inherited) and the open-file limit is {hard} (ulimit -Hn); close them, or "
                         "raise the limit")
    if soft != resource.RLIM_INFINITY and need > soft:
        system.raise_open_file_limit()


def fds_needed(num_processes: int, per_process: int, already: int = 0) -> int:
    """The launcher's open files at its peak: those open before, its own, the processes'."""
    return already + FDS_RESERVED + per_process * num_processes


def open_files() -> int:
    """How many file descriptors this process holds (counted up to the limit
    where the system cannot list them)."""
    try:
        return len(os.listdir("/dev/fd")) - 1  # less the one listdir opened
    except OSError:
        return 3  # the standard streams


def out_of_files_line(error: OSError) -> str:
    """What a start-up that ran out of open files says (EMFILE, ENFILE): one line, exit 70."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = "the system's" if error.errno == errno.ENFILE else f"{soft} (ulimit -n)"
    return (f"out of open files at start-up ({error.strerror}): {open_files()} are open and the limit is {limit}; "
            "no process was left running; close what this shell holds open, or raise the limit")


def scale_problem(num_processes: int, per_process: int, kind: str, nofile_hard: int, pid_max: int) -> str | None:
    """Why ``num_processes`` processes, each costing jaxrun ``per_process``
    open files in a ``kind`` run, do not fit here however few files are open
    already (the standard streams); or None."""
    need = fds_needed(num_processes, per_process, 3)
    if nofile_hard != resource.RLIM_INFINITY and need > nofile_hard:
        most = max(0, (nofile_hard - FDS_RESERVED - 3) // per_process)
        return (f"-n {num_processes}: jaxrun needs about {need} open files for that many processes "
                f"({per_process} each, {kind} run), but the open-file limit is {nofile_hard} "
                f"(ulimit -Hn); at most {most} processes")
    if num_processes > pid_max // 2:  # each process, and jaxrun's thread waiting for it, takes a pid here
        return (f"-n {num_processes}: this machine numbers at most {pid_max} processes and threads "
                f"(kernel.pid_max), and jaxrun needs two for each process; at most {pid_max // 2} processes")
    return None
