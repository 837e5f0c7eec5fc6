"""Child side of ``--checks``: processes compare what they did through the
coordination service's key-value store, from a thread of their own.

A check *posts* an entry under a topic that every process names alike (the
k-th program that spans processes 0-3; the 5th call at ``train.py:48``), with
the ranks that must agree on it.  Posting only queues: the script's thread
never waits on the store.  The board's thread publishes each entry at once,
under ``ENTRIES/{topic}/{rank}``.

One rank *judges* each topic: the lowest rank named (the next one, once that
one finished its script without posting the topic, or left with it open).  The judge reads the
topic's entries; the topic is *settled* when every rank named has posted it,
or has finished its script without posting it (it never made that call), and
the check's ``settled`` callback then judges the entries.  With ``same``
given, the first peer entry that differs settles the topic early, once the
others have had ``GATHER_WAIT`` seconds to say theirs too.  Where entries
agree, the judge deletes the topic's keys; where they differ, it first writes
every entry under ``VERDICTS/{topic}``, so that the other ranks run their
callback on them too (the odd side of a parted program stops first), and
sweeps both once they have read it.  Every other rank reads only two keys
per look: the verdict, and its own entry (gone: the topic agreed), and once
the topic is ``LONG`` seconds old, whether its judge finished.  So a look at
a topic among N ranks costs the coordinator about 4N keys (the judge's read
of the entries and of who finished, a few small reads by each of the
others), not N reads by each of N ranks.

The store's keys, and the back-off of the looks, are the board's transport
(``checks.store``); here is what the entries mean.  When the script returns, the board says
so in the store (after its last entry), so that a peer stops waiting for a
call this process never made, and it settles what is still open for at most
``SETTLE`` seconds before JAX's shutdown.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence

from jaxrun import contract
from jaxrun.child import ending
from jaxrun.child.checks import store

THREAD = "jaxrun-checks"  # the board's thread: a program compiled there is a check's own
LONG = 5.0  # a topic this old: its judge may have finished without it
GATHER_WAIT = 3.0  # after a difference: how long the others have to post theirs
SETTLE = 10.0  # at the script's end: how long open topics may still take
SWEEP = 60.0  # a verdict's keys are deleted once every rank read it, or after this long

Settled = Callable[[str, dict, set], None]  # (topic, entries by rank, ranks that finished without posting)


@dataclasses.dataclass
class Post:
    topic: str
    entry: dict
    among: tuple[int, ...]
    settled: Settled
    same: Callable[[dict, dict], bool] | None = None
    posted_at: float = 0.0
    differs_since: float | None = None
    judge: int = 0  # the rank that judges it (the lowest named, until it is known to have finished without it)
    pause: float = store.POLL  # until the next look
    next_look: float = 0.0
    hold_until: float = 0.0  # not published before this, unless taken back (``Board.withdraw``) by then
    out: bool = False  # published (or stopped at): too late to take back
    withdrawn: bool = False
    agreed: bool = False  # taken back once published: every rank's meeting found it alike


_FINISHED = object()  # the queue's last word: the script returned
_WAKE = object()  # the thread is to stop: wakes it from waiting for a post


class Board:
    """One per process: the queue the checks post to, and the thread that
    publishes and settles the posts in order."""

    def __init__(self, rank: int, count: int, client: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.rank, self.count = rank, count
        self.client = client or store.jax_client
        self.clock = clock
        self.queue: queue.Queue = queue.Queue()
        self.open: list[Post] = []
        self.sweeps: list[Post] = []  # verdicts this rank wrote, to delete once read
        self.outstanding = 0  # queued or open: the script's end waits for 0
        self.done = threading.Condition()
        self.stopped = threading.Event()
        self.returned = False  # the script returned: the looks come faster
        self.hurried = False  # ... and the board's thread has made them so
        self.nudge = threading.Event()  # the thread's wait between looks ends early: the script returned, or stop
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.held: collections.deque = collections.deque()  # taken from the queue, published in order from here
        self.holding = threading.Lock()  # a held post is published, or taken back, never both

    # -- the script's side ------------------------------------------------------------
    def post(self, topic: str, entry: dict, among: Sequence[int], settled: Settled,
             same: Callable[[dict, dict], bool] | None = None, hold: float = 0.0) -> Post | None:
        """Queue ``entry`` for comparison among ``among`` (this rank included);
        ``settled`` runs on the board's thread.  ``entry`` may be a callable
        that returns it, called on the board's thread.  ``hold``: seconds the
        board keeps it unpublished, and every post after it too (the store
        sees each rank's posts in its script's order), so that the poster may
        take it back (:meth:`withdraw`), at once where the script returned.
        The post, for that; None where nothing was queued."""
        if self.stopped.is_set() or len(set(among)) < 2:
            return None
        self._count(1)
        post = Post(topic, entry, tuple(sorted(set(among))), settled, same,
                    hold_until=self.clock() + hold if hold > 0 else 0.0)
        self.queue.put(post)
        self._ensure_thread()
        return post

    def release(self, post: Post) -> None:
        """Publish a held post now, not when its hold ends (its meeting is
        over, and it compared less than the post does)."""
        with self.holding:
            if post.out or post.withdrawn:
                return
            post.hold_until = 0.0
        self.nudge.set()

    def withdraw(self, post: Post) -> None:
        """Take back a post its meeting found alike in every rank: one still
        held is never published nor judged; one out already (its hold ended
        first) is dropped from the open topics at the board's next look, its
        keys deleted, as a topic judged alike is.  Every rank of it was told
        the same by the meeting, so none waits for an entry another took back."""
        with self.holding:
            if post.withdrawn or post.agreed:
                return
            if post.out:
                post.agreed = True
            else:
                post.withdrawn = True
        if post.agreed:
            self.nudge.set()
        else:
            self._count(-1)

    def script_returned(self) -> None:
        """Say so in the store, after this process's last entry, even where it
        posted nothing: a peer may wait for an entry it will never make (a
        process started again alone checks nothing)."""
        if self.stopped.is_set():
            return
        self._count(1)
        self.returned = True
        self.queue.put(_FINISHED)
        self.nudge.set()  # its word goes out now, not after the look's pause: the peers' ends wait on it
        self._ensure_thread()
        atexit.register(self.settle, SETTLE)

    def settle(self, seconds: float) -> None:
        """Wait for the open topics (at most ``seconds``), then stop the thread
        before JAX's shutdown destroys the store's client."""
        with self.done:
            self.done.wait_for(lambda: self.outstanding == 0 or self.stopped.is_set(), seconds)
        self.stopped.set()
        self.nudge.set()
        self.queue.put(_WAKE)
        if self.thread is not None:
            self.thread.join(1.0)

    def _count(self, change: int) -> None:
        with self.done:
            self.outstanding += change
            self.done.notify_all()

    def _ensure_thread(self) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=THREAD, daemon=True)
                self.thread.start()
                # Stopped before JAX's shutdown (registered earlier: runs later) destroys
                # the store's client, even where the script never returns (a session).
                atexit.register(self.settle, 0.0)

    # -- the board's thread -----------------------------------------------------------
    def _run(self) -> None:
        try:
            client = self.client()
            while not self.stopped.is_set():
                if not self.open and not self.sweeps and not self.held:
                    self.held.append(self.queue.get())  # sleeps until the next post
                self._take(client)
                if self.returned and not self.hurried:
                    self.hurried = True
                    for post in self.open:
                        post.pause, post.next_look = store.END_POLL, self.clock()
                self._look(client)
                self._sweep(client)
                self.nudge.wait(self._pause())
                self.nudge.clear()
            if self.returned and self.open:  # topics it judged hand on to the next rank
                store.say_left(client, self.rank)
        except Exception as e:  # noqa: BLE001 - the store gone (coordinator ended): the checks end quietly
            if os.environ.get(contract.VERBOSE) == "1":
                print(f"jaxrun: --checks stopped comparing: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            self.stopped.set()
            with self.done:
                self.done.notify_all()

    def _take(self, client) -> None:
        """Publish every queued entry, in order, up to the first held one
        whose time has not come (taken back: dropped)."""
        while True:
            try:
                self.held.append(self.queue.get_nowait())
            except queue.Empty:
                break
        while self.held:
            item = self.held[0]
            if isinstance(item, Post):
                with self.holding:
                    if not item.withdrawn and item.hold_until > self.clock() and not self.returned:
                        return
                    item.out = True
            self.held.popleft()
            if not (isinstance(item, Post) and item.withdrawn):
                self._publish(client, item)

    def _publish(self, client, item) -> None:
        """An entry into the store, or (after the last) the word that the script returned."""
        if item is _WAKE:
            return
        if item is _FINISHED or client is None:
            if item is _FINISHED and client is not None:
                store.say_finished(client, self.rank)
            self._count(-1)
            return
        item.posted_at = item.next_look = self.clock()
        item.pause = store.END_POLL if self.returned else store.POLL
        item.next_look += item.pause
        item.judge = item.among[0]
        if callable(item.entry):  # read back here, off the script's thread (an on-device checksum)
            item.entry = item.entry()
        store.publish(client, item.topic, self.rank, item.entry)
        self.open.append(item)

    def _pause(self) -> float:
        """Seconds to the next look that is due (the board's thread waits that long)."""
        due = [p.next_look for p in self.open] + [p.next_look for p in self.sweeps]
        if self.held and isinstance(self.held[0], Post):
            due.append(self.held[0].hold_until)
        return max(0.0, min(due) - self.clock()) if due else store.SLOW_POLL

    def _look(self, client) -> None:
        """Look at each open topic that is due, and at every older one with it
        (oldest first): judge it, or read its verdict.  A difference is named
        at its first call, not at whichever topic's backed-off look came due
        first (examples/replica_across.py once named its third)."""
        agreed = [post for post in self.open if post.agreed]  # read once: the main thread may be taking one back
        if agreed:
            for post in agreed:
                store.agreed(client, post.topic)
                self._count(-1)
            done = {id(post) for post in agreed}
            self.open = [post for post in self.open if id(post) not in done]
        now, still, finished = self.clock(), [], store.Finished(client)
        due = [i for i, post in enumerate(self.open) if post.next_look <= now]
        last = due[-1] if due else -1
        for i, post in enumerate(self.open):
            if i > last:
                still.append(post)
                continue
            if post.next_look <= now:  # an older topic looked at early keeps its own back-off
                post.next_look = now + post.pause
                post.pause = store.backed_off(post.pause)
            if post.judge == self.rank:
                done = self._judge(client, post, finished, still)
            else:
                done = self._follow(client, post, now)
            if not done:
                still.append(post)
        self.open = still

    def _judge(self, client, post: Post, finished: store.Finished, older: list[Post] | None = None) -> bool:
        """Settle ``post`` if its entries are in.  Before a difference is
        settled, the ``older`` topics this rank judges that this look found
        incomplete are judged again: each rank posts in its script's order,
        so a peer whose entry for this topic is here has its older ones here
        too, though they may have come after this look read those topics."""
        entries = store.entries(client, post.topic)
        entries[self.rank] = post.entry
        wanted = {r: entries[r] for r in post.among if r in entries}
        gone: set = set()
        if len(wanted) < len(post.among):
            gone = {r for r in post.among if r not in wanted and r in finished.ranks()}
            if gone:  # each posted every entry before it said it finished: read again, after that word
                entries = store.entries(client, post.topic)
                wanted.update({r: entries[r] for r in gone if r in entries})
                gone = {r for r in gone if r not in wanted}
        differs = post.same is not None and any(not post.same(post.entry, e) for e in wanted.values())
        if len(wanted) + len(gone) < len(post.among):
            if (differs or gone) and post.differs_since is None:
                post.differs_since = self.clock()
            if post.differs_since is None or self.clock() - post.differs_since < GATHER_WAIT:
                return False
        if differs and older:
            older[:] = [p for p in older if p.judge != self.rank or not self._judge(client, p, finished)]
        if differs:  # the others judge these entries too: the verdict first, swept once read
            store.post_verdict(client, post.topic, wanted, gone)
            post.next_look, post.posted_at = self.clock() + store.SLOW_POLL, self.clock()
            self.sweeps.append(post)
        else:
            store.agreed(client, post.topic)
        self._settled(post, wanted, gone)
        return True

    def _follow(self, client, post: Post, now: float) -> bool:
        verdict = store.verdict(client, post.topic, self.rank)
        if verdict is not None:
            self._settled(post, *verdict)
            return True
        if not store.has_entry(client, post.topic, self.rank):
            self._count(-1)  # the judge found every entry alike and deleted them
            return True
        if now - post.posted_at >= LONG and store.finished(client, post.judge) and (
                not store.has_entry(client, post.topic, post.judge) or store.left(client, post.judge)):
            later = [r for r in post.among if r > post.judge]  # it finished without the topic, or left: the next judges
            post.judge = later[0] if later else self.rank
            post.next_look = now
        return False

    def _sweep(self, client) -> None:
        """Delete a verdict's keys once every other rank has read it (each
        deletes its own entry), or once it is ``SWEEP`` seconds old."""
        now, still = self.clock(), []
        for post in self.sweeps:
            if post.next_look > now:
                still.append(post)
                continue
            unread = set(store.entries(client, post.topic)) - {self.rank}
            if unread and now - post.posted_at < SWEEP:
                post.next_look = now + store.SLOW_POLL
                still.append(post)
                continue
            store.sweep(client, post.topic)
        self.sweeps = still

    def _settled(self, post: Post, entries: dict, gone: set) -> None:
        try:
            post.settled(post.topic, entries, gone)
        finally:
            self._count(-1)


def stop(error: BaseException, lines: Sequence[str]) -> None:
    """A check found a difference: say it, leave the error record, exit 1
    (from the board's thread: the main thread may be waiting in a collective
    that never ends)."""
    text = "".join(f"jaxrun: {line}\n" for line in lines)
    ending.judged(error, text, text + f"{type(error).__name__}: {error}\n")


_board: Board | None = None


def start(rank: int, count: int) -> Board:
    global _board
    if _board is None:
        _board = Board(rank, count)
    return _board


def script_returned() -> None:
    if _board is not None:
        _board.script_returned()
