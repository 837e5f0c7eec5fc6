"""Child side of ``--checks``: processes compare what they did through the
coordination service's key-value store, from a thread of their own.

A check *posts* an entry under a topic that every process names alike (the
k-th program that spans processes 0-3; the 5th call at ``train.py:48``), with
the ranks that must agree on it.  Posting only queues: the script's thread
never waits on the store.  The board's thread publishes each entry at once,
then looks, every ``POLL`` seconds (``END_POLL`` once the script returned),
whether the other ranks' entries for the topic are there.  A topic is
*settled* when every rank named has posted it, or has finished its script
without posting it (it never made that call);
the check's ``settled`` callback then judges the entries.  With ``same``
given, the first peer entry that differs settles the topic early, once the
others have had ``GATHER_WAIT`` seconds to say theirs too.

Only this thread talks to the store, one round trip per open topic and look;
the script's calls run as they would without jaxrun.  When the script
returns, the board says so in the store (after its last entry), so that a
peer stops waiting for a call this process never made, and it settles what
is still open for at most ``SETTLE`` seconds before JAX's shutdown.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence

from jaxrun import contract
from jaxrun.child import ending

PREFIX = "jaxrun/checks"
THREAD = "jaxrun-checks"  # the board's thread: a program compiled there is a check's own
POLL = 0.05  # seconds between looks while a topic is young (each costs the coordinator a round trip)
END_POLL = 0.01  # ... once the script returned: its end, and its peers', wait on the looks
SLOW_POLL = 0.5  # ... and once it has waited LONG
LONG = 5.0
GATHER_WAIT = 3.0  # after a difference: how long the others have to post theirs
SETTLE = 10.0  # at the script's end: how long open topics may still take

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


_FINISHED = object()  # the queue's last word: the script returned
_WAKE = object()  # the thread is to stop: wakes it from waiting for a post


class Board:
    """One per process: the queue the checks post to, and the thread that
    publishes and settles the posts in order."""

    def __init__(self, rank: int, count: int, client: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.rank, self.count = rank, count
        self.client = client or _jax_client
        self.clock = clock
        self.queue: queue.Queue = queue.Queue()
        self.open: list[Post] = []
        self.outstanding = 0  # queued or open: the script's end waits for 0
        self.done = threading.Condition()
        self.stopped = threading.Event()
        self.returned = False  # the script returned: the looks come faster
        self.nudge = threading.Event()  # the thread's wait between looks ends early: the script returned, or stop
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    # -- the script's side ------------------------------------------------------------
    def post(self, topic: str, entry: dict, among: Sequence[int], settled: Settled,
             same: Callable[[dict, dict], bool] | None = None) -> None:
        """Queue ``entry`` for comparison among ``among`` (this rank included);
        ``settled`` runs on the board's thread.  ``entry`` may be a callable
        that returns it, called on the board's thread."""
        if self.stopped.is_set() or len(set(among)) < 2:
            return
        self._count(1)
        self.queue.put(Post(topic, entry, tuple(sorted(set(among))), settled, same))
        self._ensure_thread()

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
                if not self.open:
                    self._publish(client, self.queue.get())  # sleeps until the next post
                self._take(client)
                if self.open:
                    self._look(client)
                    self.nudge.wait(self._poll())
                    self.nudge.clear()
        except Exception as e:  # noqa: BLE001 - the store gone (coordinator ended): the checks end quietly
            if os.environ.get(contract.VERBOSE) == "1":
                print(f"jaxrun: --checks stopped comparing: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            self.stopped.set()
            with self.done:
                self.done.notify_all()

    def _take(self, client) -> None:
        """Publish every queued entry, in order."""
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            self._publish(client, item)

    def _publish(self, client, item) -> None:
        """An entry into the store, or (after the last) the word that the script returned."""
        if item is _WAKE:
            return
        if item is _FINISHED or client is None:
            if item is _FINISHED and client is not None:
                client.key_value_set(f"{PREFIX}/finished/{self.rank}", "1", allow_overwrite=True)
            self._count(-1)
            return
        item.posted_at = self.clock()
        if callable(item.entry):  # read back here, off the script's thread (an on-device checksum)
            item.entry = item.entry()
        client.key_value_set(f"{PREFIX}/{item.topic}/{self.rank}", json.dumps(item.entry), allow_overwrite=True)
        self.open.append(item)

    def _look(self, client) -> None:
        # Who finished, read before the entries: a rank says so only after its
        # last entry, so one that finished and has no entry never made the call.
        finished = {int(k.rsplit("/", 1)[1]) for k, _ in client.key_value_dir_get(f"{PREFIX}/finished/")}
        still = []
        for post in self.open:
            entries = read_entries(client, post.topic)
            entries[self.rank] = post.entry
            gone = {r for r in post.among if r not in entries and r in finished}
            wanted = {r: entries[r] for r in post.among if r in entries}
            if len(wanted) + len(gone) == len(post.among):
                self._settled(post, wanted, gone)
                continue
            if post.same is not None and post.differs_since is None:
                if any(not post.same(post.entry, e) for r, e in wanted.items() if r != self.rank) or gone:
                    post.differs_since = self.clock()
            if post.differs_since is not None and self.clock() - post.differs_since >= GATHER_WAIT:
                self._settled(post, wanted, gone)
                continue
            still.append(post)
        self.open = still

    def _settled(self, post: Post, entries: dict, gone: set) -> None:
        try:
            post.settled(post.topic, entries, gone)
        finally:
            self._count(-1)

    def _poll(self) -> float:
        young = END_POLL if self.returned else POLL
        if not self.open:
            return young
        oldest = min(p.posted_at for p in self.open)
        return young if self.clock() - oldest < LONG else SLOW_POLL


def read_entries(client, topic: str) -> dict[int, dict]:
    """Every rank's entry under ``topic``, by rank."""
    entries = {}
    for key, value in client.key_value_dir_get(f"{PREFIX}/{topic}/"):
        tail = key.rsplit("/", 1)[1]
        if tail.isdigit():
            try:
                entries[int(tail)] = json.loads(value)
            except ValueError:
                continue
    return entries


def _jax_client():
    from jax._src import distributed

    return distributed.global_state.client


def stop(error: BaseException, lines: Sequence[str]) -> None:
    """A check found a difference: say it, leave the error record, exit 1
    (from the board's thread: the main thread may be waiting in a collective
    that never ends)."""
    text = "".join(f"jaxrun: {line}\n" for line in lines)
    sys.stderr.write(text)
    ending.record_error(error, text + f"{type(error).__name__}: {error}\n")
    ending.exit_now(1)


_board: Board | None = None


def start(rank: int, count: int) -> Board:
    global _board
    if _board is None:
        _board = Board(rank, count)
    return _board


def script_returned() -> None:
    if _board is not None:
        _board.script_returned()
