"""Issue 74: JAX's fatal-error pages (what a process prints as it aborts
after a peer is gone) leave the console for the logs, counted once; -v
shows them; lines that only look alike stay.  The pages here are as
crash_in_collective.py's processes 1-3 printed them (jaxrun at 74d7ebe,
jax 0.10): process 0 exited 3 while they waited in sync_global_devices."""

from __future__ import annotations

import io

import pytest

from jaxrun import contract
from jaxrun.core.events import Stream
from jaxrun.launcher.output.printer import ConsolePrinter

FATAL = (b"F1206 09:52:48.859354   30662 client.h:80] Terminating process because the JAX distributed service "
         b"detected fatal errors. This most likely indicates that another task died; see the other task logs for more "
         b"details. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service.\n")
PAGE = (
    b"W1206 09:52:48.859302   30662 preemption_sync_manager.cc:147] Failed to retrieve preemption notice from "
    b"coordination service: UNAVAILABLE: Socket closed\n"
    b"Additional GRPC error information from remote target coordination_service while calling "
    b"/xla.coordination.CoordinationService/GetKeyValue:\n"
    b':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"Socket closed"}. This is only expected if '
    b"one of the tasks is unhealthy. Check the logs for the actual root cause.\n"
    b"E1206 09:52:48.859325   30662 preemption_sync_manager.cc:159] Failed to cancel preemption barrier: "
    b"FAILED_PRECONDITION: Tried to cancel non-existent barrier PREEMPTION_SYNC_BARRIER.\n"
    b"E1206 09:52:48.859350   30662 coordination_service_agent.cc:289] Polled an error from coordination service "
    b"(this can be an error from this or another task).\n"
    + FATAL +
    b"Additional GRPC error information from remote target coordination_service while calling "
    b"/xla.coordination.CoordinationService/PollForError:\n"
    b':UNKNOWN:Error received from peer  {grpc_message:"Socket closed", grpc_status:14}\n'
    b"*** Check failure stack trace: ***\n"
    b"    @     0x7fd84fc40634  absl::lts_20260107::log_internal::LogMessage::SendToLog()\n"
    b"    @     0x7fd84fc405b6  absl::lts_20260107::log_internal::LogMessage::Flush()\n"
    b"    @     0x7fd84bd040ee  xla::CoordinationServiceAgent::SetError()\n"
    b"    @     0x7fd857a431f5  (unknown)\n"
)
PAGE_LINES = PAGE.count(b"\n")
JAX = "/venv/lib/python3.11/site-packages/jax"
# A process still starting when process 0 ended (mpirun, a loaded machine): its
# key-value read failed, and the backend's start that caught it.
STARTING = (
    "Traceback (most recent call last):\n"
    f'  File "{JAX}/_src/distributed.py", line 120, in key_value_get\n'
    "jax.errors.JaxRuntimeError: UNAVAILABLE: sendmsg: Connection reset by peer (104)\n"
    "Additional GRPC error information from remote target coordination_service while calling "
    "/xla.coordination.CoordinationService/GetKeyValue:\n"
    ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"sendmsg: Connection reset by peer (104)"}\n'
    "\n"
    "During handling of the above exception, another exception occurred:\n"
    "\n"
    "Traceback (most recent call last):\n"
    '  File "/w/crash.py", line 12, in <module>\n'
    "    if jax.process_index() == 0:\n"
    f'  File "{JAX}/_src/xla_bridge.py", line 900, in backends\n'
    "RuntimeError: Unable to initialize backend 'cpu': UNAVAILABLE: sendmsg: Connection reset by peer (104)\n"
    "Additional GRPC error information from remote target coordination_service while calling "
    "/xla.coordination.CoordinationService/GetKeyValue:\n"
    ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"sendmsg: Connection reset by peer (104)"} '
    "(you may need to uninstall the failing plugin package, or set JAX_PLATFORMS=cpu to skip this backend.)\n"
).encode()


def console(show_noise=False, mode="stream"):
    out, err = io.BytesIO(), io.BytesIO()
    return ConsolePrinter(mode, stdout=out, stderr=err, show_noise=show_noise, log_dir="/logs"), out, err


def test_the_pages_of_processes_that_aborted_leave_the_console_counted_once():
    p, out, err = console()
    p.write(0, Stream.STDOUT, b"step 10 loss 1.0\n")
    for rank in (1, 2, 3):
        p.write(rank, Stream.STDERR, b"about to wait\n" + PAGE)
    p.flush()
    assert err.getvalue() == b"".join(b"[%d] about to wait\n" % rank for rank in (1, 2, 3))
    assert out.getvalue() == b"[0] step 10 loss 1.0\n"
    assert p.pages.said() == f"processes 1-3: JAX's fatal-error pages, {3 * PAGE_LINES} lines"


def test_a_page_that_comes_a_line_at_a_time_is_hidden_whole():
    """The pump hands the printer what each read got: a page's frames may
    come in a chunk of their own, with no head line in it."""
    p, _, err = console()
    for line in PAGE.splitlines(keepends=True):
        p.write(2, Stream.STDERR, line)
    p.write(2, Stream.STDERR, b"the script's own line\n")
    p.flush()
    assert err.getvalue() == b"[2] the script's own line\n"
    assert p.pages.said() == f"process 2: JAX's fatal-error page, {PAGE_LINES} lines"


def test_the_agents_word_that_a_peer_failed_is_a_page_of_its_own():
    """It stayed on the console before issue 74 (test_teardown_noise.py):
    now it heads a page, as every page's first lines do."""
    p, _, err = console()
    p.write(1, Stream.STDERR, b"E1205 21:40:12.3 coordination_service_agent.cc:100] Polled an error from coordination "
                              b"service: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
                              b"ipv4:10.0.0.2:8476: Connection refused\n")
    p.flush()
    assert err.getvalue() == b"" and p.pages.said() == "process 1: JAX's fatal-error page, 1 line"


def test_v_shows_the_pages_and_counts_nothing():
    p, _, err = console(show_noise=True)
    p.write(1, Stream.STDERR, PAGE)
    p.flush()
    assert err.getvalue() == b"".join(b"[1] " + line for line in PAGE.splitlines(keepends=True))
    assert p.pages.said() is None


def test_a_lost_peers_traceback_goes_with_the_pages_and_a_users_stays():
    """A process that raised because the service was gone: its chained
    traceback is a consequence, counted with the pages; a user's own error
    (here a JaxRuntimeError with the same RPC details under it) is shown."""
    p, _, err = console()
    p.write(1, Stream.STDERR, STARTING + FATAL)
    p.flush()
    assert err.getvalue() == b"", err.getvalue().decode()
    lines = len(STARTING.splitlines()) + 1
    assert p.pages.said() == f"process 1: JAX's fatal-error page and a lost-peer traceback, {lines} lines"
    own = (b"Traceback (most recent call last):\n"
           b'  File "/w/train.py", line 9, in <module>\n'
           b"jax.errors.JaxRuntimeError: INVALID_ARGUMENT: the key batch/7 was never set\n"
           b"Additional GRPC error information from remote target coordination_service while calling "
           b"/xla.coordination.CoordinationService/GetKeyValue:\n")
    p, _, err = console()
    p.write(0, Stream.STDERR, own)
    p.flush()
    assert b"INVALID_ARGUMENT: the key batch/7" in err.getvalue() and b"Additional GRPC" in err.getvalue()
    assert p.pages.said() is None


@pytest.mark.parametrize("line", [
    b':UNKNOWN:Error received from peer {grpc_status:4, grpc_message:"Deadline Exceeded"}\n',
    b"    @     0x7fd84fc40634  a frame the script printed itself\n",
    b"Additional GRPC error information from remote target coordination_service while calling X:\n",
    b"--------------------\n",
    b"\n",
])
def test_a_pages_body_lines_outside_a_page_stay(line):
    p, _, err = console()
    p.write(1, Stream.STDERR, line)
    p.flush()
    assert err.getvalue() == b"[1] " + line and p.pages.said() is None


def test_the_grouped_view_leaves_the_pages_to_the_logs_too(tmp_path):
    out_log, err_log = tmp_path / "process-1.stdout", tmp_path / "process-1.stderr"
    out_log.write_bytes(b"")
    err_log.write_bytes(b"before\n" + PAGE + b"after\n")
    p, out, err = console(mode="grouped")
    p.grouped(1, str(out_log), str(err_log))
    assert err.getvalue() == b"before\nafter\n"
    assert p.pages.said() == f"process 1: JAX's fatal-error page, {PAGE_LINES} lines"


def test_a_checks_diagnosis_is_left_to_the_summary_and_other_lines_stay():
    """Every process that judged writes the check's lines; the console shows
    the job's one diagnosis, in the summary (test_summary_rules.py)."""
    p, _, err = console()
    p.write(0, Stream.STDERR, b"jaxrun: warning: a line that comes before any diagnosis\n")
    for rank in range(4):
        p.write(rank, Stream.STDERR, f"{contract.DIAGNOSIS_HEAD}\njaxrun: processes 0-3 parted: ...\n"
                                     "jaxrun:   processes 1, 2, 3 wait at train.py:83\n".encode())
    p.write(2, Stream.STDERR, b"a line of the script's\n")
    p.flush()
    assert err.getvalue() == (b"[0] jaxrun: warning: a line that comes before any diagnosis\n"
                              b"[2] a line of the script's\n"), err.getvalue().decode()


def test_junits_output_of_a_process_is_the_consoles_without_the_pages(tmp_path):
    """--junit-xml's system-err is the end of a log as the console shows it."""
    import xml.etree.ElementTree as ET

    from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason, Verdict
    from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
    from jaxrun.reporting import junit

    recs = []
    for rank in (0, 1):
        spec = ProcessSpec(rank, rank, LOCAL_HOST, "python", (), {})
        rec = ProcessRecord(spec, str(tmp_path / f"process-{rank}.stdout"), str(tmp_path / f"process-{rank}.stderr"),
                            str(tmp_path / f"process-{rank}.error.json"), pid=100 + rank, started_at=1.0,
                            ended_at=2.0, returncode=3 if rank == 0 else -6,
                            verdict=Verdict.ROOT_CAUSE if rank == 0 else Verdict.CONSEQUENCE)
        (tmp_path / f"process-{rank}.stdout").write_text("")
        (tmp_path / f"process-{rank}.stderr").write_bytes(b"waiting in the collective\n" + PAGE if rank else b"")
        recs.append(rec)
    xml = junit.render(Outcome(recs, 3, StopReason.FAILURE, root_cause=0), suite="s")
    suite = ET.fromstring(xml.split("\n", 1)[1])
    (case,) = [case for case in suite.iter("testcase") if case.get("name") == "process 1"]
    assert case.find("system-err").text == "waiting in the collective\n"
