"""CI output: --junit-xml, GitHub Actions groups and annotations, and the CI examples."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import xml.etree.ElementTree as ET

import pytest
import yaml
from fixtures.jobs import EXAMPLES

from jaxrun.cli import main as cli_main
from jaxrun.core.config import on_github_actions
from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason, Verdict
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
from jaxrun.reporting import github, junit, stacks

FAILS_IN_PROCESS_1 = """\
import os
import time

import jax

jax.devices()  # joining the job waits for every process: each greets before process 1 fails
print("hello from", os.environ["JAXRUN_PROCESS_ID"])
if os.environ["JAXRUN_PROCESS_ID"] == "1":
    raise ValueError("process 1 cannot go on")
time.sleep(60)
"""


def cases(xml_path) -> dict[str, ET.Element]:
    suite = ET.parse(xml_path).getroot().find("testsuite")
    return {case.get("name"): case for case in suite.iter("testcase")}


@pytest.mark.timeout(90)
def test_github_actions_run_with_junit_xml(jaxrun, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(FAILS_IN_PROCESS_1)
    xml_path = tmp_path / "junit.xml"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)}
    code, out, err = jaxrun("-n", 4, "--cpu-devices", 2, "--junit-xml", xml_path, script, env=env, cwd=tmp_path)
    assert code == 1, err

    by_name = cases(xml_path)
    assert sorted(by_name) == ["process 0", "process 1", "process 2", "process 3"]
    failures = {name: case.find("failure") for name, case in by_name.items() if case.find("failure") is not None}
    assert list(failures) == ["process 1"]
    assert failures["process 1"].get("message") == "ValueError: process 1 cannot go on"
    assert 'raise ValueError("process 1 cannot go on")' in failures["process 1"].text
    assert "hello from 1" in by_name["process 1"].find("system-out").text
    for name in ("process 0", "process 2", "process 3"):
        assert "after process 1 failed" in by_name[name].find("skipped").get("message")

    # One stream on Actions: every group and the annotation, in order, on stderr.
    assert out == ""
    groups = re.findall(r"^::group::process (\d)\n(.*?)^::endgroup::$", err, re.M | re.S)
    assert [rank for rank, _ in groups] == ["0", "1", "2", "3"]
    for rank, body in groups:
        assert f"hello from {rank}" in body
    assert "ValueError: process 1 cannot go on" in groups[1][1]
    errors = [line for line in err.splitlines() if line.startswith("::error")]
    assert errors == [
        "::error title=jaxrun%3A process 1 failed first (exit code 1),file=job.py,line=9"
        "::ValueError: process 1 cannot go on"
    ]


@pytest.mark.timeout(90)
def test_the_github_example_command_runs(jaxrun, tmp_path, monkeypatch):
    """The workflow's jaxrun step, verbatim, outside Actions: plain output, a passing report."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    (tmp_path / "examples" / "ci").mkdir(parents=True)
    shutil.copy(EXAMPLES / "ci" / "smoke.py", tmp_path / "examples" / "ci")
    argv = next(cmd for cmd in example_commands("github-actions.yml") if cmd[0] == "jaxrun")
    code, out, err = jaxrun(*argv[1:], cwd=tmp_path)
    assert code == 0, err
    assert "::" not in out + err
    assert "[3] process=3 got result: -0.12398731708526611" in out
    by_name = cases(tmp_path / "jaxrun-junit.xml")
    assert len(by_name) == 4
    assert all(list(case.iter("failure")) == [] for case in by_name.values())
    assert (tmp_path / "jaxrun-report.json").exists()
    assert (tmp_path / "jaxrun-logs" / "process-0.stdout").exists()


# -- examples ------------------------------------------------------------------


def example_commands(name: str) -> list[list[str]]:
    doc = yaml.safe_load((EXAMPLES / "ci" / name).read_text())
    if name.startswith("github"):
        lines = [step["run"] for job in doc["jobs"].values() for step in job["steps"] if "run" in step]
    else:
        lines = [line for job in doc.values() if isinstance(job, dict) for line in job.get("script", [])]
    return [shlex.split(line) for line in lines]


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml"])
def test_ci_examples_use_the_ci_flags(name):
    commands = example_commands(name)
    launches = [cmd for cmd in commands if cmd[0] == "jaxrun"]
    assert launches, f"{name} never runs jaxrun"
    for argv in launches:
        cli_main.make_context("jaxrun", argv[1:])  # every flag exists and parses
        for flag in ("--timeout", "--report", "--junit-xml"):
            assert flag in argv, f"{name}: {flag} missing"
    pytest_runs = [cmd for cmd in commands if cmd[:3] == ["python", "-m", "pytest"]]
    assert pytest_runs, f"{name} never runs the pytest plugin"
    for argv in pytest_runs:
        assert "jaxrun.pytest_plugin" in argv and any(a.startswith("--junitxml") for a in argv)
        for path in (a for a in argv if a.endswith(".py")):
            assert (EXAMPLES.parent / path).exists(), path


def test_gitlab_example_publishes_the_junit_reports():
    job = yaml.safe_load((EXAMPLES / "ci" / "gitlab-ci.yml").read_text())["jaxrun-smoke"]
    assert job["artifacts"]["when"] == "always"
    assert set(job["artifacts"]["reports"]["junit"]) == {"jaxrun-junit.xml", "pytest-junit.xml"}


# -- JUnit and annotations from made-up outcomes ----------------------------------


def outcome(tmp_path, verdicts, reason, root_cause=None, signum=None, stderr=None) -> Outcome:
    records = []
    for rank, verdict in enumerate(verdicts):
        base = tmp_path / f"process-{rank}"
        out, err = f"{base}.stdout", f"{base}.stderr"
        with open(out, "w") as f:
            f.write(f"[Gloo] Rank {rank} is connected to 3 peer ranks. "
                    f"Expected number of connected peer ranks is : 3\nout {rank}\n")
        with open(err, "w") as f:
            f.write((stderr or {}).get(rank, ""))
        spec = ProcessSpec(rank, rank, LOCAL_HOST, "python", (), {})
        code = {Verdict.OK: 0, Verdict.ROOT_CAUSE: 3, Verdict.CONSEQUENCE: 1, Verdict.STOPPED: -9}[verdict]
        records.append(ProcessRecord(spec, out, err, f"{base}.error.json", 100 + rank, 10.0, 12.5, code, verdict))
    return Outcome(records, 0, reason, signum, root_cause)


def test_junit_without_an_error_file_uses_the_exit_and_tail(tmp_path):
    run = outcome(tmp_path, [Verdict.CONSEQUENCE, Verdict.ROOT_CAUSE], StopReason.FAILURE, root_cause=1,
                  stderr={1: "Fatal Python error: Aborted\n"})
    root = ET.fromstring(junit.render(run, suite="s"))
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("2", "1", "1")
    p0, p1 = suite.findall("testcase")
    assert p1.find("failure").get("message") == "exit code 3"
    assert "Fatal Python error" in p1.find("failure").text
    assert p0.find("skipped").get("message") == "exit code 1 after process 1 failed first"
    assert p0.get("time") == "2.500"
    assert p0.find("system-out").text == "out 0\n"  # noise is left out, as on the console


def test_junit_after_a_timeout_fails_every_stuck_process(tmp_path):
    run = outcome(tmp_path, [Verdict.OK, Verdict.STOPPED, Verdict.STOPPED], StopReason.TIMEOUT)
    suite = ET.fromstring(junit.render(run)).find("testsuite")
    assert suite.get("failures") == "2"
    messages = [c.find("failure").get("message") for c in suite.findall("testcase")[1:]]
    assert all(m.startswith("still running when --timeout expired") for m in messages)


def test_junit_after_a_signal_reports_errors(tmp_path):
    run = outcome(tmp_path, [Verdict.STOPPED], StopReason.SIGNAL, signum=2)
    case = ET.fromstring(junit.render(run)).find("testsuite/testcase")
    assert case.find("error").get("message") == "stopped when jaxrun received SIGINT"


def test_junit_survives_bytes_xml_cannot_hold(tmp_path):
    run = outcome(tmp_path, [Verdict.ROOT_CAUSE], StopReason.FAILURE, root_cause=0,
                  stderr={0: "colour \x1b[31mred\x1b[0m, nul \x00\n"})
    text = junit.render(run)
    failure = ET.fromstring(text).find("testsuite/testcase/failure")
    assert "colour \\x1b[31mred" in failure.text and "nul \\x00" in failure.text


def test_annotation_escapes_and_points_at_the_users_file(tmp_path):
    tb = (
        'Traceback (most recent call last):\n'
        f'  File "{tmp_path}/src/train.py", line 12, in <module>\n'
        f'  File "{tmp_path}/.venv/lib/site-packages/jax/x.py", line 5, in f\n'
        "RuntimeError: 50% done, then: boom\n"
    )
    error = {"type": "RuntimeError", "message": "50% done,\nthen: boom", "traceback": tb}
    (tmp_path / "process-0.error.json").write_text(json.dumps(error))
    run = outcome(tmp_path, [Verdict.ROOT_CAUSE], StopReason.FAILURE, root_cause=0)
    assert github.error_annotation(run, str(tmp_path)) == (
        "::error title=jaxrun%3A process 0 failed first (exit code 3),file=src/train.py,line=12"
        "::RuntimeError: 50%25 done,%0Athen: boom"
    )
    # Outside a checkout there is no file to point at.
    assert ",file=" not in github.error_annotation(run, None)


def test_annotation_for_pytest_failures_and_quiet_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # pytest prints paths relative to where it runs
    text = "    assert x == 1\nE   assert 2 == 1\n\ntests/test_m.py:7: AssertionError\n"
    assert stacks.user_location(text, str(tmp_path)) == ("tests/test_m.py", 7)
    ok = outcome(tmp_path, [Verdict.OK], None)
    assert github.error_annotation(ok) is None
    assert on_github_actions({"GITHUB_ACTIONS": "true"}) and not on_github_actions({})
