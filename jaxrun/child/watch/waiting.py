"""A wait inside JAX at one line of the script, as the time account
(``watch.accounting``) judges it for the parting check: the main thread
inside JAX at one call site, its process using and wanting hardly any CPU,
for ``heard.seconds``.  ``heard`` (the parting check's) hears of it once it
lasted, and when it ends.

"No CPU" is judged over the wait's span, not look by look, and before the
wait is said, the process's threads' waits for a CPU are read too: a program
that computes on XLA's threads, starved of a CPU, is no wait.
"""

from __future__ import annotations

import threading

from jaxrun import portable

# A wait at one place inside JAX (the parting check's) is judged over its span, not look
# by look: it lasts while the CPU the process wanted beyond WAIT_SHARE of the time stays
# within WAIT_SLACK seconds (a leaky bucket).  One 20 ms look is too short to judge: the
# process's own threads (the check's post of the wait to the store, the coordination
# service it hosts as process 0, JAX's heartbeats) used 14-15 ms of CPU in one look of a
# blocked process on a loaded machine, and each such look began the wait again: 3 s more
# before it was said, a parting named 10 s after it happened instead of 4.  A program that
# computes uses a core or more: it ends the wait within WAIT_SLACK / (1 - WAIT_SHARE).
WAIT_SHARE = 0.1
WAIT_SLACK = 0.1
# Before a wait is said, its threads' time ready to run without a CPU over its second half
# is read too (every thread's ``schedstat``: a scan, so only then): a program that computes
# on XLA's threads while the main thread waits for its result, on a machine whose load
# leaves those threads a small share of a core, uses hardly any CPU, and the wait at
# ``block_until_ready`` looked like one for a peer (a healthy job stopped as parted, its
# slow process computing, under three pytest workers on 2 cores).  Threads that waited for a
# CPU for more than STARVED_SHARE of that time compute: the wait begins again.  A thread that
# computes on a starved machine waits for a CPU most of the time; a blocked process's threads
# wake for moments (its heartbeats, the store's calls), each waiting a few ms at most.
STARVED_SHARE = 0.5


def threads_starved() -> float | None:
    """Seconds every thread of this process but the calling one (the
    sampler's) has spent ready to run without a CPU so far; None where the
    system does not say.  One read of each thread's ``schedstat``."""
    waits = portable.thread_waits()
    if waits is None:
        return None
    me = threading.get_native_id()
    return sum(seconds for tid, seconds in waits.items() if tid != me)


class Wait:
    """The wait at one call site so far, judged at each look of the account."""

    def __init__(self, starved=threads_starved):
        self.starved = starved  # the threads' waits for a CPU so far (seconds), or None
        self.at, self.since, self.said = None, 0.0, False
        self.owed = 0.0  # the CPU it wanted beyond WAIT_SHARE of it, forgiven at that rate
        self.mark: tuple[float, float | None] | None = None  # at its half: (when, the threads' waits for a CPU)

    def judge(self, heard, inside: bool, at, wanted: float, seconds: float, now: float) -> None:
        """One look's part: ``inside`` JAX, called from the script at ``at``,
        the process having wanted ``wanted`` CPU seconds in the look's
        ``seconds``.  A wait begins at a look inside JAX that wanted less
        than half its time, and lasts while the CPU it wanted beyond
        ``WAIT_SHARE`` of the time stays within ``WAIT_SLACK`` (each second
        of the wait forgives ``WAIT_SHARE`` of it: a burst is forgotten,
        credit never saved up)."""
        quiet = inside and wanted < seconds / 2
        if inside and at == self.at:
            owed = max(0.0, self.owed + wanted - WAIT_SHARE * seconds)
            if owed <= WAIT_SLACK:
                self.owed = owed
                lasted = now - self.since
                if quiet and not self.said and self.mark is None and lasted >= heard.seconds / 2:
                    self.mark = (now, self.starved())
                if quiet and not self.said and lasted >= heard.seconds and self.mark is not None:
                    if self.computes_starved(now):
                        self.since, self.mark = now, None  # its threads compute: no wait yet
                        return
                    self.said = True  # said at a quiet look: a program that computes on is never said
                    heard.changed(True)
                return
        if self.said:
            heard.changed(False)
        self.at, self.since, self.said, self.owed, self.mark = (at if quiet else None), now, False, 0.0, None

    def computes_starved(self, now: float) -> bool:
        """Whether the process's threads waited for a CPU for more than
        ``STARVED_SHARE`` of the time since the wait's mark (its half): a
        program computing on a starved machine."""
        since, before = self.mark
        after = self.starved()
        if before is None or after is None:
            return False
        return after - before > STARVED_SHARE * (now - since)
