"""The Ray backend's pure parts: placement to plan, environments, options; and the
backend's own command-line options, declared in its registry entry.  (Real
jobs on a real Ray cluster: tests/e2e/test_ray.py.)"""

from __future__ import annotations

import importlib.util

import pytest

from jaxrun import cli, contract
from jaxrun.backends import BACKENDS
from jaxrun.backends.ray import actor, backend as ray, driver, words
from jaxrun.core.config import LaunchError
from jaxrun.core.spec import Host, LaunchOptions, Target
from jaxrun.launcher.setup import plan as planning
from jaxrun.launcher.setup.configure import config_from_args

A, B = "a" * 56, "b" * 56  # two Ray node ids


def test_spread_bundles_become_one_host_per_node_holding_consecutive_ranks():
    hosts, bundle_of = ray.hosts_of([[A, "10.0.0.1"], [B, "10.0.0.2"], [A, "10.0.0.1"], [B, "10.0.0.2"]])
    assert hosts == (Host("aaaaaaaa@10.0.0.1", slots=2), Host("bbbbbbbb@10.0.0.2", slots=2))
    assert bundle_of == [0, 2, 1, 3]  # ranks 0 and 1 in node A's bundles, 2 and 3 in node B's


def test_the_plan_numbers_local_ranks_per_node():
    hosts, _ = ray.hosts_of([[A, "127.0.0.1"], [B, "127.0.0.1"], [B, "127.0.0.1"]])  # two nodes, one address
    opts = LaunchOptions(Target("t.py"), 3, "", "run", hosts=hosts, scheduled=True, devices_per_process=2)
    specs = planning.plan(opts)
    assert [(s.host.name, s.local_rank, s.env[contract.LOCAL_PROCESS_COUNT]) for s in specs] == [
        ("aaaaaaaa@127.0.0.1", 0, "1"), ("bbbbbbbb@127.0.0.1", 0, "2"), ("bbbbbbbb@127.0.0.1", 1, "2")]
    # Ray gives each actor its GPUs: the scheduler's device split does not travel.
    sent = ray.sent_env({}, specs[2].env)
    assert contract.TASK_DEVICES_PER_PROCESS in specs[2].env and contract.TASK_DEVICES_PER_PROCESS not in sent
    assert contract.JAX_LOCAL_DEVICE_IDS not in sent


def test_a_bundle_is_one_cpu_and_the_gpus_of_one_process():
    assert ray.bundles(2, None) == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert ray.bundles(1, 4) == [{"CPU": 1.0, "GPU": 4.0}]


def test_what_travels_to_a_node_is_what_mpirun_forwards():
    environ = {"PATH": "/bin", "HOME": "/root", "JAXRUN_TEST_TOKEN": "t", "XLA_FLAGS": "--x", "SECRET": "s"}
    assert ray.sent_env(environ, {"JAXRUN_PROCESS_ID": "3"}) == {
        "PATH": "/bin", "JAXRUN_TEST_TOKEN": "t", "XLA_FLAGS": "--x", "JAXRUN_PROCESS_ID": "3"}


def test_the_agent_gets_its_nodes_environment_without_rays_worker_variables():
    worker = {"HOME": "/home/u", "CUDA_VISIBLE_DEVICES": "2,3", "RAY_JOB_ID": "01000000", "RAY_RAYLET_PID": "7",
              "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace", "PYTHONDONTWRITEBYTECODE": "1", "RAY_ADDRESS": "h:1"}
    assert actor.node_env(worker, {"JAXRUN_PROCESS_ID": "0"}) == {
        "HOME": "/home/u", "CUDA_VISIBLE_DEVICES": "2,3", "RAY_ADDRESS": "h:1", "JAXRUN_PROCESS_ID": "0"}
    assert actor.node_env({"PYTHONBREAKPOINT": "ipdb.set_trace"}, {}) == {"PYTHONBREAKPOINT": "ipdb.set_trace"}


LAUNCH = LaunchOptions(Target("t.py"), 2, "", "run")
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")


@needs_ray
def test_the_address_is_the_option_then_ray_address_then_auto(tmp_path):
    given = {"ray_address": "10.0.0.1:6379", "placement": "pack", "chdir": str(tmp_path)}
    assert ray.options(given, LAUNCH, {}) == ray.RayOptions("10.0.0.1:6379", "pack", str(tmp_path))
    assert ray.options({}, LAUNCH, {"RAY_ADDRESS": "h:6379"}).address == "h:6379"
    assert ray.options({}, LAUNCH, {}) == ray.RayOptions("auto", "spread", ray.os.getcwd())


@needs_ray
@pytest.mark.parametrize("given, says", [
    ({"ray_address": "ray://head:10001"}, "not a Ray Client address"),
    ({"nodes": 2}, "--nodes, --ntasks-per-node and --scheduler-arg are for slurm and mpirun"),
    ({"scheduler_args": ("-x",)}, "are for slurm and mpirun"),
])
def test_options_that_cannot_work_are_refused(given, says):
    with pytest.raises(LaunchError, match=says):
        ray.options(given, LAUNCH, {})


def test_an_unreachable_address_is_named_before_ray_init():
    assert driver.unreachable("auto") is None
    assert driver.unreachable("127.0.0.1:1").startswith("cannot reach the Ray cluster at 127.0.0.1:1: ")
    assert "cannot reach" in driver.unreachable("no-port")


# -- a backend's own options ----------------------------------------------------------------
def test_the_registry_entry_declares_the_ray_options():
    entry = BACKENDS["ray"]
    assert [f.opts for f in entry.flags] == [("--ray-address",), ("--placement",), ("--chdir",)]
    assert set(entry.flags[1].choices) == set(ray.PLACEMENTS)


def test_another_launcher_refuses_the_ray_option_given_and_no_other(tmp_path):
    """``--ray-address`` left out (None) is not given; ``--placement pack`` is."""
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    params = cli.main.make_context("jaxrun", ["--launcher", "local", "--placement", "pack", str(script)]).params
    assert params["ray_address"] is None
    with pytest.raises(LaunchError) as refused:
        config_from_args({**params, "log_dir": str(tmp_path / "logs")}, BACKENDS)
    assert str(refused.value) == "--placement works with --launcher ray only"


def test_the_command_line_takes_them_in_a_section_of_their_own(tmp_path):
    params = cli.main.make_context("jaxrun", ["--launcher", "ray", "--placement", "strict-spread", "s.py"]).params
    assert (params["placement"], params["ray_address"]) == ("strict-spread", None)
    sections = cli.help_sections()
    assert list(sections)[-2:] == ["With --launcher ray", "Other"]
    assert sections["With --launcher ray"] == ("ray_address", "placement")


def test_they_work_with_their_launcher_only(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(LaunchError, match="^--ray-address works with --launcher ray only$"):
        cli.main.main(["--ray-address", "h:1", "--dry-run", str(script)], standalone_mode=False)


def test_the_driver_and_the_actor_are_modules_of_their_own():
    """Ray pickles the actor's class by name: it lives in an importable module,
    not in whatever ran as __main__; both ends speak the words of one module."""
    assert actor.ControllerHost.__module__ == contract.RAY_ACTOR_MODULE == actor.__name__
    assert driver.__name__ == contract.RAY_DRIVER_MODULE
    assert ray.Placed is words.Placed and driver.Placed is words.Placed and ray.PLACEMENTS is words.PLACEMENTS
    placed = words.Placed([[A, "10.0.0.1"]], "10.0.0.1")
    assert ray.encoding.decode(placed.line()) == placed
    assert driver.main([]).startswith(f"usage: python -m {contract.RAY_DRIVER_MODULE} ")
    assert actor.main(["x"]).startswith(f"usage: python -m {contract.RAY_ACTOR_MODULE} ")
