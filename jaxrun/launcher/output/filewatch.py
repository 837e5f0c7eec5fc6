"""Waking the output pump when a quiet log file grows: inotify, through ctypes.

Where there is no inotify (see :func:`jaxrun.portable.inotify`), ``arm``
returns None and the pump keeps polling.
"""

from __future__ import annotations

import os

from jaxrun import portable


class FileWatch:
    """Wakes the pump when a quiet followed file grows (inotify, where it exists).

    Armed only while the files are quiet: a job that prints steadily is polled
    instead (10 Hz, backing off to 2 Hz), since inotify would queue (and the
    kernel would allocate and free) one event per write.  ``arm`` returns a
    descriptor that becomes readable after the next write to any of the
    files, or None where there is no inotify; then the pump keeps ticking.
    """

    IN_MODIFY = 0x2

    def __init__(self) -> None:
        self.fd: int | None = None
        self._init, self._add_watch = portable.inotify() or (None, None)

    def arm(self, paths: list[str]) -> int | None:
        if self._init is None:
            return None
        if self.fd is None:
            fd = self._init(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return None
            self.fd = fd
            for path in paths:
                if self._add_watch(fd, os.fsencode(path), self.IN_MODIFY) < 0:
                    self.disarm()  # out of watches: keep ticking
                    return None
        return self.fd

    def disarm(self) -> None:
        """Closing the descriptor drops its watches and any queued events at once."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
