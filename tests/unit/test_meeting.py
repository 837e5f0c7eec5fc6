"""The meeting before a program's first run (jaxrun/child/checks/meeting.py):
a compile alone is no run, a first run meets once, and a meeting waits for
every process of its group and no longer (the programs check's side of
it, a first run, is tests/unit/test_checks_programs.py's).  The parting of a group that never
comes is tests/unit/test_parting.py's; real jobs are tests/e2e/test_meeting.py's."""

from __future__ import annotations

import threading
import time

from jaxrun.child.checks import meeting


class Store:
    """The coordination service's key-value store, as a meeting uses it."""

    def __init__(self):
        self.values, self.changed = {}, threading.Condition()

    def key_value_increment(self, key, by):
        with self.changed:
            self.values[key] = int(self.values.get(key, 0)) + by
            return self.values[key]

    def key_value_set(self, key, value, allow_overwrite=False):
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def key_value_dir_get(self, prefix):
        with self.changed:
            return [(key, value) for key, value in self.values.items() if key.startswith(prefix)]

    def blocking_key_value_get(self, key, timeout_ms):
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.values, timeout_ms / 1000):
                raise RuntimeError("DEADLINE_EXCEEDED: not yet")
            return self.values[key]


class Parting:
    meeting = None

    def __init__(self):
        self.left = 0

    def met(self):  # the main thread's meeting ended
        self.meeting = None
        self.left += 1


def entry(fn="evaluate", at="/w/job.py:10", c="c1"):
    return {"c": c, "fn": fn, "in": "f32[8,4]", "at": at}


def meet_with_bodies(bodies, arrive) -> dict:
    """One process a body, each a thread that calls ``arrive(rank)`` and then
    meets on one store: what each heard of its bodies (alike or not)."""
    store, said = Store(), {}

    def member(rank, body):
        arrive(rank)
        said[rank] = meeting.Meetings(Parting(), client=lambda: store).meet(dict(entry(), h=body),
                                                                              list(range(len(bodies))), main=False)

    # Daemons: a meeting that never ends fails the test, it does not hold pytest's exit.
    threads = [threading.Thread(target=member, args=(rank, body), daemon=True) for rank, body in enumerate(bodies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    return said


def test_a_meeting_waits_for_the_last_of_its_group_and_no_longer():
    store = Store()
    left = {}

    def member(rank, delay, at):
        time.sleep(delay)
        meeting.Meetings(Parting(), client=lambda: store).meet(entry(at=at), [0, 1, 2], main=False)
        left[rank] = time.monotonic()

    came = time.monotonic()
    threads = [threading.Thread(target=member, args=(r, d, f"/host{r}/job.py:{r}")) for r, d in
               ((0, 0.0), (1, 0.05), (2, 0.6))]  # one line or another, one checkout or another: one program
    for thread in threads:
        thread.start()
    threads[0].join(0.3)
    assert threads[0].is_alive() and threads[1].is_alive() and not left, "met before the last came"
    for thread in threads:
        thread.join(5)
    assert sorted(left) == [0, 1, 2]
    assert max(left.values()) - came < 0.6 + 0.5, "waited past the last one's coming"  # a loaded machine's margin


def test_a_program_is_met_on_once_per_process_and_the_main_threads_meeting_is_told():
    store, told = Store(), []
    parting = Parting()
    mine = meeting.Meetings(parting, client=lambda: store)
    peer = threading.Thread(target=meeting.Meetings(Parting(), client=lambda: store).meet,
                            args=(entry(), [0, 1], False))

    def watch():
        while peer.is_alive() or not told:
            if parting.meeting is not None:
                told.append(parting.meeting)
                return
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threading.Timer(0.2, peer.start).start()
    mine.meet(entry(), [0, 1], main=True)
    watcher.join(5)
    name = meeting.meeting_name(entry(), [0, 1])  # one name in every process: waits at it are together
    assert told == [{"fn": "evaluate", "spans": "0,1", "among": [0, 1], "at": "/w/job.py:10", "name": name}]
    assert parting.meeting is None and parting.left == 1  # told it ended: a wait said there is posted anew
    counted = f"{meeting.MEET}/{meeting.meeting_name(entry(), [0, 1])}/b/-"  # the body's count (no body here)
    increments = store.values[counted]
    mine.meet(entry(), [0, 1], main=True)  # agreed: no second meeting
    assert store.values[counted] == increments == 2


def test_programs_that_differ_meet_apart():
    names = {meeting.meeting_name(e, ranks) for e, ranks in (
        (entry(), [0, 1]), (entry(c="c2"), [0, 1]), (entry(fn="train_step"), [0, 1]), (entry(), [0, 1, 2]))}
    assert len(names) == 4
    assert meeting.meeting_name(entry(at="/elsewhere/job.py:99"), [0, 1]) == meeting.meeting_name(entry(), [0, 1])


def test_a_store_that_cannot_count_lets_the_program_run_as_without_the_check():
    class Broken:
        def key_value_increment(self, key, by):
            raise RuntimeError("UNAVAILABLE: no such method on this jax")

    parting = Parting()
    meeting.Meetings(parting, client=Broken).meet(entry(), [0, 1], main=True)  # returns: no wait for ever
    assert parting.meeting is None


def test_the_meeting_says_to_every_member_whether_their_bodies_were_one_and_waits_for_ever_for_neither():
    """Where every process comes with the same body (``entry["h"]``), the
    programs check takes its post back unpublished; a body that differs
    where the collectives agree (a per-process constant) still meets, and
    every member hears that it differed, whoever came last."""
    for bodies, alike in ((("b1", "b1", "b1"), True), (("b1", "b2", "b1"), False), (("b1", "b1", "b2"), False)):
        said = meet_with_bodies(bodies, lambda rank: time.sleep(0.02 * rank))
        assert said == {0: alike, 1: alike, 2: alike}, (bodies, said)
    # Met on once already in this process: nothing compared, nothing to take back.
    store = Store()
    mine = meeting.Meetings(Parting(), client=lambda: store)
    peer = threading.Thread(target=meeting.Meetings(Parting(), client=lambda: store).meet,
                            args=(dict(entry(), h="b1"), [0, 1], False))
    peer.start()
    assert mine.meet(dict(entry(), h="b1"), [0, 1], main=True) is True
    peer.join(5)
    assert mine.meet(dict(entry(), h="b1"), [0, 1], main=True) is False


def test_the_last_to_come_pays_two_round_trips_and_bodies_apart_never_leave_a_member_waiting():
    """The last to come counts itself in and says the word: two calls to the
    store, on a healthy first run's critical path.  Members that come all at
    once, with one body or two, each hear the word, whatever the order."""

    class Counted(Store):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __getattribute__(self, name):
            if name.startswith(("key_value", "blocking")):
                object.__getattribute__(self, "calls").append((threading.current_thread().name, name))
            return object.__getattribute__(self, name)

    store = Counted()
    peers = [threading.Thread(target=meeting.Meetings(Parting(), client=lambda: store).meet, name=f"peer{r}",
                              args=(dict(entry(), h="b1"), [0, 1, 2], False), daemon=True) for r in (1, 2)]
    for peer in peers:
        peer.start()
    while sum(1 for _, name in store.calls if name == "blocking_key_value_get") < 2:
        time.sleep(0.005)
    store.calls.clear()
    assert meeting.Meetings(Parting(), client=lambda: store).meet(dict(entry(), h="b1"), [0, 1, 2], main=True)
    for peer in peers:
        peer.join(5)
    assert [name for who, name in store.calls if who == threading.current_thread().name] == \
        ["key_value_increment", "key_value_set"]
    for round_ in range(30):
        bodies = ("b1", "b1", "b1") if round_ % 2 else ("b1", "b2", "b1")
        start = threading.Barrier(3)
        said = meet_with_bodies(bodies, lambda rank, start=start: start.wait())
        assert said == dict.fromkeys(range(3), bodies == ("b1",) * 3), (round_, said)
