"""The record trailer a remote process's stderr may end with: taken off the
stream when it is one, and never a byte of the process's own lost when it is
not.  Streams are cut into random pieces, as pipes deliver them."""

from __future__ import annotations

import random

import pytest

from jaxrun import wire
from jaxrun.core.events import Stream
from jaxrun.launcher.pump import OutputPump, _Source

RECORD = '{"type": "ValueError", "message": "bad", "traceback": ""}'


def pump_through(stream: bytes, seed: int) -> tuple[bytes, list[str]]:
    """(bytes passed on, records received) for ``stream`` cut at random."""
    got: list[str] = []
    src = _Source(-1, None, 0, Stream.STDERR)
    src.trailer = got.append
    rng = random.Random(seed)
    out, at = b"", 0
    while at < len(stream):
        step = rng.choice([1, 2, 3, 7, 20, 4096])
        out += OutputPump._hold_trailer(src, stream[at:at + step])
        at += step
    out += OutputPump._release_trailer(src)
    return out, got


@pytest.mark.parametrize("seed", range(20))
def test_a_trailer_is_taken_off_the_end(seed):
    own = b"Traceback...\nValueError: bad\npartial \x00 line"
    out, got = pump_through(own + wire.home_report(RECORD, None), seed)
    assert out == own and got == [(RECORD, None)]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("own", [
    b"before " + wire.HOME_REPORT_MARK + b"not json\nmore bytes after\n",  # the marker mid-stream
    b"ends with half a marker " + wire.HOME_REPORT_MARK[:9],
    wire.home_report(RECORD, None) + b"and then more",  # a trailer is only a trailer at the very end
    b"two " + wire.home_report(RECORD, None) + wire.home_report(RECORD, None),
    b"plain bytes, no marker at all\n" * 50,
])
def test_the_process_own_bytes_are_never_lost(seed, own):
    out, got = pump_through(own, seed)
    assert out == own and got == []


def test_a_huge_false_trailer_is_released_without_waiting_for_the_end():
    src = _Source(-1, None, 0, Stream.STDERR)
    src.trailer = lambda text: None
    first = OutputPump._hold_trailer(src, b"x" + wire.HOME_REPORT_MARK)
    assert first == b"x"
    released = OutputPump._hold_trailer(src, b"y" * wire.MAX_HOME_REPORT)
    assert released == wire.HOME_REPORT_MARK + b"y" * wire.MAX_HOME_REPORT
