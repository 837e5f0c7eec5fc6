"""Waking the output pump when a quiet log file grows: inotify, through ctypes.

Where there is no inotify (see :func:`jaxrun.portable.inotify`), ``arm``
returns None and the pump keeps polling.
"""

from __future__ import annotations

import os
import threading

from jaxrun import portable


class FileWatch:
    """Wakes the pump when a quiet followed file grows (inotify, where it exists).

    Armed only while the files are quiet: a job that prints steadily is polled
    instead (10 Hz, backing off to 2 Hz), since inotify would queue (and the
    kernel would allocate and free) one event per write.  ``arm`` returns a
    descriptor that becomes readable after the next write to any of the
    files, or None where there is no inotify; then the pump keeps ticking.

    One inotify descriptor serves the pump's whole life: ``release`` removes
    the watches, which does not wait, and the next ``arm`` adds them again.
    Closing a descriptor whose watches the kernel has not freed yet would
    wait for them: the kernel frees watches after a grace period, and its
    close took up to 20 ms here (Linux 6.18), a wait that each quiet spell's
    end, and the job's, would pay.
    """

    IN_MODIFY = 0x2

    def __init__(self) -> None:
        self.fd: int | None = None
        self.watches: list[int] = []  # the watches on ``fd`` now: armed when there are some
        self._init, self._add_watch, self._rm_watch = portable.inotify() or (None, None, None)

    def arm(self, paths: list[str]) -> int | None:
        if self._init is None:
            return None
        if self.fd is None:
            fd = self._init(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return None
            self.fd = fd
        if not self.watches:
            self._discard_events()  # those of the writes and removals before: not news now
            for path in paths:
                watch = self._add_watch(self.fd, os.fsencode(path), self.IN_MODIFY)
                if watch < 0:
                    self.disarm()  # out of watches: keep ticking
                    return None
                self.watches.append(watch)
        return self.fd

    def release(self) -> None:
        """Remove every watch, keeping the descriptor; this does not wait."""
        if self.fd is not None:
            for watch in self.watches:
                self._rm_watch(self.fd, watch)
        self.watches.clear()

    def disarm(self, wait: bool = True) -> None:
        """Close the descriptor, which drops its watches and any queued events.
        ``wait=False`` leaves the close, and whatever wait it has, to a thread
        of its own."""
        self.watches.clear()
        if self.fd is not None:
            fd, self.fd = self.fd, None
            if wait:
                os.close(fd)
            else:
                threading.Thread(target=os.close, args=(fd,), name="jaxrun-inotify-close", daemon=True).start()

    def _discard_events(self) -> None:
        while True:
            try:
                if not os.read(self.fd, 1 << 14):
                    return
            except BlockingIOError:
                return
