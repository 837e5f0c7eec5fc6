"""Issue 74: a failure's console without JAX's fatal-error pages, and a
summary whose "was at" is where each process ended.

crash_in_collective.py: process 0 exits 3 while the others wait in
``sync_global_devices``; each other process aborts as the coordination
service goes away, and prints JAX's fatal-error page (the service's fatal
lines, the check's "@ 0x..." frames), 61 console lines at 74d7ebe.  The
console keeps the job to a few lines and counts the pages in the line that
names the logs, which keep every line of them; -v shows them.  Every
backend's output comes through the one console printer: the local modes, SSH
and mpirun are tried here.

raise_after_dump.py: every process raises the same error, process 0 first;
jaxrun's stop asks the others for a stack dump while they sleep, then they
raise: each was at the line it raised at, not at the dump's older one.
"""

from __future__ import annotations

import re
import shutil

import pytest
from fixtures.jobs import DATA, ROOT, TOKEN

pytestmark = pytest.mark.timeout(120)

CRASH = DATA / "crash_in_collective.py"
LATE = DATA / "raise_after_dump.py"
# The summary's last line names the logs and counts the pages the console left to them.
PAGES = re.compile(r"^jaxrun: logs in (\S+) \(processes? ([\d,-]+): JAX's fatal-error pages?"
                   r"( and (?:a )?lost-peer tracebacks?)?, (\d+) lines?, left off the console; -v shows them\)$",
                   re.M)
# The shapes of a page's lines, as a log holds them.
PAGE_LINE = re.compile(r"^(?:[EFW]\d{4} .*(?:coordination_service|preemption_sync_manager|client\.h)"
                       r"|\*\*\* Check failure|\s+@\s+0x|Additional GRPC error information"
                       r"|:UNKNOWN:Error received from peer)", re.M)
FATAL = "Terminating process because the JAX distributed service detected fatal errors"


def line_of(path, text: str) -> int:
    (number,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return number


def check_crash(code: int, stdout: str, stderr: str, logs) -> None:
    """Exit 3, process 0 named; at most 8 console lines, the engine's own
    (``[mpirun] ...``) counted too, none of them a page's; the pages counted
    in one line, and whole in the logs."""
    assert code == 3, stderr
    assert re.search(r"^jaxrun: process 0 (on hostA )?failed first: exit code 3", stderr, re.M), stderr
    console = (stdout + stderr).splitlines()
    assert len(console) <= 8, "\n".join(console)
    assert not any(re.search(r"@\s+0x[0-9a-f]+", line) for line in console), "\n".join(console)
    assert not any(FATAL in line or "Check failure stack trace" in line for line in console), "\n".join(console)
    counted = PAGES.search(stderr)
    assert counted and counted[1] == str(logs) and int(counted[4]) > 3, stderr
    # Every line the console left out is in the logs (a page's end may be cut
    # where jaxrun's stop killed its process first).
    kept = "".join((logs / f"process-{rank}.stderr").read_text() for rank in (1, 2, 3))
    assert "coordination_service_agent.cc" in kept or FATAL in kept, kept
    # (A lost peer's traceback, counted with them where one came, has lines of other shapes.)
    assert len(PAGE_LINE.findall(kept)) >= (1 if counted[3] else int(counted[4])), kept


@pytest.mark.both_modes
def test_a_crash_while_the_others_wait_in_a_collective_takes_a_few_lines(launch, launch_mode, tmp_path):
    job = launch("-n", 4, "--log-dir", tmp_path / "logs", CRASH)
    check_crash(job.wait(timeout=90), job.stdout, job.stderr, tmp_path / "logs")
    if launch_mode != "preload":
        return  # -v changes only what the console shows: once is enough
    job = launch("-v", "-n", 4, "--log-dir", tmp_path / "verbose", CRASH)
    assert job.wait(timeout=90) == 3, job.stderr
    # Every page's fatal line, with its process's prefix.  (Not its "@ 0x" frames: under load
    # jaxrun's stop may kill a process between the page's head and its frames; in one -n 4
    # suite run every page ended at faulthandler's dump.)
    assert re.search(rf"^\[[123]\] F\d{{4}} .*client\.h:\d+\] {FATAL}", job.stderr, re.M), job.stderr
    assert not PAGES.search(job.stderr), job.stderr  # nothing was left out, so nothing is counted


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI is not installed (apt-get install openmpi-bin)")
def test_the_pages_stay_off_the_console_under_mpirun(start_job, tmp_path, monkeypatch):
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")  # 4 processes on 2 cores
    job = start_job("--launcher", "mpirun", "-n", 4, "--log-dir", tmp_path / "logs", CRASH)
    check_crash(job.wait(timeout=90), job.stdout, job.stderr, tmp_path / "logs")
    # mpirun's own box that a process exited non-zero stays in its log: the summary says it better.
    assert "non-zero" in (tmp_path / "logs" / "engine.log").read_text()


def test_the_pages_stay_off_the_console_over_ssh(sshd_hosts, start_job, tmp_path):
    job = start_job("-H", "hostA:2,hostB:2", "--ssh-config", sshd_hosts.config, "-x", f"PYTHONPATH={ROOT}",
                    "-x", TOKEN, "--log-dir", tmp_path / "logs", CRASH)
    check_crash(job.wait(timeout=90), job.stdout, job.stderr, tmp_path / "logs")


def test_was_at_is_where_each_process_ended_not_an_older_dump(start_job, tmp_path):
    job = start_job("-n", 4, "--log-dir", tmp_path / "logs", LATE, tmp_path / "go")
    assert job.wait(timeout=60) == 1, job.stderr
    assert "jaxrun: process 0 failed first: exit code 1" in job.stderr, job.stderr
    ends, older = line_of(LATE, "# ENDS"), line_of(LATE, "# OLDER")
    raised = [rank for rank in (1, 2, 3) if "Traceback" in (tmp_path / "logs" / f"process-{rank}.stderr").read_text()]
    assert raised, job.stderr  # they raise 0.15 s after process 0, and jaxrun kills them 0.5 s after its end
    assert f"{LATE}:{older}" not in job.stderr, job.stderr
    at = re.search(rf"^jaxrun:   process(?:es)? ([\d, ]+) (?:was|were) at {LATE}:{ends} in <module>: ",
                   job.stderr, re.M)
    assert at and all(str(rank) in at[1].split(", ") for rank in raised), job.stderr
    # They raised the root cause's very error themselves: not its consequences.
    recorded = [rank for rank in raised if (tmp_path / "logs" / f"process-{rank}.error.json").exists()]
    same = re.search(r"^jaxrun: process(?:es)? ([\d, ]+) raised the same ValueError (?:themselves|itself), after "
                     r"the root cause$", job.stderr, re.M)
    assert not recorded or (same and all(str(rank) in same[1].split(", ") for rank in recorded)), job.stderr
