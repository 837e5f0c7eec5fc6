"""The job against its environment (issue #69): nothing of the launcher's
own ever ends the job or loses its output silently.

- A full log disk: the processes go on, the summary and the report say
  which file stopped, when, and how much it lacks, and a traceback written
  after the disk filled is still in the summary.
- One running job per log folder: a second run given a folder in use is
  refused in one line that names the first, and touches nothing of it.
- A SIGKILLed jaxrun's coordination service socket is removed by the next
  command, as its control channel's is.
- File limits: the open-file estimate is measured and counts what is open
  already; a small job runs under a small limit, and descriptors inherited
  up to the limit are one line and exit 70, with nothing started.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time

import pytest
from fixtures.jobs import DATA, JAXRUN, TOKEN, wait_gone

from jaxrun import contract

pytestmark = pytest.mark.timeout(180)

FLOOD = DATA / "log_flood.py"
WAITER = DATA / "wait_for_file.py"
JOINER = DATA / "import_and_wait.py"
PRINTED = 40 * 100 * 1024  # what each of log_flood.py's processes prints


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MB tmpfs, unmounted at the end: a log disk that fills."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def lost_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("jaxrun: logs incomplete: ")]


@pytest.mark.both_modes
@pytest.mark.parametrize("portable", [False, True], ids=["splice", "copied"])
def test_a_full_log_disk_never_ends_the_job_and_the_summary_says_what_each_log_lacks(jaxrun, tmp_path, tiny_disk,
                                                                                     portable):
    """``copied``: as on a system without splice, the bytes go through jaxrun's memory."""
    side = tmp_path / "side"
    side.mkdir()
    logs, report = tiny_disk / "run", tmp_path / "report.json"
    code, out, err = jaxrun("-n", 2, "--cpu-devices", 1, "--log-dir", logs, "--console-ranks", "none",
                            "--report", report, FLOOD, side, env={contract.PORTABLE: "1"} if portable else {})
    assert code == 0, err
    assert [(side / f"steps-{rank}").read_text() for rank in range(2)] == ["39", "39"]  # every step ran
    lines = lost_lines(err)
    assert lines, err
    for line in lines:
        assert "(No space left on device)" in line and "the process went on" in line, line
    processes = json.loads(report.read_text())["attempts"][0]["processes"]
    for rank, process in enumerate(processes):
        stdout = [loss for loss in process["logs_lost"] if loss["stream"] == "stdout"]
        assert len(stdout) == 1, process["logs_lost"]
        loss = stdout[0]
        assert loss["path"] == str(logs / f"process-{rank}.stdout") and loss["error"] == "No space left on device"
        # Every byte is either in the file or counted as lost, and the file holds exactly what it says.
        assert loss["bytes_kept"] + loss["bytes_lost"] == PRINTED
        assert os.path.getsize(loss["path"]) == loss["bytes_kept"]
        assert loss["at"] >= process["started_at"]
        assert any(line.startswith(f"jaxrun: logs incomplete: process {rank}'s stdout log {loss['path']} stopped at ")
                   for line in lines), lines


def test_a_traceback_written_after_the_disk_filled_is_in_the_summary(jaxrun, tmp_path, tiny_disk):
    side = tmp_path / "side"
    side.mkdir()
    logs = tiny_disk / "run"
    code, out, err = jaxrun("-n", 2, "--cpu-devices", 1, "--log-dir", logs, FLOOD, side, "fail")
    assert code == 1, err
    assert [(side / f"steps-{rank}").read_text() for rank in range(2)] == ["39", "39"]
    summary = err[err.index("jaxrun: logs incomplete"):]
    assert "failed first: exit code 1" in summary, err
    assert "kept of it in memory" in summary and "RuntimeError: failed after the log disk filled" in summary, err
    # A stderr log that could not take the traceback: the summary's came from
    # memory.  (Not always process 0's: a log whose last page has room still
    # takes a few lines on a full tmpfs, as a stack dump of a loaded run did.)
    assert any("failed after the log disk filled" not in (logs / f"process-{r}.stderr").read_text() for r in range(2))
    # The console still showed what the files could not hold (its view of each process).
    assert out.count("[0] " + "x" * 1023) == 4000 and out.count("[1] " + "x" * 1023) == 4000


# -- one running job per log folder ---------------------------------------------------------


def wait_for(check, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def test_a_log_folder_in_use_by_a_running_job_is_refused_and_a_finished_ones_is_reused(launch, jaxrun, tmp_path):
    logs, go = tmp_path / "shared-logs", tmp_path / "go"
    first = launch("-n", 2, "--cpu-devices", 1, "--log-dir", logs, WAITER, go)
    try:
        assert wait_for(lambda: all("started" in read(logs / f"process-{r}.stdout") for r in range(2)))
        code, out, err = jaxrun("-n", 2, "--cpu-devices", 1, "--log-dir", logs, WAITER, go)
        assert code == 2, err
        line = (f"jaxrun: error: --log-dir {logs} is in use by a running job: run "
                f"{first_run_id(err)} (jaxrun pid {first.proc.pid}, started ")
        assert err.startswith(line) and err.count("\n") == 1, err
        assert ": jaxrun -n 2 --cpu-devices 1 --log-dir " in err and "); give this run another --log-dir" in err
        assert out == ""
    finally:
        go.touch()
    assert first.wait() == 0, first.stderr
    for rank in range(2):  # the first job's logs are whole, its record its own
        assert read(logs / f"process-{rank}.stdout") == "started\nends\n"
    record = json.loads((logs / "run.json").read_text())
    assert record["exit_code"] == 0 and str(go) in record["argv"]
    # Its job over, the folder is free: reused on purpose, as before.
    code, out, err = jaxrun("-n", 2, "--cpu-devices", 1, "--log-dir", logs, WAITER, go)
    assert code == 0, err
    assert f"jaxrun: logs in {logs}" in err


def read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def first_run_id(err: str) -> str:
    return err.split("in use by a running job: run ", 1)[1].split(" ", 1)[0]


# -- what a killed run leaves behind --------------------------------------------------------


def coordinator_socket_of(logs) -> str | None:
    """The coordination service's socket file, as process 0 printed its address."""
    words = read(logs / "process-0.stdout").split()
    return contract.unix_socket_path(words[2]) if len(words) > 2 else None


@pytest.mark.parametrize("next_command", ["top", "run"])
def test_a_sigkilled_runs_coordinator_socket_is_removed_by_the_next_command(launch, jaxrun, tmp_path, next_command):
    logs, go = tmp_path / "logs", tmp_path / "go"
    job = launch("-n", 2, "--cpu-devices", 1, "--log-dir", logs, JOINER, go)
    try:
        assert wait_for(lambda: all("joined" in read(logs / f"process-{r}.stdout") for r in range(2)))
        path = coordinator_socket_of(logs)
        assert path is not None and os.path.exists(path)
        job.proc.kill()  # jaxrun alone: its processes follow through their lifeline
        job.proc.wait()
        assert not wait_gone(os.environ[TOKEN], within=30)
    finally:
        go.touch()
    assert os.path.exists(path)  # nobody removed it
    time.sleep(1.1)  # past the age a socket between its bind and its listen may have (core.stale.YOUNG)
    if next_command == "top":
        subprocess.run([*JAXRUN, "top"], capture_output=True, timeout=60)  # whatever it finds (another job)
    else:
        code, out, err = jaxrun("-n", 2, "--cpu-devices", 1, "--log-dir", tmp_path / "next", JOINER, go)
        assert code == 0, err
    assert not os.path.exists(path)


# -- file limits ---------------------------------------------------------------------------------


def limited(limit: int, inherited: int = 0):
    """A preexec_fn: ``inherited`` descriptors open (as a shell may pass on), then ``ulimit -n limit``."""

    def pre() -> None:
        for _ in range(inherited):
            os.set_inheritable(os.open(os.devnull, os.O_RDONLY), True)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return pre


def test_one_process_runs_under_ulimit_n_64(jaxrun, tmp_path):
    go = tmp_path / "go"
    go.touch()
    code, out, err = jaxrun("-n", 1, "--log-dir", tmp_path / "logs", JOINER, go, preexec_fn=limited(64))
    assert code == 0, err
    assert "joined 0" in out


def test_descriptors_inherited_up_to_the_limit_are_one_line_and_exit_70_with_nothing_started(jaxrun, tmp_path):
    go = tmp_path / "go"
    go.touch()
    logs = tmp_path / "logs"
    code, out, err = jaxrun("-n", 1, "--log-dir", logs, JOINER, go, preexec_fn=limited(64, inherited=64),
                            close_fds=False)
    assert code == 70, err
    assert err.count("\n") == 1 and err.startswith("jaxrun: error: -n 1: jaxrun needs about "), err
    assert "are open already (inherited) and the open-file limit is 64 (ulimit -Hn)" in err
    assert out == "" and not logs.exists()
