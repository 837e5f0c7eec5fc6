"""Where a local job's coordination service listens, and what is said when
another process got into it (issue 58).

The service has no authentication: a local run puts it on a Unix socket in
the user's 0700 socket folder (``backends.local.local_coordinator``), never a
port that another user of the machine can open; a summary names a task that
registered twice instead of blaming a process of the job."""

from __future__ import annotations

import os
import signal
import socket
import stat
import tempfile

from jaxrun import contract, portable
from jaxrun.backends import local
from jaxrun.child.join import addresses
from jaxrun.core import causes
from jaxrun.core.config import LaunchError
from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason, Verdict
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
from jaxrun.reporting import diagnosis, github, report, summary

# process 2's log at the abort the outsider of issue 58 caused (JAX 0.10.2)
ABORT = ("F1205 05:31:38.865277   31388 client.h:80] Terminating process because the JAX distributed service "
         "detected fatal errors. This most likely indicates that another task died; see the other task logs for "
         "more details. absl::Status: ABORTED: 1 unexpectedly tried to connect with a different incarnation. "
         "It has likely restarted.\n\nRPC: /xla.coordination.CoordinationService/PollForError\n"
         "*** Check failure stack trace: ***\n    @     0x7fbe52040634  absl::log_internal::LogMessage::SendToLog()\n")


def test_a_local_run_serves_on_a_socket_in_the_private_folder(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    address, bind = local.local_coordinator(None)
    path = contract.unix_socket_path(address)
    assert bind == address and path is not None  # one socket file, nothing on the network
    folder = os.lstat(os.path.dirname(path))
    assert os.path.dirname(path) == portable.sockets.private_socket_folder()
    assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.getuid()
    assert len(path) <= portable.sockets.LONGEST_SOCKET_PATH
    assert local.local_coordinator(None)[0] != address  # each attempt its own


def test_the_bind_address_is_never_a_wildcard_nor_a_port(tmp_path, monkeypatch):
    """What process 0 is told to bind (its environment, as JAX reads it)."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    _, bind = local.LocalBackend({}).choose_coordinator(None)
    env = contract.bind_env(bind)
    for name in (contract.COORDINATOR_BIND_ADDRESS, contract.JAX_COORDINATOR_BIND_ADDRESS):
        assert env[name].startswith(contract.UNIX_SCHEME), env
        assert "0.0.0.0" not in env[name] and "[::]" not in env[name]


def test_no_folder_at_all_is_refused_never_moved_onto_a_port(tmp_path, monkeypatch):
    """Where no private folder can be made (the temporary folder is a file),
    the run stops with a line that names --coordinator: a port the user did
    not ask for would be open to every user of the machine."""
    fd, short = tempfile.mkstemp(dir="/tmp")  # short: a long one would move the folder to /tmp
    os.close(fd)
    monkeypatch.setattr("tempfile.tempdir", short)
    try:
        local.local_coordinator(None)
    except LaunchError as e:
        assert "pass --coordinator HOST:PORT" in str(e), e
    else:
        raise AssertionError("a port was chosen")
    finally:
        os.unlink(short)


def test_the_name_fits_where_the_longest_temporary_folder_leaves_room(tmp_path, monkeypatch):
    """temp_base_for_sockets keeps $TMPDIR only where the folder's name, a
    random part's 9 bytes and 27 more fit: a coordinator's socket must fit
    there too, in a folder of a random name as well."""
    name = portable.sockets.SOCKET_FOLDER.format(uid=os.getuid())
    room = len(name) + portable.sockets.RANDOM_ROOM + portable.sockets.SOCKET_NAME_ROOM
    base = "/" + "t" * (portable.sockets.LONGEST_SOCKET_PATH - room - 1)  # the longest it keeps
    monkeypatch.setattr("tempfile.tempdir", base)
    assert portable.temp_base_for_sockets(room) == base
    folder = os.path.join(base, name + "-abcdefgh")
    assert len(local.coordinator_socket(folder)) <= portable.sockets.LONGEST_SOCKET_PATH


def test_the_user_s_address_is_kept(tmp_path):
    port = portable.free_port("127.0.0.1")
    assert local.local_coordinator(f"127.0.0.1:{port}") == (f"127.0.0.1:{port}",) * 2


def test_the_attempt_s_end_removes_its_socket_file(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    backend = local.LocalBackend({})
    address, _ = backend.choose_coordinator(None)
    path = contract.unix_socket_path(address)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)  # as process 0's service, killed before it could remove it
    backend.end_attempt()
    assert not os.path.exists(path)


def test_address_host_reads_both_forms():
    assert contract.address_host("unix:/tmp/x/coordinator-1.sock") == "127.0.0.1"
    assert contract.address_host("[fe80::1]:1234") == "fe80::1"
    assert contract.address_host("hostA:1234") == "hostA"
    assert addresses.reachable_address("unix:/tmp/x.sock") == "127.0.0.1"


def test_the_service_s_complaint_names_the_task():
    assert causes.second_registration(ABORT) == 1
    assert causes.second_registration("ABORTED: 12 unexpectedly tried to connect with a different incarnation") == 12
    assert causes.second_registration("Gloo all-reduce failed: Connection closed by peer") is None
    assert causes.is_lost_peer(ABORT)  # each abort is a consequence, never a root cause


def aborted_by_an_outsider(folder) -> Outcome:
    recs = []
    for rank in range(3):
        spec = ProcessSpec(rank, rank, LOCAL_HOST, "python", (), {})
        rec = ProcessRecord(spec, str(folder / f"p{rank}.out"), str(folder / f"p{rank}.err"),
                            str(folder / f"p{rank}.error.json"), pid=100 + rank, started_at=1.0, ended_at=2.0,
                            returncode=-signal.SIGABRT, verdict=Verdict.CONSEQUENCE)
        (folder / f"p{rank}.out").write_text("")
        (folder / f"p{rank}.err").write_text(f"step 3 of process {rank}\n" + ABORT)
        recs.append(rec)
    recs[2].verdict = Verdict.ROOT_CAUSE  # the first abort heard
    return Outcome(recs, 134, StopReason.FAILURE, root_cause=2)


def test_a_second_registration_is_named_and_no_process_is_blamed(tmp_path):
    outcome = aborted_by_an_outsider(tmp_path)
    found = diagnosis.of(outcome)
    assert found.kind is diagnosis.Kind.SECOND_REGISTRATION and found.root is None
    assert found.second_registration == 1
    assert diagnosis.attempt_fingerprint(found) is None  # never "the same failure" for the restart policy
    lines = summary.summary_lines(outcome, str(tmp_path))
    text = "\n".join(lines)
    assert "task 1 of the job registered a second time with the coordination service" in text
    assert "processes 0, 1, 2 failed after it" in text
    assert "failed first" not in text
    assert "task 1 registered a second time" in github.error_annotation(outcome)
    attempt = report.report_dict([outcome], "run", [str(tmp_path)])["attempts"][0]
    assert attempt["second_registration"] == 1 and attempt["root_cause"] is None


def test_an_abort_without_that_complaint_keeps_its_root_cause(tmp_path):
    outcome = aborted_by_an_outsider(tmp_path)
    (tmp_path / "p2.err").write_text("Traceback ...\nValueError: bad batch\n")
    for rank in (0, 1):
        (tmp_path / f"p{rank}.err").write_text("Gloo all-reduce failed: Connection closed by peer\n")
    found = diagnosis.of(outcome)
    assert found.kind is diagnosis.Kind.PROCESS_FAILURE and found.root.rank == 2
    assert found.second_registration is None
