"""Profiling's pure parts and its files: --profile's START:SECONDS, the names
the gathered session gives each process's files, the gathering itself, and
the SSH far end that sends a host's finished traces home (a real process)."""

from __future__ import annotations

import io
import json
import os
import queue
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import threading

import click
import pytest

from jaxrun import contract
from jaxrun.cli import main
from jaxrun.core.backend import Backend, RunHooks
from jaxrun.core.events import Forward
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
from jaxrun.launcher.attempt import profiling


# -- --profile START:SECONDS ---------------------------------------------------------
@pytest.mark.parametrize("text, window", [("30:5", (30.0, 5.0)), ("0:0.5", (0.0, 0.5)), (" 2 : 1 ", (2.0, 1.0)),
                                          ("1.5:300", (1.5, 300.0))])
def test_a_window_is_start_and_seconds(text, window):
    assert profiling.parse_window(text) == window


@pytest.mark.parametrize("text, says", [
    ("5", "is not START:SECONDS"), ("a:1", "START 'a' is not a number"), ("1:b", "SECONDS 'b' is not a number"),
    ("-1:2", "START must be"), ("1:0", "more than 0"), ("1:301", "at most 300"), ("nan:1", "START must be"),
    ("1:inf", "SECONDS must be"), ("1e99:1", "START must be"), ("1:2:3", "SECONDS '2:3' is not a number"),
])
def test_a_bad_window_says_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        profiling.parse_window(text)


def test_the_command_line_takes_profile_and_refuses_a_bad_one_in_one_line():
    ctx = main.make_context("jaxrun", ["--profile", "10:2", "toy.py"])
    assert ctx.params["profile"] == (10.0, 2.0)
    with pytest.raises(click.BadParameter, match="is not START:SECONDS"):
        main.make_context("jaxrun", ["--profile", "10", "toy.py"])


def test_profile_is_in_help_all_only(capsys):
    with pytest.raises(SystemExit):
        main.main(["--help"], prog_name="jaxrun")
    short = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main.main(["--help-all"], prog_name="jaxrun")
    every = capsys.readouterr().out
    assert "--profile" not in short and "--profile START:SECONDS" in every
    assert len(short.splitlines()) <= 50


# -- the session's layout ----------------------------------------------------------------
@pytest.mark.parametrize("name, host, rank, expected", [
    ("node-a.xplane.pb", "node-a", 3, "node-a-p3.xplane.pb"),
    ("node.cluster.local.trace.json.gz", "node.cluster.local", 0, "node.cluster.local-p0.trace.json.gz"),
    ("other.xplane.pb", "node-a", 1, "node-a-p1.other.xplane.pb"),  # not named after its host: kept
    ("h.xplane.pb", None, 2, "host-p2.h.xplane.pb"),  # the marker named no host
    ("we/ird.xplane.pb", "we/ird", 4, "we_ird-p4.xplane.pb"),
])
def test_each_file_is_named_for_its_process(name, host, rank, expected):
    assert profiling.renamed(name, host, rank) == expected


def test_processes_on_one_machine_get_distinct_host_names():
    names = {profiling.renamed("box.xplane.pb", "box", rank) for rank in range(4)}
    assert len(names) == 4 and all(n.endswith(".xplane.pb") for n in names)


def test_a_session_of_the_same_second_gets_a_folder_of_its_own(tmp_path):
    held = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        first = profiling.new_session(held, 1796161488.0)
        second = profiling.new_session(held, 1796161488.4)
    finally:
        os.close(held)
    assert second == first + "-2" and first.count("_") == 5
    assert stat.S_IMODE(os.lstat(tmp_path / first).st_mode) == 0o700


def test_the_open_command_quotes_the_folder():
    assert profiling.open_command("/tmp/a b/profile") == "xprof --logdir='/tmp/a b/profile' --port=6006"


def trace(work: str, session: str, host: str | None, files: dict[str, bytes], error: str | None = None,
          over: bool = True) -> str:
    """A session as the child leaves it (child.profiling)."""
    folder = os.path.join(work, session)
    stamp = os.path.join(folder, "plugins", "profile", "2026_12_04_01_00_00")
    os.makedirs(stamp, exist_ok=True)
    for private in (work, folder):  # as the child makes them
        os.chmod(private, 0o700)
    for name, data in files.items():
        with open(os.path.join(stamp, name), "wb") as f:
            f.write(data)
    if over:
        contract.write_private(os.path.join(folder, contract.TRACE_MARKER),
                               json.dumps({"host": host, "error": error}).encode())
    return folder


def held(folder: str) -> int:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)


def test_gathering_moves_and_renames_the_newest_finished_trace(tmp_path):
    work, into = str(tmp_path / "work"), str(tmp_path / "session")
    trace(work, "100-0", "box", {"box.xplane.pb": b"old"})
    trace(work, "100-1", "box", {"box.xplane.pb": b"new", "box.trace.json.gz": b"gz"})
    part = profiling.gather(work, 2, held(into))
    assert part == profiling.Gathered(2, ("box-p2.trace.json.gz", "box-p2.xplane.pb"))
    assert open(os.path.join(into, "box-p2.xplane.pb"), "rb").read() == b"new"  # bytes untouched
    assert os.listdir(work) == []  # the gathered one and the stale one are gone


def test_gathering_says_why_a_process_has_no_trace(tmp_path):
    into = str(tmp_path / "session")
    session = held(into)
    trace(str(tmp_path / "failed"), "1-0", "box", {}, error="RuntimeError: Profile has already been started.")
    trace(str(tmp_path / "slow"), "1-0", "box", {"box.xplane.pb": b"x"}, over=False)
    assert profiling.gather(str(tmp_path / "failed"), 0, session).problem == \
        "RuntimeError: Profile has already been started."
    assert "not written within" in profiling.gather(str(tmp_path / "slow"), 1, session).problem
    assert "no trace came" in profiling.gather(str(tmp_path / "none"), 2, session).problem
    assert os.listdir(into) == []


def test_a_traced_session_prints_where_it_is_and_how_to_open_it():
    traced = profiling.Traced("/l/profile", "/l/profile/plugins/profile/S",
                              (profiling.Gathered(0, ("h-p0.xplane.pb",)), profiling.Gathered(1, problem="no trace")))
    assert traced.lines() == [
        "jaxrun: profile: 1 of 2 processes traced into /l/profile/plugins/profile/S",
        "jaxrun: profile: process 1: no trace",
        "jaxrun: profile: open it with: xprof --logdir=/l/profile --port=6006",
    ]


# -- the contract's folders ---------------------------------------------------------------
def test_a_trace_folder_is_a_path_here_or_a_bare_name_in_the_hosts_base(tmp_path):
    assert contract.trace_folder("/abs/profiling/process-1") == "/abs/profiling/process-1"
    assert contract.trace_folder("run-process-1", str(tmp_path)) == \
        str(tmp_path / f"jaxrun-profile-{os.geteuid()}" / "run-process-1")
    assert [contract.trace_folder(v) for v in ("", "a/b", "..", ".")] == [None] * 4


def test_a_marker_that_is_not_json_names_nothing(tmp_path):
    (tmp_path / contract.TRACE_MARKER).write_bytes(b"\xff not json")
    assert contract.trace_marker(str(tmp_path)) == {"host": None, "error": None}


# -- the SSH far end, as a real process ------------------------------------------------------
def run_agent(tmp_path, name: str, wait: str = "0.3") -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", contract.SSH_TRACES_MODULE, name, wait], env=env,
                          capture_output=True, timeout=60)


def test_the_far_end_sends_finished_traces_as_a_tar_and_removes_them(tmp_path):
    folder = contract.trace_folder("r-process-1", str(tmp_path))
    os.makedirs(folder, mode=0o700)
    os.chmod(os.path.dirname(folder), 0o700)
    trace(folder, "7-0", "far", {"far.xplane.pb": b"xplane"})
    trace(folder, "7-1", "far", {"far.xplane.pb": b"unfinished"}, over=False)
    done = run_agent(tmp_path, "r-process-1")
    assert done.returncode == 0, done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r|") as tar:
        names = {m.name for m in tar}
    assert "7-0/plugins/profile/2026_12_04_01_00_00/far.xplane.pb" in names
    assert f"7-0/{contract.TRACE_MARKER}" in names and not any(n.startswith("7-1") for n in names)
    assert sorted(os.listdir(folder)) == ["7-1"]  # the one still being written stays
    shutil.rmtree(os.path.join(folder, "7-1"))
    assert run_agent(tmp_path, "r-process-1").returncode == 0 and not os.path.exists(folder)  # nothing left


def test_the_far_end_refuses_a_folder_others_can_enter_and_a_path(tmp_path):
    folder = contract.trace_folder("r-process-2", str(tmp_path))
    os.makedirs(folder)
    os.chmod(folder, 0o755)
    refused = run_agent(tmp_path, "r-process-2")
    assert refused.returncode == 1 and b"is not private" in refused.stderr and refused.stdout == b""
    assert run_agent(tmp_path, "/etc").returncode == 2


def test_the_far_end_of_a_process_that_never_traced_sends_an_empty_tar(tmp_path):
    done = run_agent(tmp_path, "never-traced")
    assert done.returncode == 0
    with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r|") as tar:
        assert list(tar) == []


# -- the child's side, in a real process that never imports jax ---------------------------------
CHILD = r"""
import os, signal, sys, threading, time
from jaxrun import contract
from jaxrun.child.watch import dumps, profiling
dumps.install()  # as the shim does: the asks come through its thread
installed = profiling.install()
print(installed, signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL, flush=True)
if installed:
    threads = threading.active_count()  # the tracer's thread is there from the start
    for _ in range(2):
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.2)  # the handler runs, the tracer's thread turns
    print("the handler started no thread:", threading.active_count() == threads == 3, flush=True)
    folder = contract.trace_folder(os.environ[contract.PROFILE_DIR])
    deadline = time.monotonic() + 20
    while not contract.trace_sessions(folder)[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    print(contract.trace_marker(os.path.join(folder, contract.trace_sessions(folder)[0][0]))["error"])
print("jax" in sys.modules, "jax.profiler" in sys.modules)
"""


def test_the_child_turns_a_trace_on_the_signal_and_imports_nothing_unasked(tmp_path):
    work = str(tmp_path / "profiling" / "process-0")
    asked = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, contract.PROFILE_DIR: work},
                           capture_output=True, text=True, timeout=60)
    assert asked.stdout.splitlines() == ["True False", "the handler started no thread: True",
                                         "the process has not imported jax", "False False"], asked.stderr
    assert oct(os.stat(work).st_mode & 0o777) == "0o700"
    env = {k: v for k, v in os.environ.items() if k != contract.PROFILE_DIR}
    unasked = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert unasked.stdout.splitlines() == ["False True", "False False"]  # SIGUSR2 is left as it was


HELD_WHILE_JOINING = r"""
import os, signal, sys, time
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
from jax._src import xla_bridge
from jaxrun import contract
from jaxrun.child.watch import dumps, profiling
dumps.install()  # as the shim does
profiling.install()
profiling.joining()  # as jaxrun's bootstrap does, just before jax.distributed.initialize
os.kill(os.getpid(), signal.SIGUSR2)  # the launcher's start: every process has arrived
time.sleep(1.0)  # the main thread still in initialize
print("backend made while joining:", bool(xla_bridge._backends), flush=True)
profiling.joined()
deadline = time.monotonic() + 30
while not xla_bridge._backends and time.monotonic() < deadline:
    time.sleep(0.05)
print("backend made once joined:", bool(xla_bridge._backends), flush=True)
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGUSR2)  # the stop
folder = contract.trace_folder(os.environ[contract.PROFILE_DIR])
while not contract.trace_sessions(folder)[0] and time.monotonic() < deadline:
    time.sleep(0.05)
[over] = contract.trace_sessions(folder)[0]
print("error:", contract.trace_marker(os.path.join(folder, over))["error"], flush=True)
"""


@pytest.mark.timeout(90)
def test_a_trace_asked_while_the_process_joins_waits_for_the_join(tmp_path):
    """The launcher asks once every process has arrived at the join; the
    trace's start makes jax's backend, which must not come before the join
    is whole (a process whose trace started mid-join aborted: "wrong service
    incarnation").  Asked then, the trace starts once the join is over."""
    work = str(tmp_path / "profiling" / "process-0")
    ran = subprocess.run([sys.executable, "-c", HELD_WHILE_JOINING], env={**os.environ, contract.PROFILE_DIR: work},
                         capture_output=True, text=True, timeout=80)
    assert ran.stdout.splitlines() == ["backend made while joining: False", "backend made once joined: True",
                                       "error: None"], ran.stdout + ran.stderr


# -- the launcher's side of one trace, with the processes played by a thread ----------------------
class Here(Backend):
    """A backend whose processes write their traces where the launcher reads them."""

    def choose_coordinator(self, fixed):
        raise NotImplementedError

    def spawn(self, spec, lifeline_fd, extra_env, log_fds, news):
        raise NotImplementedError


def playing_processes(events: queue.SimpleQueue, log_dir: str, ranks, heard: list) -> threading.Thread:
    """What the supervisor and the children do with the asks: the first
    starts a session in each process's folder, the second finishes it."""

    def play():
        for turn in range(2):
            event = events.get(timeout=30)
            heard.append(event)
            for rank in ranks:
                work = profiling.work_folder(log_dir, rank)
                trace(work, "9-0", "box", {"box.xplane.pb": b"x"}, over=turn == 1)
                os.chmod(os.path.dirname(work), 0o700)  # the attempt's profiling, as the child makes it

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    return thread


def test_a_trace_asks_twice_and_gathers_each_process_once_all_joined(tmp_path):
    specs = [ProcessSpec(rank, rank, LOCAL_HOST, "python", (), {}) for rank in range(2)]
    events: queue.SimpleQueue = queue.SimpleQueue()
    notes: list[str] = []
    profiler = profiling.Profiler(str(tmp_path))
    profiler.attach(specs, str(tmp_path), events, Here(), RunHooks(), notes.append)
    with pytest.raises(profiling.NotNow, match="not all joined"):
        profiler.trace(1.0)
    profiler.joined(0)
    with pytest.raises(profiling.NotNow, match="not all joined"):
        profiler.trace(1.0)
    profiler.joined(1)
    heard: list = []
    player = playing_processes(events, str(tmp_path), [0, 1], heard)
    traced = profiler.trace(0.2)
    player.join(5)
    assert heard == [Forward(contract.PROFILE_SIGNAL)] * 2
    assert [part.files for part in traced.parts] == [("box-p0.xplane.pb",), ("box-p1.xplane.pb",)]
    assert sorted(os.listdir(traced.folder)) == ["box-p0.xplane.pb", "box-p1.xplane.pb"]
    assert traced.root == str(tmp_path / "profile") and notes == traced.lines()
    profiler.detach()
    with pytest.raises(profiling.NotNow, match="not all joined"):  # no attempt runs
        profiler.trace(1.0)


TWO_ASKS_HEARD_AS_ONE = r"""
import os, queue, sys, threading, time
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp
from jaxrun import contract
from jaxrun.child.watch.profiling import Tracer

folder = sys.argv[1]
asks = queue.SimpleQueue()
tracer = Tracer(folder, limit=1.0)
threading.Thread(target=tracer.serve, args=(asks,), daemon=True).start()

def wait_for(test):
    deadline = time.monotonic() + 30
    while not test() and time.monotonic() < deadline:
        time.sleep(0.05)

asks.put(1)  # start; its stop never comes (heard as one with the start)
jnp.ones(4).sum().block_until_ready()
wait_for(lambda: contract.trace_sessions(folder)[0])
print(contract.trace_sessions(folder))  # ended by itself after its limit
asks.put(1)  # the next ask starts a trace again, in step with the launcher
wait_for(lambda: contract.trace_sessions(folder)[1])
print(contract.trace_sessions(folder))
"""


def test_a_trace_nobody_stops_ends_by_itself_and_the_next_ask_starts_again(tmp_path):
    folder = str(tmp_path / "profiling" / "process-0")
    done = subprocess.run([sys.executable, "-c", TWO_ASKS_HEARD_AS_ONE, folder], capture_output=True, text=True,
                          timeout=120)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stderr
    first, second = eval(lines[0]), eval(lines[1])  # noqa: S307 - our own repr of two lists of names
    assert len(first[0]) == 1 and first[1] == [], lines
    pid = first[0][0].split("-")[0]
    assert second == (first[0], [f"{pid}-1"]), lines
    said = contract.trace_marker(os.path.join(folder, first[0][0]))
    assert said["error"] is None and said["host"] == socket.gethostname()
    assert any(name.endswith(".xplane.pb") for _, _, names in os.walk(folder) for name in names)
