"""What an SSH child takes out of its stderr (``ssh_stream.AgentStderr``):
the joined and activity markers, cut out wherever a read splits them, and the report home,
taken off the end of the stream when it is one, and never a byte of the
process's own lost when it is not.  Streams are cut into random pieces, as
pipes deliver them."""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import time

import pytest

from jaxrun import contract
from jaxrun.backends.ssh.children import SessionChild
from jaxrun.backends.ssh.stream import AgentStderr
from jaxrun.core.backend import News
from jaxrun.core.events import Stream, StreamClosed
from jaxrun.launcher.output.pump import OutputPump
from jaxrun.wire import ssh

pytestmark = pytest.mark.timeout(30)

RECORD = '{"type": "ValueError", "message": "bad", "traceback": ""}'
USED = {"peak_rss_bytes": 1 << 30, "cpu_seconds": 1.5, "oom": None}
FACTS = {"pid": 4242, "reaped_at": 1796161488.25, "clock": "hostB",
         "marks": {"compile": 1.5, "checkpoint": 0.5, "saves": 2, "saved_at": 1796161480.0, "compile_after_save": 0.0,
                   "steps": 40, "written_at": 1796161481.0, "clock": "hostB"}}


def cut_through(stream: bytes, seed: int, error_file: str | None = None,
                steps=(1, 2, 3, 5, 7, 11, 20, 4096)) -> tuple[bytes, int, AgentStderr]:
    """(bytes passed on, joins heard, the filter), ``stream`` cut at random
    and fed through the filter as the pump feeds it; the states heard are
    the filter's ``states``."""
    joins, states = [], []
    heard = AgentStderr(News(lambda recoverable: joins.append(1), states.append), error_file)
    heard.states = states
    rng = random.Random(seed)
    out, at = b"", 0
    while at < len(stream):
        step = rng.choice(steps)
        out += heard.feed(stream[at:at + step])
        at += step
    assert not heard.closed.is_set()
    out += heard.close()
    assert heard.closed.is_set()
    return out, len(joins), heard


# -- the report home ------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_a_report_home_is_taken_off_the_end(seed, tmp_path):
    own = b"Traceback...\nValueError: bad\npartial \x00 line"
    error_file = str(tmp_path / "process-0.error.json")
    out, joins, heard = cut_through(own + ssh.home_report(RECORD, USED, **FACTS), seed, error_file)
    assert (out, joins) == (own, 0)
    assert contract.ErrorRecord.load(error_file) == contract.ErrorRecord.from_json(RECORD)
    assert heard.resources == contract.Resources.from_dict(USED)
    assert heard.came_home and heard.facts == FACTS


def test_a_report_home_without_a_record_leaves_no_error_file(tmp_path):
    error_file = tmp_path / "process-0.error.json"
    out, _, heard = cut_through(b"fine\n" + ssh.home_report(None, USED), 0, str(error_file))
    assert out == b"fine\n" and not error_file.exists()
    assert heard.resources == contract.Resources.from_dict(USED)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("own", [
    b"before " + ssh.HOME_REPORT_MARK + b"not json\nmore bytes after\n",  # the mark mid-stream
    b"ends with half a mark " + ssh.HOME_REPORT_MARK[:9],
    ssh.home_report(RECORD, None) + b"and then more",  # a report is only a report at the very end
    b"two " + ssh.home_report(RECORD, None) + ssh.home_report(RECORD, None),
    b"plain bytes, no mark at all\n" * 50,
], ids=["mid-stream", "half-mark", "not-at-the-end", "two-reports", "plain"])
def test_the_process_own_bytes_are_never_lost(seed, own, tmp_path):
    error_file = tmp_path / "process-0.error.json"
    out, joins, heard = cut_through(own, seed, str(error_file))
    assert (out, joins, heard.resources) == (own, 0, None)
    assert not error_file.exists()
    assert not heard.came_home and heard.facts == {}


def test_a_huge_false_report_is_released_without_waiting_for_the_end():
    heard = AgentStderr(News(), None)
    assert heard.feed(b"x" + ssh.HOME_REPORT_MARK) == b"x"
    released = heard.feed(b"y" * ssh.MAX_HOME_REPORT)
    assert released == ssh.HOME_REPORT_MARK + b"y" * ssh.MAX_HOME_REPORT
    assert heard.close() == b""


# -- the joined marker ----------------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_the_joined_marker_is_cut_out_wherever_a_read_splits_it(seed, tmp_path):
    before, after = b"line one\npartial ", b"rest of it\n\x00 not a marker \x00\x1bjaxrun\n"
    error_file = str(tmp_path / "process-0.error.json")
    out, joins, _ = cut_through(before + ssh.JOINED_MARKER + after + ssh.home_report(RECORD, None),
                                    seed, error_file)
    assert (out, joins) == (before + after, 1)
    assert contract.ErrorRecord.load(error_file) == contract.ErrorRecord.from_json(RECORD)


@pytest.mark.parametrize("seed", range(20))
def test_progress_markers_are_cut_out_and_told_in_order(seed):
    busy, idle = ssh.ACTIVITY_MARKERS[contract.BUSY], ssh.ACTIVITY_MARKERS[contract.IDLE]
    own = [b"step 1\n", b"half a line ", b"\x00\x1bjaxrun-bus and not a marker\n", b"end\n"]
    stream = own[0] + busy + own[1] + idle + ssh.JOINED_MARKER + own[2] + busy + idle + own[3]
    out, joins, heard = cut_through(stream, seed)
    assert (out, joins) == (b"".join(own), 1)
    assert heard.states == [contract.BUSY, contract.IDLE, contract.BUSY, contract.IDLE]


@pytest.mark.parametrize("seed", range(20))
def test_spin_markers_carry_their_details_and_are_cut_out_wherever_a_read_splits_them(seed):
    spin = ssh.activity_marker("spin 2 1.97")
    assert spin == b"\x00\x1bjaxrun-spin 2 1.97\n"
    assert ssh.activity_marker(contract.IDLE) == ssh.ACTIVITY_MARKERS[contract.IDLE]
    own = [b"step 3\n", b"half ", b"\x00\x1bjaxrun-spin 2 x not one\n", b"\x00\x1bjaxrun-spin ", b"end\n"]
    busy = ssh.ACTIVITY_MARKERS[contract.BUSY]
    stream = (own[0] + spin + own[1] + ssh.activity_marker("spin 3 2.90") + own[2] + busy + own[3] + own[4]
              + ssh.activity_marker("spin 1 0.50"))
    out, joins, heard = cut_through(stream, seed)
    assert out == b"".join(own)
    assert heard.states == ["spin 2 1.97", "spin 3 2.90", contract.BUSY, "spin 1 0.50"]


@pytest.mark.parametrize("seed", range(20))
def test_time_markers_carry_the_account_and_are_cut_out_wherever_a_read_splits_them(seed):
    line = "time 1796459760.505 6.031 2.717 1.421 1.662 0.232"
    own = [b"step 3\n", b"half ", b"\x00\x1bjaxrun-time 1 x\n", b"end\n"]
    busy = ssh.ACTIVITY_MARKERS[contract.BUSY]
    stream = own[0] + ssh.activity_marker(line) + own[1] + busy + own[2] + ssh.activity_marker(line) + own[3]
    out, joins, heard = cut_through(stream, seed)
    assert out == b"".join(own)
    assert heard.states == [line, contract.BUSY, line]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("own", [
    b"ends with half a marker " + ssh.JOINED_MARKER[:5],
    ssh.JOINED_MARKER[:-1] + b"x and more\n",
    b"plain bytes\n" * 40,
    b"ends with half a spin marker " + ssh.activity_marker("spin 2 1.97")[:-1],
], ids=["half-marker", "almost-a-marker", "plain", "half-spin"])
def test_bytes_that_only_look_like_a_marker_are_kept(seed, own):
    out, joins, heard = cut_through(own, seed, steps=(1, 2, 3, 5, 11, 4096))
    assert (out, joins, heard.resources) == (own, 0, None)


# -- through a real pump --------------------------------------------------------------

def test_a_real_pump_feeds_the_filter_and_logs_only_the_process_bytes(tmp_path):
    events: queue.SimpleQueue = queue.SimpleQueue()
    shown: list[bytes] = []
    pump = OutputPump(events, lambda rank, stream, data: shown.append(data))
    read_end, write_end = os.pipe()
    log_path = tmp_path / "process-0.stderr"
    log = open(log_path, "wb", buffering=0)
    joins: list[int] = []
    heard = AgentStderr(News(lambda recoverable: joins.append(0)), str(tmp_path / "process-0.error.json"))
    pump.add(read_end, log, 0, Stream.STDERR, lambda: (log.close(), os.close(read_end)), path=str(log_path),
             stream_filter=heard)
    try:
        os.write(write_end, b"before" + ssh.JOINED_MARKER[:4])
        time.sleep(0.2)
        os.write(write_end, ssh.JOINED_MARKER[4:] + b" after\n" + ssh.home_report(RECORD, USED)[:10])
        time.sleep(0.2)
        os.write(write_end, ssh.home_report(RECORD, USED)[10:])
        os.close(write_end)
        assert events.get(timeout=10) == StreamClosed(0, Stream.STDERR)
    finally:
        pump.stop()
    assert log_path.read_bytes() == b"before after\n"
    assert b"".join(shown) == b"before after\n"
    assert joins == [0]
    assert heard.closed.is_set() and heard.resources == contract.Resources.from_dict(USED)
    assert json.loads((tmp_path / "process-0.error.json").read_text())["type"] == "ValueError"


# -- the child's exit: the controller's own, or its helper's ------------------------------

def session_child(tmp_path, stderr: bytes, status: int) -> SessionChild:
    """A SessionChild whose "ssh client" writes ``stderr`` and exits ``status``;
    its stderr read to the end through the child's own filter, as the pump does."""
    script = f"import os, sys; os.write(2, {stderr!r}); sys.stdin.read(); sys.exit({status})"
    popen = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    child = SessionChild(popen, error_file=str(tmp_path / "process-0.error.json"))
    heard = child.stream_filter(Stream.STDERR)
    popen.stdin.close()
    for chunk in iter(lambda: popen.stderr.read1(1 << 16), b""):
        heard.feed(chunk)
    heard.close()
    popen.stdout.close()
    popen.stderr.close()
    return child


def test_a_session_child_exit_carries_the_controller_pid_and_reap_time(tmp_path):
    child = session_child(tmp_path, ssh.home_report(None, USED, **FACTS), 128 + 9)
    end = child.wait()
    assert (end.returncode, end.pid, end.reaped_at, end.clock, end.lost) == (-9, 4242, FACTS["reaped_at"], "hostB",
                                                                            None)
    assert end.resources == contract.Resources.from_dict(USED)
    assert end.marks == contract.Marks.from_dict(FACTS["marks"]) and end.marks.saves == 2  # the run's goodput
    assert child.pid != 4242  # the ssh client's, the handle jaxrun holds; the report takes the exit's


@pytest.mark.parametrize("status, lost", [(255, "the ssh client"), (7, None)], ids=["ssh-failed", "agent-status"])
def test_a_session_child_without_a_report_home(tmp_path, status, lost):
    """ssh's own failure, with no report home, is the helper's end, not the
    controller's; the session agent's own status stands."""
    end = session_child(tmp_path, b"ssh: connect to host hostB: Connection refused\n", status).wait()
    assert (end.returncode, end.pid, end.reaped_at, end.lost) == (status, None, None, lost)
