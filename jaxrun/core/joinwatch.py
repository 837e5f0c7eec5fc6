"""For the far-end agents: notice when their controller has joined the job,
and when it changes between busy and idle (the stall watchdog's).

The shim creates its joined file (``contract.JOINED_FILE``) when it arrives at
the rendezvous, and its sampler rewrites its activity file
(``contract.ACTIVITY_FILE``) each time the process's state changes.  An agent
(SSH, scheduler task) gives the shim paths in its private folder on the
host, and a :class:`JoinWatch` looks at them there ten times a second (a
``stat`` each) until the controller ends, and tells the launcher in the
agent's own way (a marker on the SSH stream, a message on the task channel):
the join once (and whether the controller enabled recoverability, which the
joined file says), each change of state as it sees it, and each new TIME
line (the account of the process's time, ``contract.TimeSplit``) the same way.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from jaxrun import contract

LOOK_EVERY = 0.1  # seconds between looks: one stat each


def _nothing(_state: str) -> None:
    pass


class JoinWatch:
    def __init__(self, path: str, announce: Callable[[bool], None], interval: float = LOOK_EVERY,
                 activity_path: str | None = None, activity: Callable[[str], None] = _nothing):
        self.path, self.announce, self.interval = path, announce, interval
        self.activity_path, self.activity = activity_path, activity
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="join-watch", daemon=True)
        self._seen: tuple | None = None  # the activity file's (inode, mtime, size) when last read
        self._told: dict[bool, str] = {}  # the state's line and the TIME line last told

    def start(self) -> JoinWatch:
        self.thread.start()
        return self

    def _run(self) -> None:
        joined = False
        while not self.done.is_set():
            try:
                if not joined and os.path.lexists(self.path):
                    joined = True
                    recoverable = contract.joined_recoverable(self.path)
                    self._remove(self.path)
                    self.announce(recoverable)
                if self.activity_path:
                    self._look_at_activity()
            except OSError:
                return  # the launcher is gone: the agent learns it elsewhere
            if joined and not self.activity_path:
                return
            self.done.wait(self.interval)

    def _look_at_activity(self) -> None:
        try:
            st = os.lstat(self.activity_path)
        except OSError:
            return
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return
        self._seen = seen
        for said in contract.read_activity_file(self.activity_path):  # its state, its TIME line
            kind = contract.TimeSplit.of(said) is not None  # a TIME line, or the state's
            if self._told.get(kind) != said:
                self._told[kind] = said
                self.activity(said)

    def stop(self) -> None:
        """The controller has ended: nothing is told after this returns, and
        no file is left (the agent removes its private folder next)."""
        self.done.set()
        if self.thread.ident is not None:  # started
            self.thread.join()
            if self.activity_path:
                try:
                    self._look_at_activity()  # its last word (its script returned) goes home too
                except OSError:
                    pass
        if self.path:
            self._remove(self.path)
        if self.activity_path:
            contract.remove_private(self.activity_path)  # with a copy its sampler left unrenamed

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass
