"""The pure parts of an interactive session: merging every process's results,
reading blocks as Python's console does, the session's messages, and the
command line of ``-i`` and ``jaxrun kernel``."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from jaxrun import cli, contract
from jaxrun.backends import BACKENDS
from jaxrun.core import modes
from jaxrun.core.config import LaunchError
from jaxrun.launcher.interactive import frontend as interactive, kernelspec, merge, session
from jaxrun.launcher.setup.configure import config_from_args
from jaxrun.wire import console, encoding


def result(rank, out="", err="", error=None, name=None):
    return console.Result(rank, out, err, error, name)


# -- merging -------------------------------------------------------------------------
def test_identical_output_is_shown_once_with_its_ranks():
    out, err = merge.render([result(r, "8\n") for r in range(4)])
    assert out == "[0-3] 8\n" and err == ""


def test_output_that_differs_is_shown_per_process_and_groups_that_agree_share_a_line():
    texts = ["same\n", "one\n", "same\n", "three\n"]
    out, _ = merge.render([result(r, t) for r, t in enumerate(texts)])
    assert out == "[0,2] same\n[1] one\n[3] three\n"


def test_every_line_of_a_group_carries_its_label_and_a_last_partial_line_ends():
    assert merge.merge([(0, "a\nb"), (1, "a\nb")]) == "[0-1] a\n[0-1] b\n"
    assert merge.merge([(0, ""), (1, "")]) == ""


def test_a_traceback_is_shown_once_per_distinct_text_with_the_ranks_that_raised_it():
    tb = 'Traceback (most recent call last):\n  File "<stdin>", line 1, in <module>\nValueError: x\n'
    results = [result(0), result(1, error=tb, name="ValueError"), result(2, error=tb, name="ValueError"),
               result(3, error=tb.replace("x", "y"), name="ValueError")]
    _, err = merge.render(results)
    assert err.count("[1-2] Traceback") == 1 and err.count("[3] Traceback") == 1
    assert "[1-2] ValueError: x" in err and "[3] ValueError: y" in err
    assert merge.raised(results)[0][0] == (1, 2)
    assert merge.error_summary(results) == ("ValueError", "processes 1-3 raised: ValueError: x")
    assert merge.error_summary([result(0, "fine\n")]) is None


# -- reading blocks ---------------------------------------------------------------------
class FakeFrontend:
    """Records what the console would send to the processes."""

    over = False

    def __init__(self):
        self.sent, self.shown = [], []

    def execute(self, source, mode):
        self.sent.append((source, mode))
        return console.Reply(len(self.sent) - 1, (result(0, "ok\n"),))

    def show(self, reply):
        self.shown.append(reply)


def test_a_block_goes_out_whole_when_python_s_console_would_run_it():
    frontend = FakeFrontend()
    reader = interactive.Reader(frontend)
    lines = ["x = 1", "for i in range(2):", "    print(i)", "", "def f():", "    return 1", ""]
    more = [reader.push(line) for line in lines]
    assert more == [False, True, True, False, True, True, False]
    assert frontend.sent == [("x = 1", "single"), ("for i in range(2):\n    print(i)\n", "single"),
                             ("def f():\n    return 1\n", "single")]


def test_exit_in_every_process_ends_the_session_and_in_some_is_shown():
    class Exiting(FakeFrontend):
        def __init__(self, ranks):
            super().__init__()
            self.ranks = ranks

        def execute(self, source, mode):
            return console.Reply(0, tuple(result(r, error="SystemExit: None\n",
                                                  name="SystemExit" if r in self.ranks else None) for r in range(2)))

    with pytest.raises(SystemExit):
        interactive.Reader(Exiting({0, 1})).push("exit()")
    some = Exiting({1})
    assert interactive.Reader(some).push("exit()") is False and len(some.shown) == 1


def test_a_syntax_error_is_shown_here_and_sends_nothing(capsys):
    frontend = FakeFrontend()
    reader = interactive.Reader(frontend)
    assert reader.push("1 +* 2") is False
    assert frontend.sent == [] and "SyntaxError" in capsys.readouterr().err


def test_history_lives_in_the_user_s_state_folder():
    assert interactive.history_path({"XDG_STATE_HOME": "/s"}) == "/s/jaxrun/history"
    assert interactive.history_path({}).endswith("/.local/state/jaxrun/history")


# -- messages ------------------------------------------------------------------------------
def test_messages_round_trip_and_a_reply_rebuilds_its_results():
    reply = console.Reply(3, (console.Result(1, "o", "e", "tb", "ValueError", {"text/plain": "1"},
                                             ({"text/html": "<b>"},)),))
    assert encoding.decode(reply.line()) == reply
    assert type(encoding.decode(reply.line()).results[0]) is console.Result
    for msg in (console.Execute("print(1)", console.CELL, 2), console.Quit(3), console.SessionHello("s"),
                console.SessionReady()):
        assert encoding.decode(msg.line()) == msg
    for junk in (b"reply [1, [5]]", b'session-hello ["s", "later"]', b'{"secret": "s"}'):
        with pytest.raises(encoding.WireError):
            encoding.decode(junk)


def test_a_long_text_keeps_its_end():
    text = "x" * console.MAX_TEXT + "the end"
    clipped = console.clip(text)
    assert clipped.endswith("the end") and len(clipped) < len(text) + 100 and "left out" in clipped


# -- the command line ----------------------------------------------------------------------
def values(*args):
    ctx = cli.main.make_context("jaxrun", [*args, "--dry-run"])
    return ctx.params


def test_i_needs_no_script_and_runs_the_interactive_controller():
    config = config_from_args(values("-n", "2", "-i"), BACKENDS)
    assert type(config.mode) is modes.Terminal and interactive.FRONTENDS[type(config.mode)] is interactive.Console
    assert config.options.target.is_module and config.options.target.name == contract.INTERACTIVE_CONTROLLER_MODULE
    kernel = config_from_args(values("-i", "--kernel-pipe"), BACKENDS)
    assert type(kernel.mode) is modes.Jupyter and interactive.FRONTENDS[modes.Jupyter] is interactive.Pipe
    # What the session mode supplies, decided once in the frozen config: no stall
    # watchdog, never recoverable, the console shows only the frontend.
    assert (config.options.stall_timeout, config.options.recoverable, config.console_ranks) == (0.0, False, frozenset())
    script = config_from_args(values("-n", "2", __file__), BACKENDS)
    assert type(script.mode) is modes.Script and script.console_ranks is None and script.options.stall_timeout == 600
    with pytest.raises(dataclasses.FrozenInstanceError):
        script.max_restarts = 3


@pytest.mark.parametrize("args, message", [
    (("-i", "toy.py"), "-i takes no SCRIPT"),
    (("-i", "--max-restarts", "1"), "-i takes no --max-restarts"),
    (("-i", "--recoverable"), "-i takes no --recoverable"),
    ((), "missing SCRIPT"),
])
def test_i_refuses_what_a_session_cannot_do(args, message):
    with pytest.raises(LaunchError, match=message):
        config_from_args(values(*args), BACKENDS)


def test_kernel_without_ipykernel_says_how_to_install_it_in_one_line():
    program = ("import sys\nsys.modules['ipykernel'] = None\nfrom jaxrun import cli\n"
               "cli.entry_point(sys.argv[1:])\n")
    for args in (["kernel"], ["kernel", "install", "--name", "x", "--", "-n", "2"]):
        done = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr == f"jaxrun: error: {kernelspec.INSTALL_HINT}\n"


def test_help_never_imports_ipykernel():
    program = ("import sys\nfrom jaxrun import cli\ntry:\n    cli.entry_point(sys.argv[1:])\n"
               "except SystemExit:\n    pass\nprint('IPYKERNEL', 'ipykernel' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", program, "--help"], capture_output=True, text=True, timeout=60)
    assert done.stdout.rstrip().endswith("IPYKERNEL False") and "--interactive" in done.stdout


def test_without_a_prefix_the_kernelspec_goes_where_jupyter_looks(tmp_path, monkeypatch):
    kernelspecs = pytest.importorskip("jupyter_client.kernelspec")
    for name in ("JUPYTER_DATA_DIR", "JUPYTER_PLATFORM_DIRS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    folder = kernelspec.install("jax2", ["-n", "2"], None, None)
    assert folder.startswith(str(tmp_path))
    assert kernelspecs.KernelSpecManager().find_kernel_specs()["jax2"] == folder


def test_the_kernelspec_runs_the_kernel_module_with_the_launch_options(tmp_path):
    folder = kernelspec.install("jax4", ["-n", "4", "--cpu-devices", "2"], None, str(tmp_path))
    spec = json.loads((tmp_path / "share/jupyter/kernels/jax4/kernel.json").read_text())
    assert folder == str(tmp_path / "share/jupyter/kernels/jax4")
    assert spec["argv"][1:] == ["-m", "jaxrun.launcher.interactive.kernel", "-f", "{connection_file}", "--",
                                "-n", "4", "--cpu-devices", "2"]
    assert spec["language"] == "python" and spec["interrupt_mode"] == "signal"
    with pytest.raises(LaunchError, match="a kernel's name"):
        kernelspec.install("../x", [], None, str(tmp_path))


def test_the_session_listens_where_process_0_can_reach_it_and_never_on_a_wildcard():
    options = config_from_args(values("-n", "2", "-i"), BACKENDS).options
    assert session.listen_address(options, "127.0.0.1:1234") == "127.0.0.1"
    assert session.listen_address(options, "127.0.0.3:1234") == "127.0.0.1"  # the route to a loopback host
    scheduled = dataclasses.replace(options, scheduled=True)
    assert session.listen_address(scheduled, "", {contract.TASK_CHANNEL_HOST: "127.0.0.7"}) == "127.0.0.7"
    assert session.listen_address(scheduled, "", {contract.TASK_CHANNEL_HOST: "0.0.0.0"}) == "127.0.0.1"
    listener = session.Session()
    try:
        env = listener.listen("127.0.0.1")
        assert listener.listen("127.0.0.2") == env  # bound once, for every attempt
        host, _, port = listener.address.rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0 and len(listener.secret) == 64
        assert env == {contract.CONSOLE_ADDRESS: listener.address, contract.CONSOLE_SECRET: listener.secret}
    finally:
        listener.close()


def test_a_connection_with_a_wrong_secret_is_dropped_and_the_right_one_kept():
    import socket
    import threading

    listener = session.Session()
    listener.listen("127.0.0.1")
    host, _, port = listener.address.rpartition(":")
    clients = []

    def connect(secret):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(console.SessionHello(secret).line())
        clients.append(sock)

    try:
        client = threading.Thread(target=lambda: (connect("wrong"), connect(listener.secret)))
        client.start()
        assert listener.accept(lambda: True)
        client.join()
        assert clients[0].recv(1) == b""  # dropped
        clients[1].sendall(console.Reply(0, (result(0, "hi\n"),)).line())
        assert listener.run("print('hi')", console.SINGLE, lambda: True).results[0].out == "hi\n"
    finally:
        listener.close()
        for sock in clients:
            sock.close()


def test_idle_connections_do_not_hold_up_process_0_s_hello():
    """Connections that never speak (any user of the machine may open them)
    wait each on its own deadline: process 0's hello, after 20 of them and
    more than the old backlog held, is heard at once (issue 70)."""
    import socket
    import time

    listener = session.Session()
    listener.listen("127.0.0.1")
    host, _, port = listener.address.rpartition(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(20)]
    ours = socket.create_connection((host, int(port)), timeout=5)
    try:
        ours.sendall(console.SessionHello(listener.secret).line() + console.Reply(0, (result(0, "hi\n"),)).line())
        started = time.monotonic()
        assert listener.accept(lambda: time.monotonic() - started < 4 * session.HELLO_WAIT)
        assert time.monotonic() - started < session.HELLO_WAIT / 2  # not after the idle ones' deadlines
        # What came right behind the hello is kept for the first statement.
        assert listener.run("print('hi')", console.SINGLE, lambda: True).results[0].out == "hi\n"
        for conn in idle:
            conn.settimeout(5)
            assert conn.recv(1) == b""  # each dropped, none left open
    finally:
        listener.close()
        for conn in [*idle, ours]:
            conn.close()
