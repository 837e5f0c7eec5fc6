"""The SSH backend's pure parts: command lines, quoting, preflight checks (no sshd)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from jaxrun import __version__, contract
from jaxrun.backends.ssh import commands
from jaxrun.backends.ssh.options import SshOptions
from jaxrun.core.spec import Host, ProcessSpec

SETTINGS = SshOptions(python="/opt/py", chdir="/w", config_file="cfg", options=("Compression=yes",))


def test_ssh_args_order():
    args = commands.ssh_args(SETTINGS, Host("n1", user="bob", port=2222), commands.session_control("/c/m0"))
    assert args == [
        "ssh", "-F", "cfg", "-o", "BatchMode=yes",
        "-o", "ControlMaster=no", "-o", "ControlPath=/c/m0", "-o", "LogLevel=ERROR",
        "-o", "Compression=yes", "-o", "ConnectTimeout=10",
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-T", "-p", "2222", "--", "bob@n1",
    ]


def test_the_users_keepalive_wins():
    """ssh keeps an option's first value: the user's -o ServerAliveInterval
    comes before jaxrun's default."""
    settings = SshOptions(python="/opt/py", chdir="/w", options=("ServerAliveInterval=60",))
    args = commands.ssh_args(settings, Host("n1"), [])
    assert args.index("ServerAliveInterval=60") < args.index("ServerAliveInterval=5")


def test_session_without_master_connects_directly():
    assert "ControlPath=none" in commands.session_control(None)


def test_master_does_not_persist():
    assert commands.master_control("/c/m0") == [
        "-o", "ControlMaster=yes", "-o", "ControlPath=/c/m0", "-o", "ControlPersist=no",
    ]


def test_remote_command_quotes_every_word_and_holds_no_value():
    spec = ProcessSpec(0, 0, Host("n1"), "/opt/py", ("--", "t.py", "a b", "$X", "'"), {"A": "secret y"})
    words = commands.process_words(spec, "/my dir", "/opt/py")
    assert words == [
        "/opt/py", "-c", commands.RUN_MODULE, "jaxrun.backends.ssh.session_agent", "--chdir", "/my dir", "--",
        "/opt/py", "-m", "jaxrun.shim", "--", "t.py", "a b", "$X", "'",
    ]
    assert shlex.split(commands.remote_command(words)) == words
    assert not any("secret" in w for w in words)


def test_remote_env_is_the_specs_without_launcher_paths():
    spec = ProcessSpec(0, 0, Host("n1"), "/opt/py", ("t.py",), {"A": "x y"})
    env = commands.process_env(spec, {"JAXRUN_ERROR_FILE": "/l/e.json", "JAXRUN_LIFELINE_FD": "5", "B": "1"})
    assert env == {"A": "x y", "B": "1"}


def test_env_stub_reads_exactly_one_frame(tmp_path):
    """The stub every session program starts with, run for real: it takes the
    frame off stdin and leaves the rest (the signal lines) unread."""
    import subprocess
    import sys

    from jaxrun.wire import ssh

    program = commands.ENV_STUB + "import sys\nprint(os.environ['SECRET'], sys.path[1], sys.stdin.read(), end='')\n"
    frame = ssh.env_frame({"SECRET": "tok 1", "PYTHONPATH": "/x/y"})
    done = subprocess.run([sys.executable, "-c", program], input=frame + b"signal [\"SIGTERM\"]\n",
                          capture_output=True, check=True)
    assert done.stdout.decode() == 'tok 1 /x/y signal ["SIGTERM"]\n'


@pytest.mark.parametrize("code, status", [(0, 0), (1, 1), (128, 128), (130, -2), (137, -9), (255, 255), (-9, -9)])
def test_remote_status(code, status):
    assert contract.returncode_from_status(code) == status


def test_join_address():
    assert contract.join_address("10.0.0.1", 5) == "10.0.0.1:5"
    assert contract.join_address("fe80::1", 5) == "[fe80::1]:5"


def _info(**kw):
    info = {"python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.10.2", "jaxrun": __version__, "address": "10.0.0.1"}
    info.update(kw)
    return info


def test_preflight_all_good():
    assert commands.check_preflight({"a": _info(), "b": _info(python="3.11.9")}, "py") == []


def test_preflight_problems_name_hosts():
    problems = commands.check_preflight(
        {
            "a": _info(),
            "b": _info(jax="0.4.1"),
            "c": _info(jaxrun=None, jaxrun_error="ModuleNotFoundError: No module named 'jaxrun'"),
            "d": _info(jaxrun="9.9"),
            "e": _info(chdir_error="cannot change to '/w': No such file or directory"),
        },
        "py",
    )
    assert problems == [
        "c: cannot import jaxrun with py (ModuleNotFoundError: No module named 'jaxrun')",
        f"d: jaxrun 9.9 there, {__version__} here",
        "e: cannot change to '/w': No such file or directory",
        "hosts disagree on the jax version: a has 0.10.2, b has 0.4.1, c has 0.10.2, d has 0.10.2, e has 0.10.2",
    ]


def test_preflight_table():
    lines = commands.preflight_table({"hostA": _info(), "b": _info(jaxlib=None)})
    assert lines[0].split() == ["jaxrun:", "host", "address", "python", "jax", "jaxlib", "jaxrun"]
    assert lines[2].split() == ["jaxrun:", "b", "10.0.0.1", "3.11.7", "0.10.2", "-", __version__]


def test_a_script_missing_on_a_host_is_named_with_the_way_out():
    problems = commands.check_preflight({"n1": _info(), "n2": _info(script_missing="/w/main.py")}, "/opt/py")
    assert problems == ["n2: /w/main.py does not exist there (--sync copies the working directory to every host)"]


def test_preflight_words_carry_the_script_and_sync_but_no_env():
    from jaxrun.backends.ssh import preflight
    from jaxrun.backends.ssh.options import SshOptions

    words = commands.preflight_words(SshOptions(python="/opt/py", chdir="/w", env={"TOKEN": "s3cret"},
                                           script="main.py", sync=True))
    assert words[:3] == ["/opt/py", "-c", commands.PREFLIGHT]
    assert words[3:] == [__version__, contract.SSH_PREFLIGHT_MODULE, "--chdir=/w", "--script=main.py", "--sync"]
    assert not any("s3cret" in w for w in words)
    first = commands.preflight_words(SshOptions(python="/opt/py", chdir="/-w"), ["mod"], hold=True)
    assert first[5:] == ["--chdir=/-w", "--hold", "--server", "mod"]  # the server's name: in its environment
    # The far end reads them as they were meant.
    args = preflight.parse_args(words[5:])
    assert (args.chdir, args.script, args.sync, args.hold, args.server) == ("/w", "main.py", True, False, None)
    args = preflight.parse_args(first[5:])
    assert (args.chdir, args.script, args.sync, args.hold, args.server) == ("/-w", "", False, True, ["mod"])
    args = preflight.parse_args(commands.preflight_words(SshOptions(python="/opt/py", chdir="/w"), [])[5:])
    assert args.server == []  # a server without --preload-module


def test_no_command_line_names_the_host_s_server():
    """Its name is a secret: another user who reads it (ps, /proc) can bind it
    first.  It travels in the environment frame on stdin (issue 70)."""
    spec = ProcessSpec(0, 0, Host("n1"), "/opt/py", ("t.py",), {})
    for words in (commands.server_words("/opt/py", "/w", ["mod"]), commands.process_words(spec, "/w", "/opt/py")):
        assert not any(w.startswith("jaxrun-") or w in ("--forkserver",) for w in words[3:]), words


def test_a_host_that_could_not_run_the_preflight_is_checked_on_what_it_said():
    """Another jaxrun, or none: the stub says which, and nothing of jax."""
    problems = commands.check_preflight({"a": _info(), "b": {"python": "3.11.7", "jaxrun": "9.9"},
                                    "c": {"python": "3.12.1", "jaxrun": None, "jaxrun_error": "E: no"}}, "py")
    assert problems == [f"b: jaxrun 9.9 there, {__version__} here", "c: cannot import jaxrun with py (E: no)",
                        "hosts disagree on the python version: a has 3.11.7, b has 3.11.7, c has 3.12.1"]
    assert commands.check_preflight({"a": _info(), "b": _info(jax=None)}, "py")[0] == "b: jax is not installed for py"


def test_the_setup_runs_first_in_the_remote_shell_and_the_words_stay_whole(tmp_path):
    """What ssh hands the remote shell, run by a real sh: the user's set-up
    code first (its variables reach the command), then the quoted words."""
    words = ["printf", "%s|", "a b", "$HOME", "it's", "`id`"]
    setup = "SETUP_SAYS='made here'; export SETUP_SAYS  # module load would go here"
    done = subprocess.run(["sh", "-c", commands.remote_command([*words, "$SETUP_SAYS"], setup)],
                          capture_output=True, text=True, timeout=10)
    assert done.stdout == "a b|$HOME|it's|`id`|$SETUP_SAYS|", done
    shown = subprocess.run(["sh", "-c", commands.remote_command(["sh", "-c", 'echo "$SETUP_SAYS"'], setup)],
                           capture_output=True, text=True, timeout=10)
    assert shown.stdout == "made here\n", shown
    failed = subprocess.run(["sh", "-c", commands.remote_command(["echo", "ran"], "false")],
                            capture_output=True, text=True, timeout=10)
    assert failed.returncode != 0 and "ran" not in failed.stdout  # a set-up that fails runs nothing


def test_remote_gpu_counts_honour_a_cuda_visible_devices_given_with_x():
    from jaxrun.backends.ssh.backend import visible_gpus

    listed = {"a": 8, "b": 4}  # what nvidia-smi -L said on each host
    assert visible_gpus(listed, {}) == listed
    assert visible_gpus(listed, {"CUDA_VISIBLE_DEVICES": "0,1"}) == {"a": 2, "b": 2}
    assert visible_gpus(listed, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"}) == {"a": 6, "b": 4}
    assert visible_gpus(listed, {"CUDA_VISIBLE_DEVICES": ""}) == {}  # every GPU hidden
