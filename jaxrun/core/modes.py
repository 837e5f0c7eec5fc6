"""What a run is for: a script, or an interactive session (``-i``) at a
terminal or behind a Jupyter kernel.  Each mode is a type that supplies what
differs between them, so that the rest of the launcher asks the mode
instead of branching on it:

- the target every process runs (the user's script, or the interactive
  controller that runs each statement);
- the stall watchdog's timeout (a session waits for its user, which is not
  a stall);
- whether the job may be recoverable (a session needs every process);
- which processes the console shows (a session's frontend shows its
  replies; the logs hold everything);
- the options it refuses.

Data only: the run loop looks up how to drive each mode in its own table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrun import contract
from jaxrun.core.spec import Target


class ModeError(ValueError):
    """An option the mode cannot take: one line."""


class Mode:
    def target(self, args: Sequence[str], parse: Callable[[Sequence[str]], Target]) -> Target:
        return parse(args)

    def stall_timeout(self, given: float) -> float:
        return given

    def recoverable(self, given: bool | None) -> bool | None:
        """--recoverable (True), --no-recoverable (False), or as the processes announce (None)."""
        return given

    def console_ranks(self, given: frozenset[int] | None) -> frozenset[int] | None:
        return given

    def check(self, values: Mapping[str, Any]) -> None:
        """Refuse the options this mode cannot honour (ModeError)."""


class Script(Mode):
    """``jaxrun SCRIPT``: every process runs the script."""


class Interactive(Mode):
    """``jaxrun -i``: every process runs each statement typed."""

    def target(self, args: Sequence[str], parse: Callable[[Sequence[str]], Target]) -> Target:
        if args:
            raise ModeError(f"-i takes no SCRIPT (got {args[0]!r}): the session's statements are typed")
        return Target(contract.INTERACTIVE_CONTROLLER_MODULE, (), is_module=True)

    def stall_timeout(self, given: float) -> float:
        return 0.0  # a session waits for its user, which is not a stall

    def recoverable(self, given: bool | None) -> bool | None:
        return False  # every statement runs in every process

    def console_ranks(self, given: frozenset[int] | None) -> frozenset[int] | None:
        return frozenset()  # the frontend shows the session; the logs hold everything

    def check(self, values: Mapping[str, Any]) -> None:
        if values.get("max_restarts"):
            raise ModeError("-i takes no --max-restarts: a session's state cannot be restarted")
        if values.get("recoverable"):
            raise ModeError("-i takes no --recoverable: every statement runs in every process")


class Terminal(Interactive):
    """A person at a terminal: Python's console rules, readline, a history."""


class Jupyter(Interactive):
    """The Jupyter kernel: one JSON request a line on stdin, replies on stdout."""
