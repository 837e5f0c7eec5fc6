"""The probe's pure parts: the schedule of pairs, the rule that names a slow
host or link (``launcher.probe.verdict``), the table and JSON, and where a
launch starts after the probe (``launcher.probe.first.placement_after``)."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys

import pytest

from jaxrun.core.config import PROBE_REPORT, PROBE_STRICT, RunConfig
from jaxrun.core.spec import Host, LaunchOptions, Target
from jaxrun.launcher.probe import first, table
from jaxrun.launcher.probe.verdict import judge
from jaxrun.wire.probe import ProbeResult, Sizes, rounds

HOSTS = ["hostA", "hostB", "hostC", "hostD"]


@pytest.mark.parametrize("n", range(1, 10))
def test_every_pair_meets_once_in_rounds_of_disjoint_pairs(n):
    schedule = rounds(n)
    assert len(schedule) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)
    met = [pair for pairs in schedule for pair in pairs]
    assert sorted(met) == list(itertools.combinations(range(n), 2))
    for pairs in schedule:
        ends = [r for pair in pairs for r in pair]
        assert len(ends) == len(set(ends))


def test_sizes_travel_as_the_module_s_arguments():
    sizes = Sizes(matmul=64, reps=3)
    assert Sizes.parse(sizes.args()) == sizes


def result(compute, pair_seconds, pair_latency=None) -> ProbeResult:
    """A probe's figures: ``pair_seconds[(a, b)]`` is the pair's transfer
    time (``pair_latency``, its tiny transfer's), seen alike by both ends."""
    n = len(compute)
    schedule = rounds(n)
    bandwidth = [[0.0] * len(schedule) for _ in range(n)]
    lat = [[0.0] * len(schedule) for _ in range(n)]
    for i, pairs in enumerate(schedule):
        for a, b in pairs:
            seconds = pair_seconds.get((a, b), 0.01)
            bandwidth[a][i] = bandwidth[b][i] = seconds
            lat[a][i] = lat[b][i] = (pair_latency or {}).get((a, b), 1e-4)
    return ProbeResult(list(Sizes().args()), [f"node-{i}" for i in range(n)], [1] * n, list(compute), bandwidth, lat,
                       0.05, "cpu")


def test_a_healthy_spread_names_nobody():
    # The widest healthy spread the bench saw: compute 2.2x, a best link 2.3x.
    verdict = judge(result([0.10, 0.22, 0.10, 0.11], {(0, 1): 0.023, (2, 3): 0.01}), HOSTS)
    assert verdict.named() == {} and verdict.exit_code == 0
    assert table.table_lines(verdict)[-1] == "all fine"


def test_the_slow_link_s_host_and_the_slow_host_are_named_and_no_other():
    # hostC: every pair through it slow; hostD: its compute 4x, one of its transfers slow too (not its link's fault).
    pairs = {(0, 2): 0.7, (1, 2): 0.7, (2, 3): 0.7, (0, 3): 0.07, (1, 3): 0.02, (0, 1): 0.01}
    verdict = judge(result([0.10, 0.11, 0.10, 0.40], pairs), HOSTS)
    named = verdict.named()
    assert list(named) == ["hostC", "hostD"]
    assert named["hostC"].startswith("every link slow: 12 MB/s at best") and "compute" not in named["hostC"]
    assert named["hostD"] == "compute 4.0x the others' median (400 ms against 100 ms)"  # its best link: 2x
    assert verdict.slow_links == ()
    data = table.as_dict(verdict)
    assert data["exit"] == 1 and [row["verdict"] for row in data["hosts"]] == ["ok", "ok", "slow", "slow"]
    assert data["hosts"][0]["links"]["hostC"]["mb_s"] == pytest.approx(8 * 2**20 / 0.7 / 1e6, abs=0.1)


def test_one_slow_link_between_good_hosts_is_named_as_a_link():
    pairs = {(0, 1): 0.01, (0, 2): 0.01, (0, 3): 0.01, (1, 2): 0.2, (1, 3): 0.01, (2, 3): 0.01}
    verdict = judge(result([0.1] * 4, pairs), HOSTS)
    assert [(a, b) for a, b, _ in verdict.slow_links] == [(1, 2)]
    assert verdict.named() == {"hostC": verdict.named()["hostC"]} and verdict.named()["hostC"].startswith(
        "link to hostB: ")
    assert "slow link to hostC" in table.table_lines(verdict)[2]


def test_latency_is_named_only_far_above_the_others_and_a_millisecond_over():
    through_c = {(0, 2): 0.004, (1, 2): 0.004, (2, 3): 0.004}
    named = judge(result([0.1] * 4, {}, through_c), HOSTS).named()
    assert list(named) == ["hostC"] and named["hostC"] == "latency 4.0 ms at best, the others' 0.10 ms"
    # 9x, and 40x but 0.4 ms over: a loaded host's scheduling moves a tiny transfer that much
    assert judge(result([0.1] * 4, {}, dict.fromkeys(through_c, 0.0009)), HOSTS).named() == {}
    fast = dict.fromkeys(itertools.combinations(range(4), 2), 1e-5)
    assert judge(result([0.1] * 4, {}, {**fast, **dict.fromkeys(through_c, 0.0004)}), HOSTS).named() == {}


def test_two_processes_compare_compute_but_not_their_one_link():
    verdict = judge(result([0.1, 0.1], {(0, 1): 5.0}), HOSTS[:2])
    assert verdict.named() == {}


def config_with(hosts: list[str], probe=PROBE_REPORT, min_hosts=None, n=None) -> RunConfig:
    listed = tuple(Host(name) for name in hosts)
    options = LaunchOptions(Target("train.py"), n or len(hosts), "", "run", hosts=listed)
    return RunConfig(options, "/nonexistent", probe=probe, min_hosts=min_hosts)


def slowed_verdict():
    pairs = {(0, 2): 0.7, (1, 2): 0.7, (2, 3): 0.7, (0, 3): 0.01, (1, 3): 0.01, (0, 1): 0.01}
    return judge(result([0.1, 0.1, 0.1, 0.4], pairs), HOSTS)


def test_with_spares_the_named_hosts_are_left_out_and_the_rest_placed_as_a_restart_would():
    config = config_with(HOSTS, min_hosts=2)
    ask, left_out, line = first.placement_after(config, slowed_verdict(), config.options.hosts)
    assert [h.name for h in ask.hosts] == ["hostA", "hostB"] and ask.num_processes == 2
    assert list(left_out) == ["hostC", "hostD"] and left_out["hostD"].startswith("probe: compute")
    assert line.startswith("jaxrun: probe: leaving out hostC, hostD (hostC: every link slow")
    assert line.endswith("starting 2 processes on hostA, hostB")


def test_spares_beyond_n_take_the_named_hosts_places():
    config = config_with(HOSTS, min_hosts=2, n=2)  # -n 2: hostC and hostD are spares... but they are the slow ones
    ask, _, _ = first.placement_after(config, slowed_verdict(), config.options.hosts[:2])
    assert [h.name for h in ask.hosts] == ["hostA", "hostB"] and ask.num_processes == 2
    config = dataclasses.replace(config, options=dataclasses.replace(
        config.options, hosts=tuple(Host(n) for n in ["hostC", "hostA", "hostD", "hostB"])))
    verdict = judge(result([0.1, 0.1, 0.4, 0.1], {(0, 1): 0.7, (0, 2): 0.7, (0, 3): 0.7}),
                    ["hostC", "hostA", "hostD", "hostB"])
    ask, left_out, _ = first.placement_after(config, verdict, config.options.hosts[:2])
    assert [h.name for h in ask.hosts] == ["hostA", "hostB"] and list(left_out) == ["hostC", "hostD"]


def test_without_spares_the_launch_goes_on_or_strict_stops():
    config = config_with(HOSTS)
    ask, left_out, line = first.placement_after(config, slowed_verdict(), config.options.hosts)
    assert len(ask.hosts) == 4 and left_out == {} and line.startswith("jaxrun: probe: going on with every host")
    with pytest.raises(first.ProbeStop, match=r"--probe=strict: not starting \(hostC: every link slow"):
        first.placement_after(config_with(HOSTS, probe=PROBE_STRICT), slowed_verdict(), config.options.hosts)


def test_a_probe_without_a_verdict_stops_only_a_strict_launch():
    config = config_with(HOSTS)
    assert first.placement_after(config, None, config.options.hosts)[1:] == ({}, "")
    with pytest.raises(first.ProbeStop, match="the probe gave no verdict"):
        first.placement_after(config_with(HOSTS, probe=PROBE_STRICT), None, config.options.hosts)


def test_too_few_good_hosts_left_stops_before_the_job():
    config = config_with(HOSTS, min_hosts=3)
    with pytest.raises(first.ProbeStop, match="fewer than --min-hosts 3"):
        first.placement_after(config, slowed_verdict(), config.options.hosts)


def test_the_dry_run_plan_names_each_round_s_pairs():
    lines = table.plan_lines(HOSTS, Sizes())
    assert lines[0] == "# probe: 4 processes, one job"
    assert [line for line in lines if "round" in line][1:] == [
        "#   round 1: hostA-hostD, hostB-hostC", "#   round 2: hostA-hostC, hostB-hostD",
        "#   round 3: hostA-hostB, hostC-hostD"]


def test_the_dry_run_shows_the_probe_s_own_step_then_the_job_s(tmp_path):
    """Under a scheduler the probe's step is a step of its own: the plan shows
    the probe's program in it, not the job's script (the bug it had)."""
    script = tmp_path / "job.py"
    script.write_text("print('the job')\n")
    done = subprocess.run([sys.executable, "-m", "jaxrun", "--probe", "--launcher", "mpirun", "-n", "2", "--dry-run",
                           str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("# mpirun: ")]
    assert len(steps) == 2, done.stdout
    assert steps[0].endswith("-m jaxrun.child.controllers.probe " + " ".join(Sizes().args())), steps[0]
    assert steps[1].endswith(f"-- {script}"), steps[1]
    assert done.stdout.index("# probe: 2 processes") < done.stdout.index("# then the job:")
