"""What an SSH child takes out of its stderr: the facts its agent sends in-band.

The agent that runs a controller on a host (``far_end.run`` with
``session_agent.SshHome``, in the host agent or a session agent) has no way
back to the launcher but the controller's own stderr, so it writes two
things there:

- ``ssh.JOINED_MARKER``, once, in one write, when the controller arrives at
  the job's rendezvous, and an activity marker (``ssh.activity_marker``)
  each time its sampler changes state (``--stall-timeout``).  A marker may
  land anywhere, even inside a line of the process's own, and a read may
  cut it in two;
- the report home (``ssh.home_report``): the error record, the resources,
  the controller's own pid and when its end was seen there, as the very
  last bytes, once the controller and what it started are gone.

:class:`AgentStderr` is the ``StreamFilter`` that cuts both out, and never
loses a byte of the process's own: bytes that may begin a marker are held
until the next read shows what they are, and from the report home's mark on
everything is held until the end of the stream, since a mark followed by
more bytes was the process's own after all.  A "report" longer than
``ssh.MAX_HOME_REPORT`` is let go at once, so a process that prints the
mark (a hex dump of jaxrun's own stream, say) costs no unbounded memory.

The facts go where every backend puts them: a join and each change of
state to the spawn's ``News``, the error record into the launcher's error file, and the
resources and the end's facts to the child's ``wait`` (``resources`` and
``facts`` once ``closed``; ``came_home`` says whether a report came at all).
"""

from __future__ import annotations

import threading

from jaxrun import contract
from jaxrun.core.backend import News
from jaxrun.wire import ssh

# The in-band markers, with the state each activity marker tells (None: the join).
MARKERS = {ssh.JOINED_MARKER: False, ssh.JOINED_RECOVERABLE_MARKER: True,
           **{m: state for state, m in ssh.ACTIVITY_MARKERS.items()}}
MARKER_HEAD = ssh.MARKER_HEAD  # what every marker begins with (a SPIN or TIME marker's too: ssh.detail_marker)
assert all(m.startswith(MARKER_HEAD) for m in MARKERS)


class AgentStderr:
    """The StreamFilter of an SSH child's stderr (fed by one thread, the pump)."""

    def __init__(self, news: News, error_file: str | None):
        self.news = news
        self.error_file = error_file  # the launcher's, for the record that comes home
        self.resources: contract.Resources | None = None  # what came home, once closed
        self.facts: dict = {}  # the end's facts that came home (ssh.HOME_REPORT_FACTS), once closed
        self.came_home = False  # a report home was read: the far end saw the controller's end
        self.closed = threading.Event()  # the end of the stream was read: nothing more will come
        self._join_held = b""  # what may begin a marker
        self._held = b""  # what may begin the report home's mark
        self._tail: bytearray | None = None  # from the mark on, until the end

    def feed(self, data: bytes) -> bytes:
        return self._hold_report(self._cut_markers(data, end=False))

    def close(self) -> bytes:
        try:
            return self._hold_report(self._cut_markers(b"", end=True)) + self._release_report()
        finally:
            self.closed.set()

    def _cut_markers(self, data: bytes, end: bool) -> bytes:
        """The bytes without the joined and activity markers; the start of a
        marker a read cut in two is held until the next read (at the end:
        released).  The markers share their first bytes (``MARKER_HEAD``), so
        the common case, no marker, costs one search."""
        data, self._join_held = self._join_held + data, b""
        if MARKER_HEAD in data:
            data = self._take_markers(data)
        if not end:
            keep = max(ssh.detail_marker_start(data), *(marker_start(data, m) for m in MARKERS))
            if keep:
                self._join_held, data = data[-keep:], data[:-keep]
        return data

    def _take_markers(self, data: bytes) -> bytes:
        """Every whole marker out of ``data``, each told in the order it came."""
        out, at = [], 0
        while True:
            found = data.find(MARKER_HEAD, at)
            if found < 0:
                break
            marker = next((m for m in MARKERS if data.startswith(m, found)), None)
            if marker is None:
                spinning = ssh.detail_marker(data, found)
                if spinning is None:
                    out.append(data[at:found + 1])
                    at = found + 1
                else:
                    out.append(data[at:found])
                    said, at = spinning
                    self.news.activity(said)
                continue
            out.append(data[at:found])
            at = found + len(marker)
            if marker in (ssh.JOINED_MARKER, ssh.JOINED_RECOVERABLE_MARKER):
                self.news.joined(MARKERS[marker])
            else:
                self.news.activity(MARKERS[marker])
        out.append(data[at:])
        return b"".join(out)

    def _hold_report(self, data: bytes) -> bytes:
        """The bytes that are surely the process's own; a possible report is held."""
        if not data:
            return b""
        if self._tail is not None:
            self._tail += data
            if len(self._tail) <= ssh.MAX_HOME_REPORT:
                return b""
            data, self._tail = bytes(self._tail), None  # too long for a report: the process's bytes
            return data
        marker = ssh.HOME_REPORT_MARK
        data, self._held = self._held + data, b""
        at = data.find(marker)
        if at >= 0:
            self._tail = bytearray(data[at:])
            return data[:at]
        keep = marker_start(data, marker)
        if keep:
            self._held = data[-keep:]
            return data[:-keep]
        return data

    def _release_report(self) -> bytes:
        """At the end of the stream: take in a real report home; anything
        else held back was the process's own and goes to the log after all."""
        rest, self._held = self._held, b""
        if self._tail is not None:
            report = ssh.parse_home_report(bytes(self._tail))
            if report is None:
                rest += bytes(self._tail)
            else:
                self._take_home(*report)
            self._tail = None
        return rest

    def _take_home(self, error: str | None, used: dict | None, facts: dict) -> None:
        if error is not None and self.error_file:
            record = contract.ErrorRecord.from_json(error)
            if record is not None:
                record.dump(self.error_file)
        self.resources = contract.Resources.from_dict(used)
        self.facts = facts
        self.came_home = True


def marker_start(data: bytes, marker: bytes) -> int:
    """How many of ``data``'s last bytes may begin ``marker`` (0: none)."""
    if marker[0] not in data[-(len(marker) - 1):]:  # the common case, at memchr speed
        return 0
    for k in range(min(len(marker) - 1, len(data)), 0, -1):
        if data.endswith(marker[:k]):
            return k
    return 0
