"""The wire messages: one spelling, both ends, any text."""

import signal

import pytest

from jaxrun import contract, wire

EXAMPLES = [
    wire.ForkRequest(["--", "train.py", "a b", "ünï\ncode"], {"A": "x y", "EMPTY": ""}),
    wire.Started(4242),
    wire.ChildExited(4242, -9),
    wire.Signal("SIGTERM"),
    wire.Hello("f" * 32, 3, "stderr"),
    wire.Coordinator("10.0.0.1:1234"),
    wire.Start("[fe80::1]:1234"),
    wire.Error(contract.ErrorRecord("ValueError", "bad\nvalue", "Traceback ...\n").to_json()),
    wire.Exit(137),
    wire.Ack(),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_on_one_line(msg):
    line = msg.line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # line-framed channels rely on it
    assert wire.decode(line) == msg
    assert wire.decode(msg.encode()) == msg  # packet-framed: no newline


def test_words_are_unique():
    words = [type(m).WORD for m in EXAMPLES]
    assert len(set(words)) == len(words)


@pytest.mark.parametrize("data", [b"", b"nonsense", b"exit", b"exit [1, 2]", b"started [not json", b"hello [1]"])
def test_bad_lines_are_wire_errors(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_signals_travel_by_name():
    msg = wire.Signal.of(signal.SIGUSR1)
    assert msg.encode() == b'signal ["SIGUSR1"]'
    assert msg.signum == signal.SIGUSR1
    with pytest.raises(wire.WireError):
        wire.Signal("SIGNOPE").signum
