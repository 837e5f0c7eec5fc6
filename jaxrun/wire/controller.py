"""What a far end and the launcher say about the one controller the far end
runs, in every protocol that runs one (``ssh``, ``tasks``, and ``Started`` in
``forkserver``): the names of its streams, its pid once it runs, a signal for
it, and its end.  Each protocol's module re-exports the words it speaks, so a
caller imports one module per protocol and never this one.
"""

import signal

from jaxrun.wire.encoding import Message, WireError, message

# -- the streams of one process, as both far ends name them --------------------------
# Each process's connections (an SSH host agent's channels, a scheduler task's
# connections) are one of these; the words are spelled here only.
CONTROL = "ctrl"  # wire messages, both ways
STDOUT = "stdout"  # the controller's own bytes, untouched
STDERR = "stderr"


@message("started")
class Started(Message):
    """A controller was started (forked by the fork server, or by an SSH
    host agent): its pid on that machine."""

    pid: int


@message("signal")
class Signal(Message):
    """A signal for the controller, by name: numbers differ between operating systems."""

    name: str

    @classmethod
    def of(cls, signum: int) -> "Signal":
        return cls(signal.Signals(signum).name)

    @property
    def signum(self) -> int:
        try:
            return signal.Signals[self.name]
        except KeyError:
            raise WireError(f"unknown signal {self.name!r}") from None


@message("exit")
class Exit(Message):
    """A far end's controller has ended (a task agent's, a host agent's).
    The fields after ``resources`` are optional: an older far end leaves
    them out."""

    returncode: int  # Popen style
    resources: dict | None = None  # contract.Resources.to_dict(), measured by the far end
    reaped_at: float | None = None  # its wall clock as it reaped the controller
    clock: str | None = None  # which machine's clock that is (core.causes.clock_id)
    pid: int | None = None  # the controller's own pid there
    marks: dict | None = None  # contract.Marks.to_dict(): its compiles and checkpoint saves
