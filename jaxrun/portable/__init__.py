"""The one place that knows which operating-system facilities exist.

jaxrun grew up on Linux and leans on a few facilities only Linux has.  Each of
them is optional: the function here that stands for it finds out whether
this system has it (by trying it, or by looking for the name it needs, never
by the platform's name) and says no where it does not, and its caller then
takes the portable path.  No other module of jaxrun touches one of these
facilities or asks which system it runs on (``tests/unit/test_portable_layer.py``
checks that).

=====================================  ====================================================
facility (Linux), and its module       portable path (macOS and the rest)
=====================================  ====================================================
child subreaper (``prctl``);           process-group kills, then a walk of the process
``processes``                          tree and of the processes that carry this
                                       process's ``JAXRUN_ORPHAN_MARK`` (``core.reaper``)
``/proc/PID/fd``; ``processes``        none: a served controller's fork-only daemons are
                                       found by their mark or not at all
``waitid(WNOWAIT)``; ``processes``     a far end kills its controller's group right after
                                       the reap, not before it (``backends.far_end``)
``ip_local_port_range``; ``sockets``   free ports are chosen below 32768 (``free_port``)
abstract Unix socket ``"\\0name"``;     a socket file in a private 0700 folder
``sockets``
``SO_PEERCRED``; ``sockets``           ``LOCAL_PEERCRED`` where Python has it, else the
                                       folder's permissions alone
inotify; ``files``                     the output pump's tick (``launcher.output.filewatch``)
``F_SETPIPE_SZ``; ``files``            the system's default pipe size
``splice``; ``files``                  a local process's pipe is copied into its log
                                       through jaxrun's memory (``launcher.output.logwriter``)
``/proc/self/fd/N``; ``files``         a trace is written through its folder's name, which
                                       another user could swap where a team log folder is
                                       theirs to write (``child.watch.profiling``)
``setpriority`` on a thread id;        the console thread keeps the default priority
``threads``
``/proc/self/io``, and each            the stall watchdog's sampler counts no I/O, only
thread's (``task/*/io``); ``threads``  CPU time and the stack (``child.watch.activity``)
``/proc/self/task/*/stat``;            no CPU time per thread: any CPU time of the
``threads``                            process counts as work, so native threads that
                                       spin hide a hang (``child.watch.activity``)
``/proc/self/task/*/schedstat``;       no wait for a CPU per thread: on a loaded machine
``threads``                            a starved thread that works or spins may be taken
                                       for idle (``child.watch.activity``)
``waitid(WNOWAIT)``, ``/proc/PID/      psutil's walk of every process, at every look
stat`` (``task/*/children``);          of the stall watchdog's sampler
``processes``                          (``child.watch.activity``)
cgroups; ``memory``                    no OOM-kill count and no memory limit
``/proc/self/stat``'s start time;      the run's goodput counts from the moment the
``processes``                          launcher's run began, after its imports
=====================================  ====================================================

``probe`` holds what they all ask with, and ``lacking`` (``notes()``) what ``-v`` says about
the facilities this system lacks.  The rest of jaxrun calls the names this
package lists in ``__all__``, as ``portable.free_port(...)``; each loads its
module when first used.  (The fork server's messages need none of these:
they are framed over a stream socket, see ``wire.encoding.send_frame``.)

``JAXRUN_PORTABLE=1`` in the environment makes every answer here "no", on
Linux too: that is how the tests prove the portable paths without a Mac.  It
is read in ``probe`` and nowhere else.  Nothing here imports jax.
"""

from __future__ import annotations

# Each name's module, loaded when the name is first used (PEP 562): a
# process's start-up pays for the facilities it uses, not for all eight
# modules (the shim, before the script: sockets and probe; 1 ms of every
# process of ``bench/startup.py --part many``).
_WHERE = {
    "inotify": "files", "move_from_pipe": "files", "set_pipe_size": "files", "held_path": "files",
    "maxrss_bytes": "memory", "memory_group": "memory",
    "notes": "lacking",
    "claim_orphans": "processes", "descendants_cpu": "processes", "ended_unreaped": "processes",
    "open_file_ids": "processes", "own_age": "processes", "pid_max": "processes",
    "free_port": "sockets", "is_abstract": "sockets", "peer_pid": "sockets", "peer_uid": "sockets",
    "server_address": "sockets", "temp_base_for_sockets": "sockets",
    "RunDelay": "threads", "ThreadRunning": "threads", "Throttling": "threads", "io_bytes": "threads",
    "lower_thread_priority": "threads", "preempted": "threads", "thread_switches": "threads",
    "main_native_id": "threads", "thread_cpu": "threads", "thread_times": "threads", "thread_waits": "threads",
}


def __getattr__(name: str):
    import importlib

    where = _WHERE.get(name)
    if where is None:  # a module of the layer's, as ``portable.sockets``
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # no module of the layer has a name of these: nothing sets it back
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "RunDelay", "ThreadRunning", "Throttling", "claim_orphans", "descendants_cpu", "ended_unreaped", "free_port",
    "held_path", "inotify", "io_bytes",
    "is_abstract", "lower_thread_priority", "main_native_id", "maxrss_bytes", "memory_group", "move_from_pipe",
    "notes", "open_file_ids", "own_age",
    "peer_pid", "peer_uid", "preempted",
    "pid_max", "server_address", "set_pipe_size", "temp_base_for_sockets", "thread_cpu", "thread_times",
    "thread_switches", "thread_waits",
]
