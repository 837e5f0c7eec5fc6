"""Unit tests of the pure planning step: options in, per-process specs out."""

import sys

import pytest

from jaxrun import contract
from jaxrun.contract import substitute
from jaxrun.core.spec import Host, LaunchOptions, PlanError, Target, local_device_ids
from jaxrun.launcher.setup.plan import assign_hosts, plan


def options(**kw):
    base = dict(
        target=Target("train.py", ("--lr", "3e-4")),
        num_processes=4,
        coordinator="127.0.0.1:1234",
        bind_address="127.0.0.1:1234",
        run_id="run-1",
    )
    base.update(kw)
    return LaunchOptions(**base)


def test_one_spec_per_process_with_contract_env():
    specs = plan(options(cpu_devices=2))
    assert [s.rank for s in specs] == [0, 1, 2, 3]
    for s in specs:
        env = s.env
        assert env[contract.PROCESS_ID] == str(s.rank)
        assert env[contract.NUM_PROCESSES] == "4"
        assert env[contract.LOCAL_PROCESS_ID] == str(s.rank)
        assert env[contract.LOCAL_PROCESS_COUNT] == "4"
        assert env[contract.COORDINATOR_ADDRESS] == "127.0.0.1:1234"
        assert env[contract.JAX_COORDINATOR_ADDRESS] == "127.0.0.1:1234"
        assert env[contract.RUN_ID] == "run-1"
        assert env[contract.RESTART_COUNT] == "0"
        assert env["JAX_PLATFORMS"] == "cpu"
        assert env["JAX_NUM_CPU_DEVICES"] == "2"
        assert env["PYTHONUNBUFFERED"] == "1"


def test_only_process_zero_binds_the_coordinator():
    specs = plan(options())
    assert specs[0].env[contract.JAX_COORDINATOR_BIND_ADDRESS] == "127.0.0.1:1234"
    assert all(contract.JAX_COORDINATOR_BIND_ADDRESS not in s.env for s in specs[1:])


def test_no_cpu_flag_means_no_platform_override():
    env = plan(options())[0].env
    assert "JAX_PLATFORMS" not in env and "JAX_NUM_CPU_DEVICES" not in env


def test_script_argv_runs_the_shim_then_the_script():
    spec = plan(options(python="/usr/bin/python3"))[0]
    assert spec.argv == ("/usr/bin/python3", "-m", "jaxrun.shim", "--", "train.py", "--lr", "3e-4")


def test_module_argv():
    spec = plan(options(target=Target("pkg.mod", ("-x", "y"), is_module=True)))[0]
    assert spec.argv[1:] == ("-m", "jaxrun.shim", "-m", "pkg.mod", "-x", "y")


def test_default_python_is_this_interpreter():
    assert plan(options())[0].argv[0] == sys.executable


def test_placeholders_are_substituted_per_process():
    target = Target("toy.py", ("{process_id}", "{num_processes}", "--at={coordinator}", "{local_process_id}"))
    specs = plan(options(target=target))
    assert specs[2].argv[-4:] == ("2", "4", "--at=127.0.0.1:1234", "2")


def test_other_braces_are_left_alone():
    assert substitute("{x} {process_id} {{}}", {"process_id": 1}) == "{x} 1 {{}}"


def test_arguments_pass_through_untouched():
    weird = ("--lr", "3e-4", "-x", "a b", "$HOME", "'q'", ";", "")
    spec = plan(options(target=Target("s.py", weird)))[0]
    assert spec.argv[-len(weird):] == weird


def test_extra_env_is_included_but_cannot_override_the_contract():
    specs = plan(options(extra_env={"FOO": "bar", contract.PROCESS_ID: "99"}))
    assert specs[1].env["FOO"] == "bar"
    assert specs[1].env[contract.PROCESS_ID] == "1"


def test_restart_count_and_mesh_and_verbose():
    env = plan(options(restart_count=2, mesh="i=4,j=2", mesh_axis_types="explicit", verbose=True))[0].env
    assert env[contract.RESTART_COUNT] == "2"
    assert env[contract.MESH] == "i=4,j=2"
    assert env[contract.MESH_AXIS_TYPES] == "explicit"
    assert env[contract.VERBOSE] == "1"


@pytest.mark.parametrize("n", [0, -1])
def test_zero_or_negative_processes_rejected(n):
    with pytest.raises(PlanError, match="at least 1"):
        plan(options(num_processes=n))


def test_hosts_fill_slots_in_order_with_local_ranks():
    hosts = (Host("a", slots=2), Host("b", slots=3))
    specs = plan(options(num_processes=4, hosts=hosts))
    assert [(s.host.name, s.local_rank) for s in specs] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert [s.env[contract.LOCAL_PROCESS_COUNT] for s in specs] == ["2", "2", "2", "2"]


def test_local_count_reflects_partial_last_host():
    hosts = (Host("a", slots=2), Host("b", slots=3))
    specs = plan(options(num_processes=3, hosts=hosts))
    assert [s.env[contract.LOCAL_PROCESS_COUNT] for s in specs] == ["2", "2", "1"]


def test_more_processes_than_slots_names_both_numbers():
    with pytest.raises(PlanError, match=r"5 processes requested but the hosts have only 4 slots"):
        assign_hosts((Host("a", slots=2), Host("b", slots=2)), 5)


def test_specs_are_deterministic():
    assert plan(options()) == plan(options())


# -- accelerator assignment (--devices-per-process) ---------------------------


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("procs", [1, 2, 4, 8])
def test_devices_split_evenly_without_k(gpus, procs):
    if procs == 1:
        assert local_device_ids(0, 1, None, gpus) is None  # one process owns them all
        return
    if gpus % procs:
        with pytest.raises(PlanError, match=f"{gpus} devices on localhost cannot be split evenly among {procs}"):
            local_device_ids(0, procs, None, gpus)
        return
    k = gpus // procs
    owned = [local_device_ids(r, procs, None, gpus) for r in range(procs)]
    assert owned == [list(range(r * k, r * k + k)) for r in range(procs)]
    assert sorted(i for ids in owned for i in ids) == list(range(gpus))


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("procs", [1, 2, 4, 8])
@pytest.mark.parametrize("k", [1, 2])
def test_devices_with_explicit_k(gpus, procs, k):
    if procs * k > gpus:
        need = f"{procs} processes x {k} devices need {procs * k} devices, but h has {gpus}"
        with pytest.raises(PlanError, match=need):
            local_device_ids(0, procs, k, gpus, "h")
        return
    assert [local_device_ids(r, procs, k, gpus) for r in range(procs)] == [
        list(range(r * k, r * k + k)) for r in range(procs)
    ]


def test_unknown_device_count_leaves_jax_to_decide_unless_k_given():
    assert local_device_ids(1, 2, None, None) is None
    assert local_device_ids(1, 2, 3, None) == [3, 4, 5]


def test_plan_puts_device_ids_in_the_environment():
    hosts = (Host("a", slots=2), Host("b", slots=2))
    specs = plan(options(hosts=hosts, devices_per_process=2, devices_per_host=4))
    assert [s.env[contract.JAX_LOCAL_DEVICE_IDS] for s in specs] == ["0,1", "2,3", "0,1", "2,3"]
    specs = plan(options(num_processes=2, devices_per_host=8))
    assert [s.env[contract.JAX_LOCAL_DEVICE_IDS] for s in specs] == ["0,1,2,3", "4,5,6,7"]
    assert contract.JAX_LOCAL_DEVICE_IDS not in plan(options(num_processes=1, devices_per_host=8))[0].env


def test_under_a_scheduler_the_plan_claims_no_device_ids():
    """srun/mpirun decide which tasks share a node when the step starts: the
    plan passes K on instead of ids computed from its own placement guess."""
    specs = plan(options(num_processes=4, devices_per_process=2, scheduled=True))
    for s in specs:
        assert contract.JAX_LOCAL_DEVICE_IDS not in s.env
        assert s.env[contract.TASK_DEVICES_PER_PROCESS] == "2"
    for s in plan(options(num_processes=4, devices_per_host=8, scheduled=True)):
        assert contract.JAX_LOCAL_DEVICE_IDS not in s.env and contract.TASK_DEVICES_PER_PROCESS not in s.env
    with pytest.raises(PlanError, match="at least 1"):
        plan(options(devices_per_process=0, scheduled=True))


def test_cpu_devices_and_devices_per_process_are_exclusive():
    with pytest.raises(PlanError, match="cannot be used together"):
        plan(options(cpu_devices=2, devices_per_process=1))


def test_two_names_of_one_machine_share_local_ranks_and_devices():
    """An alias and its IP in one hosts file: the preflight says they are one
    machine, so their processes count local ranks, and split GPUs, together."""
    hosts = (Host("alias", slots=2), Host("10.0.0.5", slots=2), Host("other", slots=2))
    opts = LaunchOptions(
        target=Target("t.py"), num_processes=6, coordinator="alias:1234", run_id="r", hosts=hosts,
        host_machines={"alias": "n5/abc", "10.0.0.5": "n5/abc", "other": "n6/def"},
        host_devices={"alias": 8, "10.0.0.5": 8, "other": 4},
    )
    specs = plan(opts)
    assert [s.local_rank for s in specs] == [0, 1, 2, 3, 0, 1]
    assert [s.env["JAXRUN_LOCAL_PROCESS_COUNT"] for s in specs] == ["4", "4", "4", "4", "2", "2"]
    assert [s.env["JAX_LOCAL_DEVICE_IDS"] for s in specs] == ["0,1", "2,3", "4,5", "6,7", "0,1", "2,3"]


def test_gpus_counted_on_a_host_that_cannot_be_split_evenly():
    hosts = (Host("n1", slots=3),)
    opts = LaunchOptions(target=Target("t.py"), num_processes=3, coordinator="n1:1", run_id="r", hosts=hosts,
                         host_devices={"n1": 8})
    with pytest.raises(PlanError, match="8 devices on n1 cannot be split evenly among 3 processes"):
        plan(opts)


def test_the_local_process_id_counts_on_each_host():
    """{local_process_id} and JAXRUN_LOCAL_PROCESS_ID are the rank on the
    process's own host, not the global rank (equal only on one host)."""
    target = Target("s.py", ("{process_id}", "{local_process_id}"))
    specs = plan(options(target=target, num_processes=5, hosts=(Host("a", slots=2), Host("b", slots=3))))
    assert [s.argv[-2:] for s in specs] == [("0", "0"), ("1", "1"), ("2", "0"), ("3", "1"), ("4", "2")]
    assert [s.env[contract.LOCAL_PROCESS_ID] for s in specs] == ["0", "1", "0", "1", "2"]
    assert [s.env[contract.LOCAL_PROCESS_COUNT] for s in specs] == ["2", "2", "3", "3", "3"]
