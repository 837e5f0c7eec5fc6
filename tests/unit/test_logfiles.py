"""Log folders, log files and reports as another user or a planted symlink
would meet them (#16), and reports that read only the end of huge logs."""

from __future__ import annotations

import json
import os
import stat
import threading
import tracemalloc

import pytest

from jaxrun import contract
from jaxrun.contract import ErrorRecord
from jaxrun.core import causes, logfiles
from jaxrun.core.config import LaunchError
from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
from jaxrun.launcher.output import logs
from jaxrun.reporting import diagnosis, history, report, stacks

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def victim(tmp_path):
    """A file of the user's own that a planted symlink points at."""
    path = tmp_path / "precious"
    path.write_text("keep me\n")
    return path


# -- the per-user base folder ------------------------------------------------


def test_default_base_is_per_user(tmp_path):
    assert logfiles.default_base(str(tmp_path)) == str(tmp_path / f"jaxrun-logs-{os.geteuid()}")


def test_private_base_is_created_0700(tmp_path):
    old = os.umask(0)  # even with a permissive umask
    try:
        base, why = logfiles.private_base(str(tmp_path))
    finally:
        os.umask(old)
    assert (base, why) == (str(tmp_path / f"jaxrun-logs-{os.geteuid()}"), None)
    assert mode(base) == 0o700
    assert logfiles.private_base(str(tmp_path)) == (base, None)  # and found again


def _taken_by_a_random_one(tmp_path, problem: str) -> str:
    """The base a run gets where the usual name is not ours alone: a new
    folder of a random name beside it, 0700, said in one line; the next run
    and ``jaxrun logs`` (default_base) find the same one."""
    usual = tmp_path / f"jaxrun-logs-{os.geteuid()}"
    base, why = logfiles.private_base(str(tmp_path))
    assert os.path.dirname(base) == str(tmp_path) and os.path.basename(base).startswith(usual.name + "-")
    assert len(os.path.basename(base)) == len(usual.name) + 9
    st = os.lstat(base)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and mode(base) == 0o700
    assert why == (f"jaxrun: the log folder {usual} is not yours alone ({problem}): this run's logs are in {base}, "
                   "a private folder of a random name")
    assert logfiles.private_base(str(tmp_path))[0] == base
    assert logfiles.default_base(str(tmp_path)) == base
    return base


def test_a_base_others_may_read_is_left_as_it_is_for_one_of_a_random_name(tmp_path):
    usual = tmp_path / f"jaxrun-logs-{os.geteuid()}"
    usual.mkdir(mode=0o755)
    os.chmod(usual, 0o755)
    _taken_by_a_random_one(tmp_path, "other users have access to it (mode 0755)")
    assert mode(usual) == 0o755  # never repaired


@pytest.mark.parametrize("kind", ["symlink", "file", "fifo"])
def test_a_base_that_is_not_a_folder_is_left_for_one_of_a_random_name(tmp_path, kind):
    usual = tmp_path / f"jaxrun-logs-{os.geteuid()}"
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    {"symlink": lambda: usual.symlink_to(real), "file": lambda: usual.write_text(""),
     "fifo": lambda: os.mkfifo(usual)}[kind]()
    _taken_by_a_random_one(tmp_path, "it is not a folder (a symlink or a file)")
    assert os.listdir(real) == []  # nothing through the link


@as_root
def test_a_base_of_another_user_is_left_for_one_of_a_random_name(tmp_path):
    # The case: another user made the name first.
    usual = tmp_path / f"jaxrun-logs-{os.geteuid()}"
    usual.mkdir(mode=0o700)
    os.chown(usual, NOBODY, NOBODY)
    mine = _taken_by_a_random_one(tmp_path, f"it belongs to uid {NOBODY}")
    # Their folders of the random shape are never taken for ours.
    theirs = tmp_path / (usual.name + "-aaaaaaaa")
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    assert logfiles.private_base(str(tmp_path))[0] == mine


# -- --log-dir before the start --------------------------------------------


def test_log_dir_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(LaunchError, match=f"--log-dir {tmp_path}/f/a/b: {tmp_path}/f is a file, not a folder"):
        logfiles.check_log_dir(str(tmp_path / "f" / "a" / "b"))


def test_log_dir_check_creates_nothing(tmp_path):
    logfiles.check_log_dir(str(tmp_path / "a" / "b"))
    assert list(tmp_path.iterdir()) == []


@as_root
def test_log_dir_another_user_owns_may_be_used_when_writable(tmp_path):
    # A team's folder: every file jaxrun makes in it is new, and the user's own.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    logfiles.check_log_dir(str(theirs))
    logfiles.prepare_log_dir(str(theirs))


@as_root
def test_log_dir_symlink_made_by_another_user_is_refused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    link = tmp_path / "link"
    link.symlink_to(mine)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(LaunchError, match=f"is a symlink that uid {NOBODY} made"):
        logfiles.check_log_dir(str(link))


# -- the run's folder -----------------------------------------------------------


def test_run_folder_is_created_0700_with_its_parents(tmp_path):
    path = tmp_path / "a" / "b"
    logfiles.prepare_log_dir(str(path))
    assert mode(path) == 0o700


def test_reused_folder_loses_stale_error_records_even_dangling_links(tmp_path, victim):
    (tmp_path / "process-0.error.json").write_text('{"type": "Old", "message": "stale"}')
    (tmp_path / "process-1.error.json").symlink_to(tmp_path / "absent")
    (tmp_path / "process-2.error.json").symlink_to(victim)
    (tmp_path / "notes.txt").write_text("mine")
    logfiles.prepare_log_dir(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "precious"]
    assert victim.read_text() == "keep me\n" and not (tmp_path / "absent").exists()


def test_a_file_where_the_run_folder_goes_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(LaunchError, match="is not a folder"):
        logfiles.prepare_log_dir(str(tmp_path / "f"))
    with pytest.raises(LaunchError, match=f"cannot create the log folder {tmp_path}/f/a/b"):
        logfiles.prepare_log_dir(str(tmp_path / "f" / "a" / "b"))


# -- files ------------------------------------------------------------------------


def test_log_files_are_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        logfiles.open_pumped_log(str(tmp_path / "p.stderr")).close()
    finally:
        os.umask(old)
    assert mode(tmp_path / "p.stderr") == 0o600


def test_planted_symlink_is_replaced_never_followed(tmp_path, victim):
    log = tmp_path / "process-0.stdout"
    log.symlink_to(victim)
    opened = logfiles.open_pumped_log(str(log))
    opened.write(b"new\n")
    opened.close()
    assert victim.read_text() == "keep me\n"
    assert not log.is_symlink() and log.read_bytes() == b"new\n" and mode(log) == 0o600


def test_earlier_log_is_replaced_not_appended_to(tmp_path):
    log = tmp_path / "process-0.stderr"
    log.write_text("earlier run\n")
    with logfiles.open_pumped_log(str(log)) as f:
        f.write(b"this run\n")
    assert log.read_text() == "this run\n"


# -- reports ------------------------------------------------------------------------


def test_report_folder_must_exist_before_the_start(tmp_path):
    with pytest.raises(LaunchError) as e:
        logfiles.check_writable_file("--report", str(tmp_path / "missing" / "r.json"))
    assert str(e.value) == f"--report {tmp_path}/missing/r.json: the folder {tmp_path}/missing does not exist"
    (tmp_path / "f").write_text("")
    with pytest.raises(LaunchError, match=f"the folder {tmp_path}/f is not a folder"):
        logfiles.check_writable_file("--junit-xml", str(tmp_path / "f" / "j.xml"))
    logfiles.check_writable_file("--report", str(tmp_path / "r.json"))


def test_report_is_written_atomically_through_a_unique_name(tmp_path, victim):
    target = tmp_path / "r.json"
    (tmp_path / "r.json.tmp").symlink_to(victim)  # the old fixed temporary name, planted
    target.symlink_to(victim)
    report.write_report(str(target), {"exit_code": 3})
    assert json.loads(target.read_text()) == {"exit_code": 3} and not target.is_symlink()
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious", "r.json", "r.json.tmp"]


def test_report_into_a_folder_gone_since_the_start_is_one_line_not_a_crash(tmp_path, capsys):
    report.write_report(str(tmp_path / "gone" / "r.json"), {})
    err = capsys.readouterr().err
    assert err.startswith(f"jaxrun: --report {tmp_path}/gone/r.json: cannot write it (No such file or directory)")
    assert len(err.splitlines()) == 1


# -- bounded reads ---------------------------------------------------------------------


DUMP = "Current thread 0x00007f (most recent call first):\n  File \"{script}\", line 2 in <module>\n"


@pytest.fixture
def huge_log(tmp_path):
    """A 32 MiB stderr log that ends with a stack dump."""
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(60)\n")
    log = tmp_path / "process-0.stderr"
    with open(log, "wb") as f:
        f.write((b"y" * 99 + b"\n") * ((32 << 20) // 100))
        f.write(DUMP.format(script=script).encode())
    return log, script


def test_stack_dump_reader_reads_only_the_end_of_a_huge_log(huge_log):
    """After --timeout, where the process was comes from the end of its log."""
    log, script = huge_log
    spec = ProcessSpec(0, 0, LOCAL_HOST, "python", (), {})
    stopped = Outcome([ProcessRecord(spec, str(log.with_suffix(".stdout")), str(log), "")], 124, StopReason.TIMEOUT)
    tracemalloc.start()
    try:
        found = diagnosis.diagnose(stopped)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found.processes[0].frame == (str(script), 2, "<module>", "time.sleep(60)")
    assert peak < 8 * stacks.DUMP_TAIL, peak  # the whole log would be 32 MiB, twice (bytes and text)


def test_report_tail_reads_only_the_end_of_a_huge_log(huge_log):
    log, _ = huge_log
    tracemalloc.start()
    try:
        lines = diagnosis.tail(str(log))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines[-1] == '  File "' + str(huge_log[1]) + '", line 2 in <module>'
    assert peak < 1 << 20, peak


# -- the one guarded reader: every log and record read after a run ------------

# Every way the launcher reads what a run left, each with what it gives for
# a file it may not read: a FIFO, a symlink, a missing file.
READERS = {
    "contract.read_tail": (lambda path: contract.read_tail(path, 100), None),
    "contract.read_small": (lambda path: contract.read_small(path, 100), None),
    "contract.open_regular": (contract.open_regular, None),
    "causes.read_tail": (causes.read_tail, ""),
    "ErrorRecord.load": (ErrorRecord.load, None),
    "diagnosis.tail": (diagnosis.tail, []),
}


@pytest.mark.parametrize("name", READERS)
def test_a_fifo_in_a_logs_place_neither_blocks_nor_counts(tmp_path, name):
    read, nothing = READERS[name]
    fifo = tmp_path / "process-0.stderr"
    os.mkfifo(fifo)
    result = []
    reader = threading.Thread(target=lambda: result.append(read(str(fifo))), daemon=True)
    reader.start()
    reader.join(timeout=5)
    assert result == [nothing]


@pytest.mark.parametrize("name", READERS)
def test_a_symlink_in_a_logs_place_is_not_followed(tmp_path, name):
    read, nothing = READERS[name]
    secret = tmp_path / "secret"
    secret.write_text(ErrorRecord("ValueError", "another user's secret").to_json() + "\n")
    link = tmp_path / "process-0.error.json"
    link.symlink_to(secret)
    assert read(str(link)) == nothing
    assert read(str(tmp_path / "absent")) == nothing


def test_read_tail_of_missing_short_and_huge_files(tmp_path, huge_log):
    assert contract.read_tail(str(tmp_path / "absent"), 10) is None
    (tmp_path / "short").write_bytes(b"abc")
    assert contract.read_tail(str(tmp_path / "short"), 10) == b"abc"
    assert contract.read_tail(str(tmp_path / "short"), 2) == b"bc"
    log, _ = huge_log
    assert os.path.getsize(log) > 30 << 20
    tracemalloc.start()
    try:
        data = contract.read_tail(str(log), 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(data) == 1000 and data.endswith(b"line 2 in <module>\n")
    assert peak < 1 << 20, peak


def test_read_small_refuses_a_file_over_its_bound_without_reading_it_all(huge_log):
    log, _ = huge_log
    tracemalloc.start()
    try:
        assert contract.read_small(str(log), 1 << 20) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 << 20, peak
    assert contract.read_small(str(log), os.path.getsize(log)) is not None


def test_bad_bytes_are_replaced_not_fatal(tmp_path):
    log = tmp_path / "process-0.stderr"
    log.write_bytes(b"ok\n\xff\xfe broken\n")
    assert diagnosis.tail(str(log)) == ["ok", "\ufffd\ufffd broken"]
    assert causes.read_tail(str(log)).endswith("\ufffd\ufffd broken\n")
    record = tmp_path / "process-0.error.json"
    record.write_bytes(b'{"type": "ValueError", "message": "\xff"}')
    assert ErrorRecord.load(str(record)) == ErrorRecord("ValueError", "\ufffd")
    record.write_bytes(b"\xff\xfe not json")
    assert ErrorRecord.load(str(record)) is None


def test_error_record_is_read_only_up_to_a_bound(tmp_path):
    path = tmp_path / "process-0.error.json"
    path.write_text(ErrorRecord("ValueError", "bad", "Traceback ...").to_json())
    assert ErrorRecord.load(str(path)) == ErrorRecord("ValueError", "bad", "Traceback ...")
    path.write_text(ErrorRecord("ValueError", "x" * (2 << 20)).to_json())
    tracemalloc.start()
    try:
        assert ErrorRecord.load(str(path)) is None  # the summary shows the log's end instead
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * contract.ERROR_RECORD_MAX + (1 << 20), peak
    assert ErrorRecord.load(None) is None


def test_jaxrun_logs_shows_no_file_through_a_symlink_or_a_fifo(tmp_path, capfd):
    secret = tmp_path / "secret"
    secret.write_text("another user's secret\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "process-0.stdout").symlink_to(secret)
    os.mkfifo(run / "process-0.stderr")
    (run / "process-1.stdout").write_text("hello\n")
    (run / "process-1.stderr").write_text("")
    shown = threading.Thread(target=lambda: logs.show(str(run), [0, 1], "stream"), daemon=True)
    shown.start()
    shown.join(timeout=5)
    assert not shown.is_alive()
    out = capfd.readouterr().out
    assert "secret" not in out and "[1] hello" in out


def test_the_run_list_skips_a_record_it_may_not_read(tmp_path, victim):
    for name in ("good", "linked", "huge"):
        (tmp_path / name).mkdir()
    (tmp_path / "good" / history.RECORD).write_text(json.dumps({"started": 2.0, "exit_code": 0}))
    victim.write_text(json.dumps({"started": 1.0, "exit_code": 0}))
    (tmp_path / "linked" / history.RECORD).symlink_to(victim)
    (tmp_path / "huge" / history.RECORD).write_text(json.dumps({"started": 3.0, "pad": "x" * history.RECORD_MAX}))
    assert [os.path.basename(folder) for folder, _ in history.runs(str(tmp_path))] == ["good"]


@pytest.mark.parametrize("record, why", [
    ({"started": "yesterday"}, "started is of the wrong kind (str)"),
    ({"started": 1.0, "argv": "rm -rf /"}, "argv is of the wrong kind (str)"),
    ({"started": 1.0, "argv": [1, 2]}, "an argv that is not a list of words"),
    ({"started": 1e300}, "a started time out of range"),
    ([1, 2], "is not a record"),
])
def test_the_run_list_skips_a_record_jaxrun_did_not_write_in_one_line(tmp_path, record, why):
    for name, said in (("good", {"started": 2.0, "exit_code": 0, "argv": ["jaxrun"]}), ("odd", record)):
        (tmp_path / name).mkdir()
        (tmp_path / name / history.RECORD).write_text(json.dumps(said))
    skipped: list[str] = []
    assert [os.path.basename(folder) for folder, _ in history.runs(str(tmp_path), skipped)] == ["good"]
    assert len(skipped) == 1 and skipped[0].startswith(f"jaxrun: skipped {tmp_path / 'odd'}: ") and why in skipped[0]
