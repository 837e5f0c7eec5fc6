"""Files and pipes, as the output pump uses them: inotify, to hear that a
log file grew instead of ticking, pipes enlarged past their default, and
splice, to move a local process's pipe into its log file; and a name for a
folder held open (``held_path``)."""

from __future__ import annotations

import os

from jaxrun.portable.probe import forced, libc


def inotify():
    """(inotify_init1, inotify_add_watch, inotify_rm_watch) from the C
    library, or None where there is no inotify (the pump then keeps ticking)."""
    if forced():
        return None
    found = libc()
    calls = tuple(getattr(found, name, None) for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"))
    return None if None in calls else calls


def pipes_resize() -> bool:
    """Whether a pipe's size can be set on this system."""
    import fcntl

    return not forced() and hasattr(fcntl, "F_SETPIPE_SZ")


def set_pipe_size(fd: int, size: int) -> bool:
    """Make a pipe hold ``size`` bytes.  False where pipes have a fixed size,
    or ``size`` is over the system's limit: the pipe keeps its default."""
    import fcntl

    if not pipes_resize():
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
        return True
    except OSError:
        return False


def move_from_pipe(pipe: int, file: int, count: int) -> int | None:
    """Move up to ``count`` bytes from ``pipe`` into ``file`` (at its
    position) inside the kernel, never through jaxrun's memory: how many
    (0: the pipe's writers are all gone).  None where this system cannot,
    or not into this file: the caller copies them itself.  A failed write
    raises, and leaves the bytes it could not write in the pipe."""
    import errno
    import os

    if forced() or not hasattr(os, "splice"):
        return None
    try:
        return os.splice(pipe, file, count)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOSYS):  # a file system that takes no splice
            return None
        raise


def held_path(fd: int, path: str) -> str:
    """A name for the folder held open as ``fd`` that reaches that folder
    whatever is renamed meanwhile (``/proc/self/fd/FD``), for a library
    that opens by name (``jax.profiler``); ``path`` where the system has no
    such names (a folder swapped after its check is then the one written)."""
    held = f"/proc/self/fd/{fd}"
    return held if not forced() and os.path.isdir(held) else path
