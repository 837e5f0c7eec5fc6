"""The wire messages: one spelling, both ends, any text."""

import signal

import pytest

from jaxrun import contract, wire

EXAMPLES = [
    wire.ForkRequest(["--", "train.py", "a b", "ünï\ncode"], {"A": "x y", "EMPTY": ""}),
    wire.Started(4242),
    wire.ChildExited(4242, -9),
    wire.ChildExited(4242, 0, {"peak_rss_bytes": 1 << 30, "cpu_seconds": 1.5, "oom": None}),
    wire.ChildExited(4242, 7, None, 1796161488.9206526),
    wire.Signal("SIGTERM"),
    wire.Hello("f" * 32, 3, "stderr"),
    wire.Coordinator("10.0.0.1:1234"),
    wire.Start("[fe80::1]:1234"),
    wire.Error(contract.ErrorRecord("ValueError", "bad\nvalue", "Traceback ...\n").to_json()),
    wire.Exit(137),
    wire.Exit(-9, {"peak_rss_bytes": 7, "cpu_seconds": 0.0, "oom": "the kernel's OOM killer ended it"}),
    wire.Exit(7, None, 1796161488.9206526, "node-3", 31337),
    wire.Ack(),
    wire.Listen("fe80::1", 0),
    wire.Connect("10.0.0.1", 1234, 10.0),
    wire.Unlisten(),
    wire.Listening(1234),
    wire.Reached(),
    wire.Closed(),
    wire.Failed("Connection refused"),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_on_one_line(msg):
    line = msg.line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # line-framed channels rely on it
    assert wire.decode(line) == msg
    assert wire.decode(msg.encode()) == msg  # packet-framed: no newline


def test_what_comes_home_with_a_remote_stream():
    record = contract.ErrorRecord("ValueError", "bad", "Traceback ...\n").to_json()
    used = contract.Resources(123 << 20, 4.25).to_dict()
    facts = {"pid": 4242, "reaped_at": 1796161488.25, "clock": "hostB"}
    assert wire.parse_home_report(wire.home_report(record, used, **facts)) == (record, used, facts)
    assert wire.parse_home_report(wire.home_report(record, used)) == (record, used, {})  # an older far end
    assert wire.parse_home_report(wire.home_report(None, None)) == (None, None, {})
    mark = wire.HOME_REPORT_MARK
    for junk in (b"[1]", b'{"error": 3, "resources": "x"}', b'{"pid": "1", "reaped_at": true, "clock": 5}'):
        assert wire.parse_home_report(mark + junk + b"\n") == (None, None, {})
    # A whole number of seconds is still a time; what is not a pid is dropped.
    assert wire.parse_home_report(mark + b'{"reaped_at": 17, "pid": 1.5}\n') == (None, None, {"reaped_at": 17.0})
    for own in (mark + b"nonsense\n", mark + b"{}\nmore\n", mark + b"{}", b"x" + mark + b"{}\n"):
        assert wire.parse_home_report(own) is None


@pytest.mark.parametrize("data, expected", [
    ({"peak_rss_bytes": 5, "cpu_seconds": 1}, contract.Resources(5, 1.0)),
    ({"peak_rss_bytes": "5", "cpu_seconds": 0.5, "oom": "why"}, contract.Resources(5, 0.5, "why")),
    ({"peak_rss_bytes": 5}, None),
    ({"peak_rss_bytes": "lots", "cpu_seconds": 1}, None),
    (None, None),
    ([5, 1], None),
])
def test_resources_from_the_far_end(data, expected):
    assert contract.Resources.from_dict(data) == expected


def test_words_are_unique():
    words = list({type(m): type(m).WORD for m in EXAMPLES}.values())
    assert len(set(words)) == len(words)


@pytest.mark.parametrize("data", [b"", b"nonsense", b"exit", b'exit [1, {}, 3, "c", 4, 5]', b"started [not json",
                                  b"hello [1]"])
def test_bad_lines_are_wire_errors(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_signals_travel_by_name():
    msg = wire.Signal.of(signal.SIGUSR1)
    assert msg.encode() == b'signal ["SIGUSR1"]'
    assert msg.signum == signal.SIGUSR1
    with pytest.raises(wire.WireError):
        _ = wire.Signal("SIGNOPE").signum


def test_a_preflight_answer_is_its_mark_and_one_json_object():
    facts = {wire.PreflightKey.PYTHON: "3.11.7", wire.PreflightKey.JAX: None, wire.PreflightKey.GPUS: 8}
    line = wire.preflight_answer(facts)
    assert line.startswith(wire.PREFLIGHT_ANSWER) and line.endswith(b"\n") and line.count(b"\n") == 1
    assert wire.parse_preflight_answer(line) == {"python": "3.11.7", "jax": None, "gpus": 8}
    for junk in (b"jaxrun-preflight [1]", b"jaxrun-preflight {", b'jaxrun-reply {"python": "3"}', b"", b"Welcome!"):
        with pytest.raises(wire.WireError):
            wire.parse_preflight_answer(junk)


def test_the_preflights_flags_and_keys_are_distinct():
    flags = [wire.PREFLIGHT_CHDIR, wire.PREFLIGHT_SCRIPT, wire.PREFLIGHT_SYNC, wire.PREFLIGHT_HOLD,
             wire.PREFLIGHT_SERVER]
    assert len(set(flags)) == len(flags) and all(f.startswith("--") for f in flags)
    assert len({k.value for k in wire.PreflightKey}) == len(wire.PreflightKey)
