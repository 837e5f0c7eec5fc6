"""Looking into a running job, its pure parts and its channel: the stacks
grouped and ordered, the table's text, the slot states as ``jaxrun top``
names them, and the control channel itself (a real Unix socket, a real
thread): who may connect, a path too long for a socket, a stale socket,
a request kind added by registration.  The real jobs are in
tests/e2e/test_inspect.py."""

from __future__ import annotations

import os
import pwd
import queue
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxrun import cli, contract, portable
from jaxrun.core.events import SignalReceived
from jaxrun.core.outcome import ProcessRecord, Verdict
from jaxrun.core.spec import Host, ProcessSpec
from jaxrun.launcher import channel
from jaxrun.launcher.attempt.slots import Slot, Slots, State
from jaxrun.launcher.attempt.snapshot import dump_in, dumps, last_line, shown_state
from jaxrun.launcher.inspect import find, stacks, top
from jaxrun.wire import encoding, inspect as words

SHIM = "/venv/lib/python3.11/site-packages/jaxrun/child/shim.py"
RUNNER = [(SHIM, 101, "run_target"), (SHIM, 60, "main")]
SLEEPING = [("/work/job.py", 12, "stuck"), ("/work/job.py", 30, "<module>")]
COLLECTIVE = [("/venv/lib/python3.11/site-packages/jax/_src/array.py", 640, "_value"),
              ("/work/job.py", 27, "<module>")]


def dump(frames, current=True, other_first=False) -> str:
    """A faulthandler dump: an idle helper thread, and the main thread."""
    helper = 'Thread 0x00007f0000000002 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", ' \
             'line 320 in wait\n\n'
    head = "Current thread" if current else "Thread"
    main = f"{head} 0x00007f0000000001 (most recent call first):\n" + "".join(
        f'  File "{file}", line {line} in {func}\n' for file, line, func in [*frames, *RUNNER])
    return helper + main if other_first else main + "\n" + helper


def a_dump(rank, frames, host="localhost", state="waiting"):
    return words.StackDump(rank, host, 1000 + rank, 0, state, dump(frames) if frames else "")


# -- stacks ---------------------------------------------------------------------------------------------

def test_the_one_process_that_stands_apart_comes_first_and_the_others_once():
    dumps = (a_dump(0, COLLECTIVE), a_dump(1, SLEEPING), a_dump(2, COLLECTIVE), a_dump(3, COLLECTIVE))
    groups = stacks.grouped(dumps)
    assert [g.ranks for g in groups] == [[1], [0, 2, 3]]
    text = stacks.render(words.Stacks(dumps), "r1")
    assert text[0] == ("jaxrun: run r1: 4 processes in 2 groups by the main thread's stack "
                       "(most recent call first)")
    first, second = text.index("process 1 on localhost (pid 1001): 1 of 4"), text.index(
        "processes 0,2-3 on localhost: 3 of 4")
    assert first < second
    assert text[first + 1] == '  File "/work/job.py", line 12 in stuck'
    assert sum('line 640 in _value' in line for line in text) == 1  # the three identical stacks once


def test_groups_of_one_size_go_by_their_first_rank_and_processes_without_a_dump_go_last():
    dumps = (a_dump(3, SLEEPING), a_dump(0, COLLECTIVE), a_dump(2, None, state="finished"), a_dump(1, SLEEPING))
    groups = stacks.grouped(dumps)
    assert [g.ranks for g in groups] == [[0], [1, 3], [2]]
    text = stacks.render(words.Stacks(dumps, "no stack dump came from process 2 within 5 s"), "r", "/logs/r")
    assert "process 2 on localhost (pid 1002): no stack dump (finished)" in text
    assert text[-3:] == ["", "jaxrun: no stack dump came from process 2 within 5 s",
                         "jaxrun: every thread's stack is in each process's stderr log, under /logs/r"]
    assert stacks.render(words.Stacks(dumps), "r")[-1] == "process 2 on localhost (pid 1002): no stack dump (finished)"


def test_the_same_line_in_another_function_or_file_is_another_group():
    moved = [("/work/job.py", 12, "other"), ("/work/job.py", 30, "<module>")]
    assert len(stacks.grouped((a_dump(0, SLEEPING), a_dump(1, moved)))) == 2


def test_the_main_thread_is_the_one_that_runs_the_script_whichever_faulthandler_calls_current():
    text = dump(SLEEPING, current=False, other_first=True).replace("Thread 0x00007f0000000002",
                                                                   "Current thread 0x00007f0000000002")
    assert stacks.main_frames(text) == tuple(SLEEPING)  # the shim's frames and below left out
    plain = 'Current thread 0x1 (most recent call first):\n  File "/x.py", line 3 in f\n'
    assert stacks.main_frames(plain) == (("/x.py", 3, "f"),)
    assert stacks.main_frames("no dump here") == ()


def test_hosts_are_named_per_group():
    dumps = (a_dump(0, COLLECTIVE, "hostA"), a_dump(1, COLLECTIVE, "hostA"), a_dump(2, COLLECTIVE, "hostB"))
    assert stacks.who(stacks.grouped(dumps)[0]) == "processes 0-2 on hostA (0-1), hostB (2)"


def test_the_dump_is_taken_from_its_first_header_on():
    text = "a line the script printed\n" + dump(SLEEPING)
    assert dump_in(text).startswith("Current thread 0x")
    assert dump_in("no dump") == ""


# -- the table --------------------------------------------------------------------------------------------

def test_the_plain_table_has_a_heading_aligned_columns_and_no_escape_codes():
    rows = (words.TableRow(1, "localhost", 4243, 2, "restarting", None, None, None, ""),
            words.TableRow(0, "localhost", 4242, 0, "working", 99.6, 3 << 29, 0.0, "step 3 \x1b[1mloss\x1b[0m\r 0.5",
                           0.02, True),
            words.TableRow(2, "hostB", None, 0, "waiting", None, None, 125.0, "x\ty", 0.354))
    lines = top.plain(words.Table("r1", 1, 2, 3, rows, False, "process 0 on localhost is the straggler: \x1b[1m"))
    assert lines[0] == "jaxrun: run r1  attempt 1  restarts 2 of 3  processes 3"
    assert lines[1].split() == ["RANK", "HOST", "PID", "STATE", "CPU", "MEM", "IDLE", "WAIT", "LAST", "LINE"]
    assert lines[2].split() == ["0", "localhost", "4242", "working", "100%", "1.5G", "0s", "2%", "straggler",
                                "step", "3", "loss", "0.5"]
    assert lines[3].split() == ["1", "localhost", "4243", "restarting", "(life", "2)", "-", "-", "-", "-"]
    assert lines[4].split() == ["2", "hostB", "-", "waiting", "-", "-", "2m05s", "35%", "x", "y"]
    assert lines[5] == "jaxrun: process 0 on localhost is the straggler:"
    assert all("\x1b" not in line and "\r" not in line for line in lines)
    assert len({line.index("STATE") if "STATE" in line else None for line in lines[1:2]}) == 1
    state_at = lines[1].index("STATE")
    assert all(line[state_at:].split()[0] in words.STATES for line in lines[2:5])


def test_the_heading_says_when_the_whole_job_restarts():
    assert top.heading(words.Table("r", 0, 1, 1, (), True)).endswith("(restarting the whole job)")


@pytest.mark.parametrize(("size", "text"), [(None, "-"), (512, "512B"), (2048, "2.0K"), (5 << 20, "5.0M")])
def test_memory_text(size, text):
    assert top.memory_text(size) == text


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (0.2, "0s"), (59.4, "59s"), (61, "1m01s"),
                                               (7322, "2h02m")])
def test_idle_text(seconds, text):
    assert top.idle_text(seconds) == text


# -- the states jaxrun top shows ----------------------------------------------------------------------------

def a_slot(tmp_path, state, life=0, returncode=None, verdict=None, attempt=0) -> Slot:
    spec = ProcessSpec(0, 0, Host("localhost"), "python", (), {contract.RESTART_COUNT: str(attempt + life)})
    record = ProcessRecord(spec, str(tmp_path / "o"), str(tmp_path / "e"), str(tmp_path / "j"), life=life,
                           returncode=returncode, verdict=verdict)
    return Slot(0, record, state)


@pytest.mark.parametrize(("state", "life", "returncode", "verdict", "shown"), [
    (State.PENDING, 0, None, None, "starting"),
    (State.PENDING, 1, None, None, "restarting"),
    (State.STARTED, 0, None, None, "starting"),
    (State.STARTED, 2, None, None, "restarting"),
    (State.JOINED, 2, None, None, "joined"),
    (State.JOINED, 0, None, None, "joined"),
    (State.WORKING, 0, None, None, "working"),
    (State.WAITING, 0, None, None, "waiting"),
    (State.FINISHED, 0, None, None, "finished"),
    (State.ENDED, 0, 0, Verdict.OK, "finished"),
    (State.ENDED, 0, 7, Verdict.ROOT_CAUSE, "failed"),
    (State.ENDED, 0, -9, Verdict.STOPPED, "failed"),
    (State.ENDED, 0, 7, Verdict.RESTARTED, "restarting"),
])
def test_each_slot_state_as_top_names_it(tmp_path, state, life, returncode, verdict, shown):
    assert shown_state(a_slot(tmp_path, state, life, returncode, verdict)) == shown
    assert shown_state(a_slot(tmp_path, state, life, returncode, verdict), restarting=True) == "restarting"


def test_a_later_attempts_process_restarts_until_it_joins(tmp_path):
    assert shown_state(a_slot(tmp_path, State.STARTED, attempt=1)) == "restarting"
    assert shown_state(a_slot(tmp_path, State.JOINED, attempt=1)) == "joined"


def test_the_whole_job_restarts_from_the_end_of_its_attempt_to_the_start_of_the_next():
    running = []
    view = channel.JobView("r", [], "/l", 1, running, queue.SimpleQueue().put)
    first, second = object(), object()
    running[:] = [first]
    assert not view.restarting
    view.attempt_over(restart_follows=True)
    assert view.restarting
    running[:] = [second]  # the next attempt's supervisor
    assert not view.restarting
    view.attempt_over(restart_follows=False)  # the last attempt: the run ends
    assert not view.restarting


def test_every_state_the_slots_have_is_named():
    live = (State.JOINED, State.WORKING, State.WAITING, State.FINISHED)
    assert {shown_state(Slot(0, None, s)) for s in live} <= set(words.STATES)


def test_the_last_line_is_the_newest_streams_and_a_stack_dump_is_not_one(tmp_path):
    slot = a_slot(tmp_path, State.WAITING)
    Path(slot.record.stdout_log).write_text("step 1\nstep 2\n\n")
    os.utime(slot.record.stdout_log, (1, 1))
    Path(slot.record.stderr_log).write_text("warming up\n")
    assert last_line(slot.record) == "warming up"
    Path(slot.record.stderr_log).write_text("warming up\n" + dump(SLEEPING))
    os.utime(slot.record.stdout_log, None)
    os.utime(slot.record.stderr_log, (1, 1))
    assert last_line(slot.record) == "step 2"
    os.utime(slot.record.stdout_log, (1, 1))
    os.utime(slot.record.stderr_log, None)  # newer, but only by its dump: the line before it may be older
    assert last_line(slot.record) == "step 2"
    Path(slot.record.stderr_log).write_text("warming up\n" + dump(SLEEPING) + "loss 0.5\n")
    assert last_line(slot.record) == "loss 0.5"
    Path(slot.record.stdout_log).write_text("")
    Path(slot.record.stderr_log).write_text(dump(SLEEPING))
    assert last_line(slot.record) == ""


LOCAL = SimpleNamespace(writes_log_files=True)  # a backend whose pids are the controllers here


def test_the_dumps_are_asked_for_once_and_read_from_the_logs_as_they_land(tmp_path):
    """The supervisor's loop is the one that signals (here: the post writes
    what the processes would); a process whose dump never lands comes back
    empty, named in the note, once the wait is over."""
    slots = Slots([ProcessSpec(r, r, Host("localhost"), "python", (), {}) for r in range(4)], str(tmp_path))
    for rank in range(3):
        slots[rank].state = State.WAITING
        Path(slots[rank].record.stderr_log).write_text("before\n")
    slots[3].state = State.ENDED  # not asked
    posted = []

    def post(event):
        posted.append(event)
        for rank in (0, 1):
            with open(slots[rank].record.stderr_log, "a") as f:
                f.write(dump(SLEEPING if rank else COLLECTIVE))

    got = dumps(SimpleNamespace(slots=slots, backend=LOCAL), post, wait=0.5)
    assert posted == [SignalReceived(signal.SIGUSR1)]
    assert [d.rank for d in got.dumps] == [0, 1, 2, 3]
    assert got.dumps[0].text.startswith("Current thread 0x") and "before" not in got.dumps[0].text
    assert stacks.main_frames(got.dumps[1].text)[0] == SLEEPING[0]
    assert (got.dumps[2].text, got.dumps[3].text, got.dumps[3].state) == ("", "", "failed")
    assert got.note == "no stack dump came from process 2 within 0.5 s"
    nobody = Slots([ProcessSpec(0, 0, Host("localhost"), "python", (), {})], str(tmp_path))
    assert dumps(SimpleNamespace(slots=nobody, backend=LOCAL), posted.append, wait=0.5).note == "" and len(posted) == 1


# -- the channel ----------------------------------------------------------------------------------------------

@pytest.fixture
def short_tmp(monkeypatch):
    """A temporary folder short enough for a socket path (pytest's are long),
    where this user's private socket folder is made."""
    folder = tempfile.mkdtemp(prefix="jr-", dir="/tmp")
    monkeypatch.setattr("tempfile.tempdir", folder)
    yield Path(folder)
    shutil.rmtree(folder)


@pytest.fixture
def a_channel(short_tmp):
    view = channel.JobView("20261204-010203-abcdef", ["jaxrun", "-n", "2", "t.py"], "/logs", 3, [],
                           queue.SimpleQueue().put)
    listening = channel.open_channel(view)
    assert listening is not None
    yield listening
    listening.close()


def test_the_channel_listens_in_the_private_folder_by_the_run_id_and_goes_away_on_close(a_channel, short_tmp):
    folder = short_tmp / f"jaxrun-sockets-{os.getuid()}"
    assert a_channel.path == str(folder / "run-20261204-010203-abcdef.sock")
    assert os.stat(folder).st_mode & 0o777 == 0o700
    path, info = find.find_job(None)
    assert (path, info.run_id, info.pid, info.argv) == (a_channel.path, "20261204-010203-abcdef", os.getpid(),
                                                        ["jaxrun", "-n", "2", "t.py"])
    assert find.find_job("20261204-010203-abcdef")[0] == a_channel.path
    table = find.ask(path, words.AskTable())
    assert table == words.Table("20261204-010203-abcdef", 0, 0, 3, ())  # the first attempt not placed yet
    a_channel.close()
    assert not os.path.exists(path)
    with pytest.raises(find.NoJob, match="no running job of yours"):
        find.find_job(None)


def test_the_newest_job_answers_and_a_stale_socket_is_removed(a_channel, short_tmp):
    folder = os.path.dirname(a_channel.path)
    stale = os.path.join(folder, "run-20261204-000000-000000.sock")
    gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    gone.bind(stale)  # a jaxrun that was SIGKILLed: its socket stays, nobody listens
    gone.close()
    older = channel.JobView("20261204-000001-aaaaaa", [], "/l", 0, [], queue.SimpleQueue().put, started=1.0)
    other = channel.ControlChannel(older, channel.address(older.run_id))
    try:
        assert sorted(find.listed(folder)) == sorted([stale, a_channel.path, other.path])
        assert find.find_job(None)[1].run_id == "20261204-010203-abcdef"
        assert not os.path.exists(stale)
        assert find.find_job("20261204-000001-aaaaaa")[1].run_id == "20261204-000001-aaaaaa"
    finally:
        other.close()


def test_a_request_kind_is_added_by_registering_a_handler(a_channel):
    @encoding.message("test-inspect-echo")
    class Echo(encoding.Message):
        text: str

    try:
        refused = find.ask(a_channel.path, Echo("hi"))
        assert refused == words.Refused("this jaxrun does not answer 'test-inspect-echo'")
        channel.handles(Echo)(lambda request, view: words.Refused(f"{view.run_id} heard {request.text}"))
        assert find.ask(a_channel.path, Echo("hi")).why == "20261204-010203-abcdef heard hi"
        with pytest.raises(ValueError, match="has a handler already"):
            channel.handles(Echo)(lambda request, view: None)
        channel.HANDLERS[Echo] = lambda request, view: 1 / 0
        assert find.ask(a_channel.path, Echo("hi")).why == "ZeroDivisionError: division by zero"
    finally:
        channel.HANDLERS.pop(Echo, None)
        encoding._BY_WORD.pop("test-inspect-echo")


def test_a_path_too_long_for_a_socket_names_the_run_by_a_hash(short_tmp):
    longest = portable.sockets.LONGEST_SOCKET_PATH
    folder = short_tmp / ("d" * (longest - 27 - len(str(short_tmp))))
    folder.mkdir(mode=0o700)
    assert len(str(folder)) + 26 == longest  # the longest folder portable keeps (else it moves to /tmp)
    path = channel.address("20261204-010203-abcdef", str(folder))
    assert len(path) <= portable.sockets.LONGEST_SOCKET_PATH
    assert os.path.basename(path).startswith("run-") and "20261204" not in path
    assert channel.address("20261204-010203-abcdef", str(folder)) == path  # found by the run id alone
    assert channel.address("20261204-010203-abcdeg", str(folder)) != path
    view = channel.JobView("20261204-010203-abcdef", [], "/l", 0, [], queue.SimpleQueue().put)
    listening = channel.ControlChannel(view, path)
    try:
        assert find.find_job("20261204-010203-abcdef", str(folder))[0] == path
        assert find.find_job(None, str(folder))[0] == path
    finally:
        listening.close()
    short = channel.address("x", str(short_tmp))
    assert short == str(short_tmp / "run-x.sock")


def test_a_taken_socket_folder_moves_the_channel_to_one_of_a_random_name_said_in_one_line(short_tmp):
    usual = short_tmp / f"jaxrun-sockets-{os.getuid()}"
    usual.mkdir(mode=0o755)  # someone made it open: not used, not repaired
    said = []
    view = channel.JobView("r", [], "/l", 0, [], queue.SimpleQueue().put)
    listening = channel.open_channel(view, said.append, said.append)
    assert listening is not None
    try:
        folder = os.path.dirname(listening.path)
        assert os.path.dirname(folder) == str(short_tmp) and folder.startswith(f"{usual}-")
        assert said == [f"jaxrun: the socket folder {usual} is not yours alone (other users have access to it "
                        f"(mode 0755)): this run's sockets are in {folder}, a private folder of a random name"]
        assert find.find_job(None)[0] == listening.path == find.find_job("r")[0]  # jaxrun top finds it
    finally:
        listening.close()


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")


def as_nobody(path: str) -> str:
    """Connect to ``path`` as nobody, in a forked child; what it met."""
    nobody = pwd.getpwnam("nobody")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the child
        said = "?"
        try:
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(5)
                conn.connect(path)
                conn.sendall(words.Describe().line())
                said = "answered: " + conn.recv(1 << 16).decode()
        except OSError as e:
            said = type(e).__name__
        finally:
            os.write(w, said.encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        said = f.read()
    os.waitpid(pid, 0)
    return said


@as_root
def test_another_user_cannot_reach_the_channel(a_channel):
    assert as_nobody(a_channel.path) == "PermissionError"  # the private folder keeps nobody out


@as_root
def test_another_user_who_reaches_the_socket_is_refused_by_its_uid(short_tmp):
    short_tmp.chmod(0o755)  # a folder anyone may enter, unlike the private one
    open_folder = short_tmp / "open"
    open_folder.mkdir()
    open_folder.chmod(0o755)
    view = channel.JobView("r", [], "/l", 0, [], queue.SimpleQueue().put)
    listening = channel.ControlChannel(view, str(open_folder / "run-r.sock"))
    try:
        os.chmod(listening.path, 0o777)
        # Connected, and not a word back: the connection closes (before the request was sent, or
        # with it unread: a broken pipe, a reset).
        assert as_nobody(listening.path) in ("answered: ", "ConnectionResetError", "BrokenPipeError")
        assert listening.refused == 1
        assert isinstance(find.ask(listening.path, words.Describe()), words.JobInfo)  # its own user is answered
    finally:
        listening.close()


# -- the commands' lines and exit statuses ------------------------------------------------------------------------

def test_no_running_job_is_one_line_and_exit_1(short_tmp, capsys):
    for command in ("stacks", "top"):
        with pytest.raises(SystemExit) as ended:
            cli.entry_point([command, "--once"] if command == "top" else [command])
        assert ended.value.code == 1
        err = capsys.readouterr().err
        assert err == "jaxrun: no running job of yours (jaxrun logs lists the finished ones)\n"


def test_a_malformed_run_id_is_exit_2(short_tmp, capsys):
    with pytest.raises(SystemExit) as ended:
        cli.entry_point(["stacks", "--run", "../etc"])
    assert ended.value.code == 2
    assert capsys.readouterr().err.startswith("jaxrun: error: Invalid value for '--run': '../etc' is not a run id")


def test_a_subcommand_exits_with_the_status_it_raises(tmp_path, capsys):
    """click, without standalone mode, returns a raised Exit's status; the entry point exits with it."""
    with pytest.raises(SystemExit) as ended:
        cli.entry_point(["logs", "--trace", str(tmp_path / "t.json"), "--log-dir", str(tmp_path)])
    assert ended.value.code == 1
    assert capsys.readouterr().err.startswith("jaxrun: error: no run in ")
