"""The root cause from evidence (``core.causes``): which failures are a
consequence of a lost peer, read from real messages, and which of several
failures came first."""

from __future__ import annotations

import pytest

from jaxrun import contract
from jaxrun.core.causes import Failure, FailureKind, classify, failure_of, first_failure, is_lost_peer, read_tail

# What a JAX 0.10.2 process printed on stderr when a peer (task 3) had died
# with os._exit: the coordination service's error, polled, then a fatal check
# (SIGABRT) about 100 s later.  Recorded on this machine with 4 processes.
HEARTBEAT_ABORT = """\
E1201 21:50:14.879729    3399 coordination_service_agent.cc:289] Polled an error from coordination service \
(this can be an error from this or another task).
F1201 21:50:14.879987    3399 client.h:80] Terminating process because the JAX distributed service detected \
fatal errors. This most likely indicates that another task died; see the other task logs for more details. \
Disable Python buffering, i.e. `python -u`, to be sure to see all the previous output. absl::Status: \
UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
3
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, \
eviction) to debug further.

RPC: /xla.coordination.CoordinationService/PollForError [type.googleapis.com/tensorflow.CoordinationServiceError='']
*** Check failure stack trace: ***
    @     0x7fec00c40634  absl::lts_20260107::log_internal::LogMessage::SendToLog()
    @     0x7fec00c405b6  absl::lts_20260107::log_internal::LogMessage::Flush()
    @     0x7febfcd040ee  xla::CoordinationServiceAgent::SetError()
"""
# The coordinator's own log line on that task (process 0 hosts the service).
SERVICE_ERROR = (
    "E1201 21:50:14.878137    3408 coordination_service.cc:1549] [13041978150647375795] Use error polling to "
    "propagate the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped "
    "sending heartbeats):\n3\nThe tasks have crashed."
)
# Gloo's errors as jaxlib raises them: "Gloo <collective> failed: " and
# Gloo's own pair error (both strings are jaxlib 0.10.2's, from
# libjax_common.so), as the issue quotes them.
GLOO_CLOSED = ("INTERNAL: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:534] "
               "Connection closed by peer [127.0.0.1]:40123")
GLOO_RESET = ("INTERNAL: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:589] "
              "Read error [10.0.0.2]:40123: Connection reset by peer")
BARRIER = ("DEADLINE_EXCEEDED: Barrier timed out. Id: PjRT_Client_Connect. This usually happens because a task "
           "triggered the barrier too early or too slowly.")
LEADER_GONE = ("UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was "
               "preempted/died/restarted unexpectedly or this task is experiencing network issues.")
NCCL = "NCCL WARN NET/Socket : peer 10.0.0.2<45678> remote process exited or there was a network error"

SEGFAULT = """\
Fatal Python error: Segmentation fault

Current thread 0x00007f3c9f5ff740 (most recent call first):
  File "/work/job.py", line 12 in <module>
"""


# A process still starting (mpirun, a loaded machine) or in a key-value wait
# when process 0 ended with the coordination service (issue 74): named
# first at 74d7ebe, and jaxrun exited 1 instead of process 0's 3.
SERVICE_RESET = [
    "RuntimeError: Unable to initialize backend 'cpu': UNAVAILABLE: recvmsg:Connection reset by peer",
    "jax.errors.JaxRuntimeError: UNAVAILABLE: sendmsg: Connection reset by peer (104)",
    "jax.errors.JaxRuntimeError: UNAVAILABLE: Socket closed",
]


@pytest.mark.parametrize("text", [HEARTBEAT_ABORT, SERVICE_ERROR, GLOO_CLOSED, GLOO_RESET, BARRIER, LEADER_GONE,
                                  NCCL, *SERVICE_RESET],
                         ids=["heartbeat-abort", "service", "gloo-closed", "gloo-reset", "barrier", "leader-gone",
                              "nccl", "service-reset-recvmsg", "service-reset-sendmsg", "service-socket-closed"])
def test_messages_of_a_lost_peer_are_consequences(text):
    assert is_lost_peer(text)


@pytest.mark.parametrize("text", [
    SEGFAULT,
    "ValueError: loss is nan at step 12",
    "Traceback (most recent call last):\n  ...\nMemoryError",
    # The user's own network failing is the user's failure, not a lost peer.
    "ConnectionResetError: [Errno 104] Connection reset by peer",
    "urllib.error.URLError: <urlopen error [Errno 111] Connection refused>",
    "",
], ids=["segfault", "exception", "memory", "user-network", "user-url", "nothing"])
def test_a_process_own_failures_are_not(text):
    assert not is_lost_peer(text)


def test_the_record_speaks_before_the_log():
    """A process that recorded an exception is judged by it; the log is
    read only where there is none."""
    gloo = contract.ErrorRecord("JaxRuntimeError", GLOO_CLOSED)
    own = contract.ErrorRecord("ValueError", "bad")
    assert classify(gloo, "") is FailureKind.LOST_PEER
    assert classify(own, HEARTBEAT_ABORT) is FailureKind.OWN
    assert classify(None, HEARTBEAT_ABORT) is FailureKind.LOST_PEER
    assert classify(None, SEGFAULT) is FailureKind.OWN
    assert classify(None, "", lost="the ssh client") is FailureKind.HELPER_LOST
    assert classify(None, HEARTBEAT_ABORT, lost="the ssh client") is FailureKind.LOST_PEER


def test_failure_of_reads_the_files(tmp_path):
    error_file, stderr_log = tmp_path / "e.json", tmp_path / "process-2.stderr"
    stderr_log.write_text("x" * 100_000 + HEARTBEAT_ABORT)  # only the end is read
    failure = failure_of(2, str(error_file), str(stderr_log), 50.5, "here", None)
    assert failure == Failure(2, FailureKind.LOST_PEER, 50.5, "here")
    contract.ErrorRecord("ValueError", "bad", "", 50.25).dump(str(error_file))
    failure = failure_of(2, str(error_file), str(stderr_log), 50.5, "here", None)
    assert failure == Failure(2, FailureKind.OWN, 50.25, "here")
    assert failure_of(2, None, None, None, None, "the ssh client") == Failure(2, FailureKind.HELPER_LOST)
    assert read_tail(str(tmp_path / "missing")) == ""


# -- which came first ----------------------------------------------------------------

def test_an_own_failure_comes_before_consequences_heard_first():
    heard = [Failure(2, FailureKind.LOST_PEER, 100.025, "h"), Failure(3, FailureKind.OWN, 100.03, "h")]
    assert first_failure(heard) == 3


def test_a_lost_helper_comes_after_an_own_failure_and_before_consequences():
    assert first_failure([Failure(0, FailureKind.HELPER_LOST), Failure(1, FailureKind.OWN, 5.0, "a")]) == 1
    assert first_failure([Failure(0, FailureKind.LOST_PEER, 1.0, "a"), Failure(1, FailureKind.HELPER_LOST)]) == 1


def test_own_failures_on_one_clock_go_by_time_across_clocks_by_arrival():
    one_clock = [Failure(0, FailureKind.OWN, 50.2, "a"), Failure(1, FailureKind.OWN, 50.1, "a"),
                 Failure(2, FailureKind.OWN, 50.0, "b")]
    assert first_failure(one_clock) == 1  # 2 is earlier, but by another machine's clock
    assert first_failure([Failure(0, FailureKind.OWN, 50.2, "a"), Failure(1, FailureKind.OWN, 50.1, "b")]) == 0
    # An unknown time or clock is never compared.
    assert first_failure([Failure(0, FailureKind.OWN, None, "a"), Failure(1, FailureKind.OWN, 50.1, "a")]) == 0
    assert first_failure([Failure(0, FailureKind.OWN, 50.2, None), Failure(1, FailureKind.OWN, 50.1, None)]) == 0
    # Equal times keep the order heard.
    assert first_failure([Failure(3, FailureKind.OWN, 7.0, "a"), Failure(1, FailureKind.OWN, 7.0, "a")]) == 3


def test_consequences_alone_keep_the_first_heard():
    """Their times say when each noticed the loss, not who was lost."""
    heard = [Failure(1, FailureKind.LOST_PEER, 9.0, "a"), Failure(0, FailureKind.LOST_PEER, 8.0, "a")]
    assert first_failure(heard) == 1
    assert first_failure([]) is None
