"""For the far-end agents: notice when their controller has joined the job.

The shim creates its joined file (``contract.JOINED_FILE``) when it arrives at
the rendezvous.  An agent (SSH, scheduler task) gives the shim a path in its
private folder on the host, and a :class:`JoinWatch` looks for it there ten
times a second, until it appears or the controller ends, then tells the
launcher once, in the agent's own way (a marker on the SSH stream, a message
on the task channel).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

LOOK_EVERY = 0.1  # seconds between looks: one stat each


class JoinWatch:
    def __init__(self, path: str, announce: Callable[[], None], interval: float = LOOK_EVERY):
        self.path, self.announce, self.interval = path, announce, interval
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="join-watch", daemon=True)

    def start(self) -> JoinWatch:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.done.is_set():
            if os.path.lexists(self.path):
                self._remove()
                try:
                    self.announce()
                except OSError:
                    pass  # the launcher is gone: the agent learns it elsewhere
                return
            self.done.wait(self.interval)

    def stop(self) -> None:
        """The controller has ended: no announcement after this returns, and
        no file is left (the agent removes its private folder next)."""
        self.done.set()
        if self.thread.ident is not None:  # started
            self.thread.join()
        self._remove()

    def _remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass
