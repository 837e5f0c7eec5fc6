"""The wire messages: one spelling, one encoding, both ends, any text."""

import ast
import functools
import importlib
import signal
from pathlib import Path

import pytest

import jaxrun
from jaxrun import contract
from jaxrun.backends.ray import words as ray
from jaxrun.wire import console, encoding, forkserver, inspect, preflight, probe, ssh, tasks

PACKAGE = Path(jaxrun.__file__).parent

EXAMPLES = [
    forkserver.ForkRequest(["--", "train.py", "a b", "ünï\ncode"], {"A": "x y", "EMPTY": ""}),
    forkserver.Ready(""),
    forkserver.Started(4242),
    forkserver.ChildExited(4242, -9),
    forkserver.ChildExited(4242, 0, {"peak_rss_bytes": 1 << 30, "cpu_seconds": 1.5, "oom": None}),
    forkserver.ChildExited(4242, 7, None, 1796161488.9206526),
    ssh.Signal("SIGTERM"),
    ssh.Channel("key-3", ssh.PING),
    ssh.Spawn(["python", "-m", "jaxrun.shim", "a b"], {"TOKEN": "x\ny"}, "/w", "server-1"),
    tasks.TaskHello("f" * 32, 3, "stderr"),
    tasks.Coordinator("10.0.0.1:1234"),
    tasks.Start("[fe80::1]:1234"),
    tasks.TaskJoined(True),
    tasks.JobRecoverable(),
    tasks.TaskActivity(contract.IDLE),
    tasks.Error(contract.ErrorRecord("ValueError", "bad\nvalue", "Traceback ...\n").to_json()),
    tasks.Exit(137),
    tasks.Exit(-9, {"peak_rss_bytes": 7, "cpu_seconds": 0.0, "oom": "the kernel's OOM killer ended it"}),
    tasks.Exit(7, None, 1796161488.9206526, "node-3", 31337),
    tasks.Exit(0, None, 1796161488.5, "node-3", 31337, contract.Marks(1.5, 0.3, 1, 1796161480.0).to_dict()),
    tasks.Ack(),
    preflight.Listen("fe80::1", 0),
    preflight.Connect("10.0.0.1", 1234, 10.0),
    preflight.Unlisten(),
    preflight.Listening(1234),
    preflight.Reached(),
    probe.ProbeResult(list(probe.Sizes().args()), ["node-a", "node-b"], [1, 1], [0.1, 0.25], [[0.02], [0.02]],
                      [[0.0003], [0.0004]], 0.05, "cpu"),
    preflight.Closed(),
    preflight.Failed("Connection refused"),
    console.SessionHello("s" * 64),
    console.SessionReady(),
    console.Execute("for i in range(2):\n    print(i)\n", console.CELL, 7),
    console.Quit(8),
    console.Result(2, "out", "err", "Traceback ...\n", "ValueError", {"text/plain": "1"}, ({"text/html": "<b>"},)),
    console.Reply(7, (console.Result(0, "a"), console.Result(1, error_name="KeyboardInterrupt"))),
    ray.Placed([["node-a", "10.0.0.1"]], "10.0.0.1"),
    ray.DriverFailed("the cluster refused the placement group"),
    ray.Go([[0, ["python", "-m", "jaxrun.shim"], {"A": "b"}]], None),
    inspect.Describe(),
    inspect.JobInfo("20261204-010203-abcdef", 4242, 1796161488.5, ["jaxrun", "-n", "2", "t.py"], "/tmp/l"),
    inspect.AskStacks(2.5),
    inspect.StackDump(1, "localhost", 4243, 0, "waiting", 'Current thread 0x1 (most recent call first):\n'),
    inspect.Stacks((inspect.StackDump(0, "h", None, 0, "starting"),), "no stack dump came from process 0"),
    inspect.AskTable(),
    inspect.TableRow(0, "localhost", 4243, 1, "working", 99.5, 1 << 30, 0.0, "step 3 \x1b[1mloss\x1b[0m"),
    inspect.Table("r", 1, 2, 3, (inspect.TableRow(0, "h", None, 0, "starting"),), True),
    inspect.AskProfile(2.5),
    inspect.ProfilePart(1, ["box-p1.xplane.pb"], ""),
    inspect.ProfileTaken("/l/profile", "/l/profile/plugins/profile/S", "xprof --logdir=/l/profile --port=6006",
                         (inspect.ProfilePart(0, [], "no trace came"),)),
    inspect.Refused("this jaxrun does not answer 'x'"),
]


@functools.cache
def declared_words() -> dict[str, list[str]]:
    """Every ``@message("word")`` in jaxrun's source: {word: [module, ...]}."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for word in words_in(ast.parse(path.read_text())):
            found.setdefault(word, []).append(module)
    return found


def words_in(tree: ast.AST) -> list[str]:
    words = []
    for node in ast.walk(tree):
        for decorator in node.decorator_list if isinstance(node, ast.ClassDef) else ():
            if not (isinstance(decorator, ast.Call) and decorator.args and isinstance(decorator.args[0], ast.Constant)):
                continue
            called = decorator.func
            if (called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)) == "message":
                words.append(decorator.args[0].value)
    return words


def test_every_word_is_declared_once():
    twice = {word: modules for word, modules in declared_words().items() if len(modules) > 1}
    assert len(declared_words()) >= 30
    assert twice == {}


def test_every_declared_message_is_registered_and_has_an_example_that_round_trips():
    for modules in declared_words().values():
        for module in modules:
            importlib.import_module(module)
    registered = encoding.WORDS
    assert set(registered) == set(declared_words())
    assert {type(m).WORD for m in EXAMPLES} == set(registered), "every message needs an example here"
    for word, cls in registered.items():
        assert cls.WORD == word


def test_a_word_that_is_taken_is_refused():
    with pytest.raises(ValueError, match="'exit'"):
        @encoding.message("exit")
        class Leave(encoding.Message):
            code: int
    assert encoding.WORDS["exit"] is tasks.Exit


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_on_one_line(msg):
    line = msg.line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # line-framed channels rely on it
    assert encoding.decode(line) == msg
    assert encoding.decode(msg.encode()) == msg  # packet-framed: no newline
    assert encoding.decode(line.decode()) == msg  # a key-value store holds text


@pytest.mark.parametrize("msg, line", [
    (forkserver.ForkRequest(["--", "ü", "a b"], {"A": ""}), b'fork [["--","\\u00fc","a b"],{"A":""},""]'),
    (forkserver.ChildExited(4242, 7, None, 1.5), b"exited [4242,7,null,1.5]"),
    (ssh.Channel("k", ssh.CONTROL), b'channel ["k","ctrl"]'),
    (ssh.Spawn(["a"], {"B": "c"}, "/w", "srv"), b'spawn [["a"],{"B":"c"},"/w","srv"]'),
    (tasks.TaskHello("s", 3, tasks.STDERR), b'hello ["s",3,"stderr"]'),
    (tasks.TaskJoined(True), b"joined [true]"),
    (tasks.Exit(7, None, 2.5, "node-3", 31337), b'exit [7,null,2.5,"node-3",31337,null]'),
    (tasks.Ack(), b"ack []"),
    (preflight.Connect("10.0.0.1", 1234, 10.0), b'connect ["10.0.0.1",1234,10.0]'),
    (ray.Go([[0, ["a"], {"A": "b"}]], None), b'ray-go [[[0,["a"],{"A":"b"}]],null]'),
    (console.Reply(1, (console.Result(0, "x"),)), b'reply [1,[[0,"x","",null,null,null,[]]]]'),
])
def test_the_bytes_of_a_message_stay_what_they_were(msg, line):
    """A far end and a launcher of one version talk, but what goes on the
    wire moves only on purpose."""
    assert msg.encode() == line


def test_the_in_band_marks_stay_what_they_were():
    assert ssh.JOINED_MARKER == b"\x00\x1bjaxrun-joined\n"
    assert ssh.JOINED_RECOVERABLE_MARKER == b"\x00\x1bjaxrun-joined-recoverable\n"
    assert ssh.ACTIVITY_MARKERS == {contract.BUSY: b"\x00\x1bjaxrun-busy\n", contract.IDLE: b"\x00\x1bjaxrun-idle\n",
                                   contract.PARKED: b"\x00\x1bjaxrun-parked\n",
                                   contract.FINISHED: b"\x00\x1bjaxrun-finished\n"}
    assert ssh.env_frame({"A": "b"}) == b'0000000010{"A": "b"}'
    report = b'\x00\x1bjaxrun-error-record {"error": "e", "resources": null, "pid": 3}\n'
    assert ssh.home_report("e", None, pid=3) == report


def test_the_protocols_share_one_signal_one_exit_and_one_set_of_stream_names():
    assert ssh.Signal is tasks.Signal and ssh.Exit is tasks.Exit and ssh.Started is forkserver.Started
    assert (ssh.CONTROL, ssh.STDOUT, ssh.STDERR) == (tasks.CONTROL, tasks.STDOUT, tasks.STDERR)


def test_what_comes_home_with_a_remote_stream():
    record = contract.ErrorRecord("ValueError", "bad", "Traceback ...\n").to_json()
    used = contract.Resources(123 << 20, 4.25).to_dict()
    facts = {"pid": 4242, "reaped_at": 1796161488.25, "clock": "hostB",
             "marks": contract.Marks(2.5, 0.5, 1, 1796161480.0, clock="hostB").to_dict()}
    assert ssh.parse_home_report(ssh.home_report(record, used, **facts)) == (record, used, facts)
    assert ssh.parse_home_report(ssh.home_report(record, used)) == (record, used, {})  # an older far end
    assert ssh.parse_home_report(ssh.home_report(None, None)) == (None, None, {})
    mark = ssh.HOME_REPORT_MARK
    for junk in (b"[1]", b'{"error": 3, "resources": "x"}', b'{"pid": "1", "reaped_at": true, "clock": 5}'):
        assert ssh.parse_home_report(mark + junk + b"\n") == (None, None, {})
    # A whole number of seconds is still a time; what is not a pid is dropped.
    assert ssh.parse_home_report(mark + b'{"reaped_at": 17, "pid": 1.5}\n') == (None, None, {"reaped_at": 17.0})
    for own in (mark + b"nonsense\n", mark + b"{}\nmore\n", mark + b"{}", b"x" + mark + b"{}\n"):
        assert ssh.parse_home_report(own) is None


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


@pytest.mark.parametrize("data", [b"", b"nonsense", b"exit", b'exit [1, {}, 3, "c", 4, {}, 6]', b"started [not json",
                                  b"hello [1]", b"reply [1, [5]]"])
def test_bad_lines_are_wire_errors(data):
    with pytest.raises(encoding.WireError):
        encoding.decode(data)


def test_signals_travel_by_name():
    msg = ssh.Signal.of(signal.SIGUSR1)
    assert msg.encode() == b'signal ["SIGUSR1"]'
    assert msg.signum == signal.SIGUSR1
    with pytest.raises(encoding.WireError):
        _ = ssh.Signal("SIGNOPE").signum


def test_a_preflight_answer_is_its_mark_and_one_json_object():
    Key = preflight.PreflightKey
    facts = {Key.PYTHON: "3.11.7", Key.JAX: None, Key.GPUS: 8}
    line = preflight.preflight_answer(facts)
    assert line.startswith(preflight.PREFLIGHT_ANSWER) and line.endswith(b"\n") and line.count(b"\n") == 1
    assert preflight.parse_preflight_answer(line) == {"python": "3.11.7", "jax": None, "gpus": 8}
    for junk in (b"jaxrun-preflight [1]", b"jaxrun-preflight {", b'jaxrun-reply {"python": "3"}', b"", b"Welcome!"):
        with pytest.raises(encoding.WireError):
            preflight.parse_preflight_answer(junk)


def test_the_preflights_flags_and_keys_are_distinct():
    flags = [preflight.PREFLIGHT_CHDIR, preflight.PREFLIGHT_SCRIPT, preflight.PREFLIGHT_SYNC,
             preflight.PREFLIGHT_HOLD, preflight.PREFLIGHT_SERVER]
    assert len(set(flags)) == len(flags) and all(f.startswith("--") for f in flags)
    assert len({k.value for k in preflight.PreflightKey}) == len(preflight.PreflightKey)


def test_the_word_check_reads_decorators_of_either_spelling():
    tree = ast.parse('@message("a")\nclass A: pass\n@encoding.message("b")\nclass B: pass\n'
                     '@dataclass\nclass C: pass\n@other("c")\nclass D: pass\n')
    assert words_in(tree) == ["a", "b"]
