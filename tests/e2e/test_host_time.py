"""The goodput is the devices' time (issue 76): a real one-process JAX job
on CPU devices (tests/data/host_stages.py) whose host does something of its
own before each step, and jaxrun's account held against the script's own
clock.

- nothing but the steps: ``work`` is the steps' time, the host's parts none;
- 23 ms of numpy before each step (an input pipeline): ``work`` is still the
  steps' time, the numpy is ``input``, and one line names the job
  input-bound at the line where the host spends it (``next_batch``);
- 23 ms of ``time.sleep``: the sleep is ``idle``, never ``work``;
- one long program (a host callback that sleeps 6 s inside it, at
  ``--stall-timeout 2``): the watchdog lets it run, its time is ``work``,
  never ``stall``, and the warning is a whole sentence.

Margins: 20% of a part, or 0.5 s.  The account looks at the main thread
every 20 ms and gives the whole tick to where it stands, a sample of 300
looks a loop or more (sd under 3% of the loop's time); the goodput's ``work``
also holds what the script does between its steps (the first array, the
JSON it writes), and a machine shared with other jobs schedules the
process late now and then.  Before this issue the numpy loop read ``work``
10.1 s for 5.4 s of steps, the sleep 6.3 s for 2.5 s, and the long program
``stall`` 5.8 s."""

from __future__ import annotations

import json
import re

import pytest
from fixtures.jobs import DATA

JOB = DATA / "host_stages.py"
STEPS = 250  # at 23 ms a stage, 6 s of steps at least: the host's line wants 5 s (goodput.HOST_LINE_AFTER)
pytestmark = pytest.mark.timeout(400)


def near(got: float, want: float) -> bool:
    return abs(got - want) <= max(0.5, 0.2 * want)


def lines_of(function: str) -> range:
    """The lines of ``function`` in the job's source: where the host's time is named."""
    source = JOB.read_text().splitlines()
    first = next(i for i, line in enumerate(source, 1) if line.startswith(f"def {function}("))
    last = next((i for i, line in enumerate(source[first:], first + 1) if line and not line[0].isspace()),
                len(source) + 1)
    return range(first, last)


def run_loop(jaxrun, tmp_path, stage: str, *options) -> tuple[dict, dict, str]:
    report, own = tmp_path / f"{stage}.json", tmp_path / f"{stage}-own.json"
    code, _, err = jaxrun("-n", 1, "--cpu-devices", 1, "--report", report, *options, JOB, stage, STEPS, own,
                          timeout=150)
    assert code == 0, err
    return json.loads(report.read_text())["goodput"], json.loads(own.read_text()), err


def host_line(err: str) -> list[str]:
    return [line for line in err.splitlines() if "waited for the host" in line]


def test_the_devices_time_is_work_and_the_hosts_own_is_input_or_idle_named_at_its_line(jaxrun, tmp_path):
    found = {stage: run_loop(jaxrun, tmp_path, stage) for stage in ("none", "numpy", "sleep")}
    for stage, (goodput, own, _) in found.items():
        parts = goodput["parts"]
        assert near(parts["work"], own["steps"]), (stage, parts, own)  # the steps, by the script's clock
        assert parts["stall"] == 0.0 and parts["waiting"] == 0.0, (stage, parts)

    goodput, own, err = found["none"]
    assert goodput["parts"]["input"] + goodput["parts"]["idle"] <= 0.5, goodput
    assert host_line(err) == [], err

    goodput, own, err = found["numpy"]
    assert near(goodput["parts"]["input"], own["stage"]), (goodput, own)
    assert goodput["parts"]["idle"] <= 0.2 * own["stage"], (goodput, own)
    said = host_line(err)
    assert len(said) == 1, err
    m = re.search(r"waited for the host (\d+)% of the steps' time, mostly at host_stages\.py:(\d+) in next_batch "
                  r"\(input-bound", said[0])
    assert m and int(m[2]) in lines_of("next_batch"), said
    share = own["stage"] / (own["stage"] + own["steps"])
    assert abs(int(m[1]) / 100 - share) <= 0.1, (said, own)
    assert goodput["input_at"].startswith("host_stages.py:") and goodput["input_at"].endswith("in next_batch")

    goodput, own, err = found["sleep"]
    assert near(goodput["parts"]["idle"], own["stage"]), (goodput, own)
    assert goodput["parts"]["input"] <= 0.2 * own["stage"], (goodput, own)
    said = host_line(err)
    assert len(said) == 1 and re.search(r"mostly at host_stages\.py:(\d+) in rest \(idle", said[0]), err
    assert int(re.search(r":(\d+) in rest", said[0])[1]) in lines_of("rest"), said


def test_one_long_program_is_work_never_a_stall_and_its_warning_is_a_sentence(jaxrun, tmp_path):
    goodput, own, err = run_loop(jaxrun, tmp_path, "long", "--stall-timeout", 2)
    parts = goodput["parts"]
    assert own["steps"] >= 6.0, own  # the program held the host callback's 6 s
    assert parts["stall"] == 0.0, (parts, err)
    assert near(parts["work"], own["steps"]), (parts, own)
    warned = [line for line in err.splitlines() if "no process has made progress for 2 s" in line]
    assert warned, err  # it outlasted the timeout, and the watchdog said so ...
    assert all(line.endswith("so the job runs on.") for line in warned), warned  # ... in a whole sentence
    assert "lost to stall" not in err, err  # no summary line says a stall (before: "lost to stall 5.8 s")


def test_with_two_processes_a_steps_clock_holds_work_and_waiting_and_the_input_is_named(jaxrun, tmp_path):
    """The same rule with several processes: each step ends in an all-reduce,
    so a step's own clock holds its programs and its wait for the other
    (``work`` plus ``waiting``); the numpy before it is ``input``, the mean
    over the processes, as each measured its own."""
    report, own = tmp_path / "report.json", tmp_path / "own.json"
    code, _, err = jaxrun("-n", 2, "--cpu-devices", 1, "--report", report, JOB, "numpy", STEPS, own, timeout=200)
    assert code == 0, err
    goodput = json.loads(report.read_text())["goodput"]
    mine = [json.loads((tmp_path / f"own.json.{rank}").read_text()) for rank in (0, 1)]
    steps, stage = (sum(m[key] for m in mine) / 2 for key in ("steps", "stage"))
    parts = goodput["parts"]
    assert near(parts["work"] + parts["waiting"], steps), (parts, mine)
    assert near(parts["input"], stage) and parts["idle"] <= 0.2 * stage, (parts, mine)
    said = host_line(err)
    assert len(said) == 1 and re.search(r"mostly at host_stages\.py:\d+ in next_batch \(input-bound", said[0]), err
