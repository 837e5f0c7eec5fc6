"""Elastic restarts under Slurm, the pure parts: which nodes sinfo's answer
leaves out, and the srun line of a restart that excludes them.  (The real
cluster's part is in tests/e2e/test_slurm_elastic.py.)"""

from __future__ import annotations

import io
import subprocess

import pytest

from jaxrun.backends.scheduler import slurm as scheduler
from jaxrun.backends.scheduler.options import SlurmOptions
from jaxrun.core.backend import Ask, Placement
from jaxrun.core.config import LaunchError
from jaxrun.core.spec import Host, LaunchOptions, Target


def answering(stdout: str, code: int = 0, stderr: str = ""):
    seen = []

    def run(argv, **kw):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, code, stdout, stderr)

    return run, seen


def test_nodes_that_are_down_drained_failing_or_silent_are_left_out_with_slurms_reason():
    run, seen = answering("n1|allocated|none\n"
                          "n2|down*|Not responding\n"
                          "n3|draining|bad gpu\n"
                          "n4|mixed*|none\n"
                          "n5|idle|none\n")
    problems = scheduler.node_problems(["n1", "n2", "n3", "n4", "n5", "n6"], run)
    assert seen == [["sinfo", "-h", "-N", "-n", "n1,n2,n3,n4,n5,n6", "-o", "%N|%T|%E"]]
    assert problems == {"n2": "Slurm says not responding (Not responding)", "n3": "Slurm says draining (bad gpu)",
                        "n4": "Slurm says not responding", "n6": "Slurm says unknown to sinfo"}


def test_a_node_in_two_partitions_is_judged_by_its_first_line():
    run, _ = answering("n1|idle|none\nn1|idle|none\n")
    assert scheduler.node_problems(["n1"], run) == {}


def test_a_failing_slurm_query_is_one_line():
    run, _ = answering("", 1, "sinfo: error: Unable to contact slurm controller\n")
    with pytest.raises(LaunchError, match=r"^sinfo -h -N exited with status 1: sinfo: error: Unable to contact"):
        scheduler.node_problems(["n1"], run)


def test_the_allocations_nodes_come_from_scontrol():
    run, seen = answering("n1\nn2\nn3\n")
    assert scheduler.expand_nodelist("n[1-3]", run) == ["n1", "n2", "n3"]
    assert seen == [["scontrol", "show", "hostnames", "n[1-3]"]]


def test_a_restart_excludes_the_lost_nodes_and_asks_for_fewer():
    options = SlurmOptions(nodes=3)
    placement = Placement((Host("n1", 2), Host("n3", 2)), 4, {"n2": "Slurm says down"})
    argv = scheduler.srun_command(options, 4, ["agent"], placement)
    assert argv == ["srun", "--kill-on-bad-exit=1", "--ntasks=4", "--export=ALL", "--nodes=2", "--exclude=n2", "agent"]
    assert scheduler.srun_command(options, 6, ["agent"]) == ["srun", "--kill-on-bad-exit=1", "--ntasks=6",
                                                              "--export=ALL", "--nodes=3", "agent"]


def test_placement_is_decided_once_and_shapes_the_restarts_step():
    run, asked = answering("n1|idle|none\nn2|drained|bad disk\nn3|mixed|none\n")
    launch = LaunchOptions(Target("t.py"), 4, "", "run", scheduled=True)
    inside = {"SLURM_JOB_ID": "7"}  # an elastic run chooses among its allocation's nodes
    backend = scheduler.SlurmBackend(SlurmOptions(nodes=3), launch, io.StringIO(), inside, run=run)
    hosts = (Host("n1", 2), Host("n2", 2), Host("n3", 2))
    first = backend.place(Ask(hosts, 4))
    assert (first.hosts, first.num_processes, asked, backend.placement) == (hosts, 4, [], None)
    seen = []

    def choose(good, problems):
        seen.append(([h.name for h in good], dict(problems)))
        return tuple(good), 4

    again = backend.place(Ask(hosts, 4, recheck=True, choose=choose))
    assert [argv[4] for argv in asked] == ["n1,n2,n3"]  # sinfo, once
    assert seen == [(["n1", "n3"], {"n2": "Slurm says drained (bad disk)"})]
    assert backend.placement is again and dict(again.dropped) == {"n2": "Slurm says drained (bad disk)"}
    argv = backend.step_process(4, ["agent"], ()).argv({})
    assert argv == ["srun", "--kill-on-bad-exit=1", "--ntasks=4", "--export=ALL", "--nodes=2", "--exclude=n2", "agent"]
    backend.place(Ask(hosts, 4))  # a plain restart: Slurm alone places the step again
    assert backend.step_process(4, ["agent"], ()).argv({})[4:] == ["--nodes=3", "agent"]
