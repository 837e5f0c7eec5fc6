"""A recoverable job's pure parts: the recoverable flag from the shim's joined
file to the launcher (each far end's way), the rules in ``launcher.restarts.recovery``,
a task agent's exit, the records of each run, and what the reports make of
them.  The supervisor's side is in test_supervisor.py; real jobs in
tests/e2e/test_recoverable.py."""

from __future__ import annotations

import dataclasses
import os
import random
import threading

import pytest

from jaxrun import contract
from jaxrun.backends.scheduler.task_agent import spares_the_others
from jaxrun.backends.ssh.stream import AgentStderr
from jaxrun.core.backend import News
from jaxrun.core.joinwatch import JoinWatch
from jaxrun.core.logfiles import life_paths, log_paths
from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason, Verdict
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
from jaxrun.launcher.attempt.slots import Slot
from jaxrun.reporting import junit, report, summary
from jaxrun.wire import encoding, ssh, tasks

# -- the flag -------------------------------------------------------------------------


@pytest.mark.parametrize("recoverable", [True, False])
def test_the_joined_file_holds_the_flag_whole_and_is_never_replaced(tmp_path, recoverable):
    path = str(tmp_path / "process-0.joined")
    assert contract.mark_joined(path, recoverable)
    assert contract.joined_recoverable(path) is recoverable
    assert contract.mark_joined(path, not recoverable)  # a checked no-op initialize: the first join stands
    assert contract.joined_recoverable(path) is recoverable
    assert os.listdir(tmp_path) == ["process-0.joined"]  # no copy left beside it
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_a_joined_path_that_is_a_link_is_refused_and_never_read_through(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text(contract.RECOVERABLE)
    link = tmp_path / "process-0.joined"
    link.symlink_to(target)
    assert contract.joined_recoverable(str(link)) is False
    assert contract.mark_joined(str(link), True)  # exists: the link is left as it is
    assert target.read_text() == contract.RECOVERABLE and link.is_symlink()


@pytest.mark.parametrize("recoverable", [True, False])
def test_a_far_ends_join_watch_tells_the_flag(tmp_path, recoverable):
    path = str(tmp_path / "joined")
    heard: list[bool] = []
    told = threading.Event()
    watch = JoinWatch(path, lambda flag: (heard.append(flag), told.set()), interval=0.01).start()
    contract.mark_joined(path, recoverable)
    assert told.wait(5)
    watch.stop()
    assert heard == [recoverable] and not os.path.exists(path)


@pytest.mark.parametrize("seed", range(10))
def test_the_ssh_stream_tells_which_join_marker_came(seed):
    joins: list[bool] = []
    heard = AgentStderr(News(joins.append), None)
    stream = b"a\n" + ssh.JOINED_RECOVERABLE_MARKER + b"b\n" + ssh.JOINED_MARKER + b"c\n"
    rng, out, at = random.Random(seed), b"", 0
    while at < len(stream):
        step = rng.choice((1, 2, 5, 13, 4096))
        out += heard.feed(stream[at:at + step])
        at += step
    out += heard.close()
    assert (out, joins) == (b"a\nb\nc\n", [True, False])


def test_the_task_channels_join_carries_the_flag_both_ways():
    assert encoding.decode(tasks.TaskJoined(True).encode()) == tasks.TaskJoined(True)
    assert encoding.decode(b"joined []") == tasks.TaskJoined(False)  # an agent that says nothing of it


@pytest.mark.parametrize("mode, told, spared", [
    (None, True, True), (None, False, False), ("auto", True, True),
    ("on", False, True), ("off", True, False)])
def test_a_task_agent_spares_the_gang_only_as_the_launcher_decided(mode, told, spared):
    """``told``: the launcher's word on the control connection (tasks.JobRecoverable)."""
    assert spares_the_others(mode, told) is spared


# -- the records ----------------------------------------------------------------------------

def next_life(record: ProcessRecord, folder: str) -> ProcessRecord:
    """The record of the next life in the slot that holds ``record``."""
    return Slot(record.spec.rank, record).next_life(folder)


def spec(rank=2, env=None):
    return ProcessSpec(rank, rank, LOCAL_HOST, "python", (), env or {contract.RESTART_COUNT: "1"})


def test_the_next_life_keeps_id_and_environment_and_counts_its_restarts(tmp_path):
    first = ProcessRecord(spec(), *log_paths(str(tmp_path), 2), pid=11, returncode=-9)
    second = next_life(first, str(tmp_path))
    third = next_life(second, str(tmp_path))
    assert third.spec.env == {contract.RESTART_COUNT: "3", contract.PROCESS_RESTARTS: "2"}
    assert (third.spec.rank, third.life, third.stdout_log) == (2, 2, str(tmp_path / "process-2.life-2.stdout"))
    assert third.lives == [first, second, third] and first.verdict is Verdict.RESTARTED
    assert first.earlier == [] and second.earlier == []  # only the last run holds the list
    for record in third.lives:
        open(record.stdout_log, "w").close()
    assert [paths[0] for paths in life_paths(str(tmp_path), 2)] == [r.stdout_log for r in third.lives]


def finished_job(tmp_path) -> Outcome:
    """3 processes; process 2 was SIGKILLed, started again alone, and exited 0."""
    folder = str(tmp_path)
    records = [ProcessRecord(spec(r, {}), *log_paths(folder, r), pid=100 + r, started_at=1.0, ended_at=9.0,
                             returncode=0, verdict=Verdict.OK) for r in range(3)]
    first = dataclasses.replace(records[2], returncode=-9, ended_at=3.0)
    records[2] = next_life(first, folder)
    records[2].pid, records[2].started_at, records[2].ended_at, records[2].returncode = 200, 3.5, 9.0, 0
    records[2].verdict = Verdict.OK
    for rec in (*records, first):
        with open(rec.stdout_log, "w") as f:
            f.write(f"out of pid {rec.pid}\n")
        open(rec.stderr_log, "w").close()
    return Outcome(records, 0, None, ran_out=True, recoverable=True)


def test_the_report_lists_each_process_runs(tmp_path):
    data = report.report_dict([finished_job(tmp_path)], "run", [str(tmp_path)])
    (attempt,) = data["attempts"]
    assert attempt["recoverable"] is True
    two = data["processes"][2]
    assert (two["pid"], two["restarts"], [r["pid"] for r in two["lives"]]) == (200, 1, [102, 200])
    assert [(r["signal"], r["exit_code"], r["verdict"]) for r in two["lives"]] == \
        [("SIGKILL", None, "failed, started again alone"), (None, 0, "ok")]
    assert [len(p["lives"]) for p in data["processes"][:2]] == [1, 1]


def test_the_summary_and_junit_name_the_failed_runs(tmp_path):
    outcome = finished_job(tmp_path)
    lines = summary.summary_lines(outcome, str(tmp_path))
    assert "jaxrun: process 2 started again alone once: life 1 (pid 102) killed by SIGKILL; " \
           "its last life (pid 200) exited 0" in lines
    xml = junit.render(outcome)
    assert xml.count("<testcase ") == 3 and 'failures="0"' in xml
    assert f"life 1 of 2 (pid 102) killed by SIGKILL; started again alone; its output is in {tmp_path}" in xml
    assert 'name="process 2" time="8.000"' in xml  # from its first run's start
    assert "out of pid 200" in xml


def test_junit_fails_each_process_whose_last_run_failed(tmp_path):
    outcome = finished_job(tmp_path)
    for rank, code, verdict in ((1, 3, Verdict.ROOT_CAUSE), (2, 4, Verdict.FAILED_ALONE)):
        outcome.records[rank].returncode, outcome.records[rank].verdict = code, verdict
    outcome.reason, outcome.root_cause, outcome.exit_code = StopReason.FAILURE, 1, 3
    xml = junit.render(outcome)
    assert 'failures="2"' in xml and 'message="exit code 4"' in xml
    assert "life 1 of 2 (pid 102) killed by SIGKILL" in xml.split('name="process 2"')[1]
    assert "jaxrun: process 2 failed, the others went on" in summary.summary_lines(outcome, str(tmp_path))
