"""Start-up progress: the joined count and who is not yet in, drawn live on a
terminal or as one line off it.  (The joined marker an SSH process's stderr
carries is cut out by its child's stream filter: see test_ssh_stream.)"""

from __future__ import annotations

import io

import pytest

from jaxrun.core.events import Stream
from jaxrun.core.spec import LOCAL_HOST, Host, ProcessSpec
from jaxrun.launcher.attempt.joins import (
    JOIN_NAMING_AFTER,
    MAX_NAMED,
    SAY_JOINED_AFTER,
    Joins,
    done_line,
    live_line,
    waiting_text,
)
from jaxrun.launcher.output.printer import ERASE_LINE, ConsolePrinter

pytestmark = pytest.mark.timeout(30)


def specs(hosts):
    return [ProcessSpec(rank, 0, host, "python", ("x.py",), {}) for rank, host in enumerate(hosts)]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Screen:
    """What Joins asked the display for, in order."""

    def __init__(self):
        self.calls: list[tuple[str, str | None]] = []

    def status(self, line):
        self.calls.append(("status", line))

    def note(self, line):
        self.calls.append(("note", line))


def progress(hosts, live, files=None, say_after=SAY_JOINED_AFTER):
    clock, screen = Clock(), Screen()
    files = files if files is not None else set()
    removed = []

    def remove(path):
        removed.append(path)
        files.discard(path)

    p = Joins(specs(hosts), screen.status, screen.note, live=live, clock=clock,
                     exists=files.__contains__, remove=remove, say_after=say_after)
    return p, clock, screen, files, removed


def test_lines_read_as_the_user_expects():
    assert live_line(6, 8, 1.0) == "jaxrun: 6/8 processes joined"
    assert live_line(6, 8, 12.7, [(3, "host-b"), (5, None)]) == \
        "jaxrun: 6/8 processes joined; waiting 12 s for process 3 (host-b), process 5"
    assert done_line(8, 2.34) == "jaxrun: 8/8 processes joined in 2.3 s"


def test_a_long_list_of_absentees_is_bounded():
    waiting = [(r, f"h{r}") for r in range(MAX_NAMED + 5)]
    text = waiting_text(waiting)
    assert text.endswith(" and 5 more")
    assert text.count("process ") == MAX_NAMED


def test_on_a_terminal_the_count_rises_then_names_the_late_ones_then_ends_in_one_line():
    hosts = [LOCAL_HOST, Host("host-b"), Host("host-c")]
    p, clock, screen, files, removed = progress(hosts, live=True)
    p.begin()
    for rank in range(3):
        p.watch(rank, f"/logs/{rank}.joined")
    assert p.tick() == pytest.approx(clock.now + 0.25)
    files.add("/logs/0.joined")
    clock.now += 1
    p.tick()
    p.joined(2)  # as an agent reports it
    clock.now += 1
    p.tick()
    assert [c for c in screen.calls if c[0] == "status"] == [
        ("status", "jaxrun: 0/3 processes joined"),
        ("status", "jaxrun: 1/3 processes joined"),
        ("status", "jaxrun: 2/3 processes joined"),
    ]
    assert removed == ["/logs/0.joined", "/logs/2.joined"]  # seen, so gone from the log folder
    p.tick()  # nothing new: nothing redrawn
    assert len(screen.calls) == 3
    clock.now += JOIN_NAMING_AFTER
    p.tick()
    assert screen.calls[-1] == ("status", "jaxrun: 2/3 processes joined; waiting 7 s for process 1 (host-b)")
    files.add("/logs/1.joined")
    clock.now += 0.25
    assert p.tick() is None
    assert screen.calls[-2:] == [("status", None), ("note", "jaxrun: 3/3 processes joined in 7.2 s")]
    clock.now += 1
    assert p.tick() is None
    p.finish()
    assert screen.calls[-1][0] == "note"  # nothing after the final line


def test_off_a_terminal_only_the_final_line():
    p, clock, screen, files, _ = progress([LOCAL_HOST] * 2, live=False)
    p.begin()
    p.watch(0, "a")
    p.watch(1, "b")
    clock.now += 10
    p.tick()
    files.update({"a", "b"})
    clock.now += 0.5
    p.tick()
    p.tick()
    assert screen.calls == [("note", "jaxrun: 2/2 processes joined in 10.5 s")]


def test_a_process_ending_before_it_joined_erases_the_line_and_says_no_more():
    p, clock, screen, files, removed = progress([LOCAL_HOST] * 3, live=True)
    p.begin()
    for rank in range(3):
        p.watch(rank, f"{rank}.joined")
    files.add("0.joined")
    p.tick()
    p.ended(1)
    assert screen.calls[-1] == ("status", None)
    files.update({"1.joined", "2.joined"})
    assert p.tick() is None
    assert all(kind == "status" for kind, _ in screen.calls)
    p.finish()
    assert set(removed) == {"0.joined", "1.joined", "2.joined"}  # none left in the log folder


def test_a_one_process_job_shows_nothing_but_its_join_is_heard():
    p, clock, screen, files, removed = progress([LOCAL_HOST], live=True)
    heard = []
    p.on_join = lambda rank, recoverable: heard.append(rank)
    p.begin()
    p.watch(0, "0.joined")
    assert p.tick() is not None  # looked for: the run's goodput counts its start-up to the join
    files.add("0.joined")
    assert p.tick() is None
    p.finish()
    assert screen.calls == [] and heard == [0] and "0.joined" in removed


# -- the console keeps the live line apart from the output ----------------------------

def test_output_and_notes_are_printed_above_the_live_line():
    out, err = io.BytesIO(), io.BytesIO()
    printer = ConsolePrinter(stdout=out, stderr=err)
    printer.status("jaxrun: 1/2 processes joined")
    printer.write(0, Stream.STDOUT, b"hello\n")
    printer.write(1, Stream.STDERR, b"warn\n")
    printer.flush()
    printer.note("jaxrun: a note")
    printer.status(None)
    printer.flush()  # nothing pending, no live line: nothing written
    live = b"jaxrun: 1/2 processes joined"
    assert err.getvalue() == (ERASE_LINE + live + ERASE_LINE + b"[1] warn\n" + live
                              + ERASE_LINE + b"jaxrun: a note\n" + live + ERASE_LINE)
    assert out.getvalue() == b"[0] hello\n"


def test_no_live_line_off_a_terminal():
    assert not ConsolePrinter(stdout=io.BytesIO(), stderr=io.BytesIO()).can_show_status()


def test_a_process_that_joined_and_ended_between_two_looks_counts_as_joined():
    """The last one joins and is gone within one poll: the final line is still drawn."""
    p, clock, screen, files, _ = progress([LOCAL_HOST] * 2, live=True)
    p.begin()
    p.watch(0, "0.joined")
    p.watch(1, "1.joined")
    files.add("0.joined")
    p.tick()
    files.add("1.joined")
    clock.now += 6.0  # a slow join: its line is said
    p.ended(1)  # before the next tick looked
    assert screen.calls[-2:] == [("status", None), ("note", "jaxrun: 2/2 processes joined in 6.0 s")]
    assert p.tick() is None


@pytest.mark.parametrize("live", [True, False], ids=["terminal", "no-terminal"])
def test_a_quick_join_says_nothing_and_quiet_never_does(live):
    """Issue 68: all being well (every process in within SAY_JOINED_AFTER)
    leaves no line; a live line is erased; -q (say_after None) says not
    even a slow join."""
    for say_after, wait, said in ((SAY_JOINED_AFTER, 0.5, False), (SAY_JOINED_AFTER, 6.0, True), (None, 6.0, False)):
        p, clock, screen, files, _ = progress([LOCAL_HOST] * 2, live=live, say_after=say_after)
        p.begin()
        p.watch(0, "0.joined")
        p.watch(1, "1.joined")
        files.add("0.joined")
        p.tick()
        clock.now += wait
        files.add("1.joined")
        assert p.tick() is None
        notes = [call for call in screen.calls if call[0] == "note"]
        assert notes == ([("note", f"jaxrun: 2/2 processes joined in {wait:.1f} s")] if said else []), (say_after, wait)
        if live:
            assert screen.calls[-1] == (("note", notes[0][1]) if said else ("status", None))
