"""The one interface every way of starting controllers implements.

A backend is used the same way by the launcher's run loop, whatever it is:

    with backend:                                   # open(): connect, preflight
        for each attempt:
            address, bind = backend.choose_coordinator(fixed)
            backend.begin(specs, log_dir)           # this attempt's resources
            child = backend.spawn(spec, ...)        # one per process, by the supervisor
            ...
            backend.end()                           # every child is gone
                                                    # close(): disconnect

A backend whose ``writes_log_files`` is true receives the two log files
(``log_fds``) and makes them the child's stdout and stderr: the child's
``stdout``/``stderr`` are then None, and its bytes never pass through jaxrun.
Other backends hand back pipes, and the supervisor writes the logs.

Each backend lives beside its far-end agent, if it has one: the program it
starts on the other side (the fork server, the SSH host agent, the scheduler
task agent).  They talk in :mod:`jaxrun.wire` messages.
"""

from __future__ import annotations

import abc
from typing import BinaryIO, Mapping, Protocol, Sequence

from jaxrun.launcher.plan import ProcessSpec


class Child(Protocol):
    """One running controller, as the supervisor sees it."""

    pid: int
    stdout: BinaryIO | None  # None: it writes its log file itself
    stderr: BinaryIO | None

    def send(self, signum: int) -> None:
        """Signal the controller's whole process group (grandchildren too)."""

    def wait(self) -> int:
        """Block until it ends; Popen style: negative for a signal."""


class Backend(abc.ABC):
    name: str = ""
    writes_log_files: bool = False

    def open(self) -> None:
        """Before the first attempt: connections and checks that span the run."""

    @abc.abstractmethod
    def choose_coordinator(self, fixed: str | None) -> tuple[str, str | None]:
        """(address every process connects to, address process 0 binds, or
        None when the backend's far end decides), honouring --coordinator."""

    def dry_run_coordinator(self, fixed: str | None) -> tuple[str, str | None]:
        """What --dry-run shows; it must not start or contact anything."""
        return self.choose_coordinator(fixed)

    def begin(self, specs: Sequence[ProcessSpec], log_dir: str) -> None:
        """One attempt is about to start these processes."""

    @abc.abstractmethod
    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None) -> Child:
        """Start one controller.  ``lifeline_fd`` is the read end of a pipe
        only the launcher writes to; a local child must hold it open."""

    def end(self) -> None:
        """The attempt is over and every child has exited."""

    def close(self) -> None:
        """After the last attempt, or when the run is abandoned."""

    def __enter__(self) -> "Backend":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
