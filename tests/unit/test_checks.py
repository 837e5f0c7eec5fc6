"""--checks: the option, its way to every process, and the board the default
checks compare through (its settling rules, against an in-memory store; the
real store is exercised by tests/e2e/test_checks_*.py)."""

from __future__ import annotations

import threading
import time

import pytest

from jaxrun import cli, contract
from jaxrun.child import agreement, checks, hooks
from jaxrun.launcher.setup import plan as planning


def parse(*args):
    return cli.main.make_context("jaxrun", list(args)).params


@pytest.mark.parametrize("args, mode", [
    (["train.py"], "on"),
    (["--checks", "strict", "train.py"], "strict"),
    (["--checks=off", "train.py"], "off"),
    (["train.py", "--checks", "off"], "on"),  # the script's own
])
def test_the_checks_are_on_unless_asked_otherwise(args, mode):
    assert parse(*args)["checks"] == mode


def test_an_unknown_mode_is_refused_at_parse_time():
    with pytest.raises(Exception, match="'loud' is not one of"):
        parse("--checks", "loud", "train.py")


@pytest.mark.parametrize("mode", contract.CHECKS_MODES)
def test_the_mode_reaches_every_process_through_the_environment(mode):
    opts = planning.LaunchOptions(target=planning.Target("t.py"), num_processes=2, coordinator="h:1", run_id="r",
                                  checks=mode)
    assert [spec.env[contract.CHECKS] for spec in planning.plan(opts)] == [mode, mode]


@pytest.mark.parametrize("environ, mode", [({}, "on"), ({contract.CHECKS: "strict"}, "strict"),
                                           ({contract.CHECKS: "off"}, "off"), ({contract.CHECKS: "???"}, "off")])
def test_the_child_reads_its_mode_and_an_unset_one_is_on(environ, mode):
    assert checks.mode(environ) == mode


@pytest.mark.parametrize("environ, count", [({contract.CHECKS: "off"}, 4), ({}, 1)])
def test_off_or_alone_nothing_waits_for_jax(monkeypatch, environ, count):
    monkeypatch.setattr(hooks._finder, "patches", {})
    checks.prepare(environ, 0, count)
    assert "jax" not in hooks._finder.patches
    checks.script_returned()  # and the shim's word costs nothing


class Store:
    """The key-value calls the board makes, in memory."""

    def __init__(self):
        self.data: dict[str, str] = {}
        self.lock = threading.Lock()

    def key_value_set(self, key, value, allow_overwrite=False):
        with self.lock:
            assert allow_overwrite or key not in self.data
            self.data[key] = value

    def key_value_dir_get(self, prefix):
        with self.lock:
            return [(k, v) for k, v in self.data.items() if k.startswith(prefix)]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def boards(count: int, store: Store, clock=None) -> list[agreement.Board]:
    return [agreement.Board(rank, count, client=lambda: store, clock=clock or Clock()) for rank in range(count)]


def same_fp(mine, theirs):
    return mine["fp"] == theirs["fp"]


def test_a_topic_settles_once_every_rank_named_has_posted():
    store, seen = Store(), []
    ones = boards(3, store)
    for rank, board in enumerate(ones):
        board._publish(store, agreement.Post("p/0", {"fp": "a", "r": rank}, (0, 1, 2), lambda *a: seen.append(a)))
        board._count(1)
    ones[0]._look(store)
    assert len(seen) == 1
    topic, entries, gone = seen[0]
    assert topic == "p/0" and sorted(entries) == [0, 1, 2] and gone == set()
    assert ones[0].outstanding == 0 and not ones[0].open


def test_a_rank_missing_keeps_the_topic_open_until_it_finishes_without_posting():
    store, seen = Store(), []
    one, two = boards(2, store)
    one._publish(store, agreement.Post("p/0", {"fp": "a"}, (0, 1), lambda *a: seen.append(a)))
    one._count(1)
    one._look(store)
    assert not seen and len(one.open) == 1  # rank 1 has not got there yet
    two._count(1)
    two._publish(store, agreement._FINISHED)  # its script returned without that call
    one._look(store)
    assert seen == [("p/0", {0: {"fp": "a"}}, {1})]


def test_a_difference_settles_early_once_the_others_had_time_to_post():
    store, seen, clock = Store(), [], Clock()
    ones = boards(3, store, clock)
    ones[0]._publish(store, agreement.Post("p/0", {"fp": "a"}, (0, 1, 2), lambda *a: seen.append(a), same_fp))
    ones[2]._publish(store, agreement.Post("p/0", {"fp": "b"}, (0, 1, 2), lambda *a: None, same_fp))
    ones[0]._look(store)
    assert not seen  # rank 1 may still say which side it is on
    clock.now += agreement.GATHER_WAIT
    ones[0]._look(store)
    assert seen == [("p/0", {0: {"fp": "a"}, 2: {"fp": "b"}}, set())]


def test_posts_are_published_in_order_and_the_finished_word_comes_after_the_last():
    store = Store()
    board = agreement.Board(0, 2, client=lambda: store)
    order = []
    real_set = store.key_value_set

    def noting(key, value, allow_overwrite=False):
        order.append(key)
        real_set(key, value, allow_overwrite)

    store.key_value_set = noting
    for k in range(3):
        board.post(f"p/{k}", {"fp": "a"}, (0, 1), lambda *a: None)
    board.script_returned()
    board.settle(0.5)  # rank 1 never posts: the end waits a bounded time
    assert order == [f"{agreement.PREFIX}/p/{k}/0" for k in range(3)] + [f"{agreement.PREFIX}/finished/0"]
    assert not board.thread.is_alive()


def test_an_entry_given_as_a_callable_is_made_on_the_boards_thread():
    store, made_on = Store(), []
    one, two = boards(2, store)

    def entry():
        made_on.append(threading.current_thread().name)
        return {"fp": "a"}

    seen = []
    one.post("p/0", entry, (0, 1), lambda *a: seen.append(a))
    two.post("p/0", {"fp": "a"}, (0, 1), lambda *a: None)
    one.script_returned()
    two.script_returned()
    one.settle(5.0)
    two.settle(5.0)
    assert made_on == ["jaxrun-checks"]
    assert seen == [("p/0", {0: {"fp": "a"}, 1: {"fp": "a"}}, set())]


def test_a_post_among_one_rank_alone_is_not_made():
    board = agreement.Board(0, 2, client=lambda: Store())
    board.post("p/0", {"fp": "a"}, (0,), lambda *a: None)
    assert board.thread is None and board.outstanding == 0


def test_a_process_that_posted_nothing_still_says_it_finished():
    """A peer may wait for an entry this process never makes (started again
    alone, it checks nothing): the word that its script returned ends that wait."""
    store = Store()
    board = agreement.Board(1, 2, client=lambda: store)
    board.script_returned()
    board.settle(5.0)
    assert store.data == {f"{agreement.PREFIX}/finished/1": "1"}


def test_the_finished_word_goes_out_at_once_while_a_topic_waits(monkeypatch):
    """The peers' ends wait on it: it must not wait out the pause between
    looks (made long here, so that waiting it out would show)."""
    monkeypatch.setattr(agreement, "POLL", 5.0)
    store = Store()
    board = agreement.Board(0, 2, client=lambda: store)
    board.post("p/0", {"fp": "a"}, (0, 1), lambda *a: None)  # rank 1 never posts: the topic stays open
    deadline = time.monotonic() + 2.0
    while not board.open and time.monotonic() < deadline:
        time.sleep(0.005)
    assert board.open, "the board's thread did not take the post"
    time.sleep(0.05)  # the thread is in its pause between looks now
    asked = time.monotonic()
    board.script_returned()
    while f"{agreement.PREFIX}/finished/0" not in store.data and time.monotonic() < asked + 4.0:
        time.sleep(0.005)
    took = time.monotonic() - asked
    board.settle(0.0)
    assert took < 1.0, f"the finished word took {took:.2f} s"
