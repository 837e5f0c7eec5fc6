"""A TPU host's chips, counted without jax, and each local process's share
of them, set as JAX's own multi-process runner sets it
(jax/_src/test_multiprocess.py): 1, 4 and 8 chips, and the refusal of more
processes than chips, before anything starts.  The chips are faked by a
folder standing for the machine's root (its /dev and /sys)."""

from __future__ import annotations

import os

import pytest

from jaxrun import cli
from jaxrun.backends import BACKENDS
from jaxrun.contract import devices
from jaxrun.core.config import LaunchError
from jaxrun.launcher.setup import plan as planning
from jaxrun.launcher.setup.configure import System, config_from_args

TPU_V5E, GVNIC = "0x0063", "0x0042"


def machine(root, *, accel=0, vfio=(), pci=()):
    """A root folder with ``accel`` /dev/accelN files, the VFIO groups
    ``vfio`` (numbers), and a PCI device for each Google device id in ``pci``."""
    (root / "dev" / "vfio").mkdir(parents=True)
    (root / "dev" / "vfio" / "vfio").write_text("")  # the container file, never a chip
    for n in range(accel):
        (root / "dev" / f"accel{n}").write_text("")
    for group in vfio:
        (root / "dev" / "vfio" / str(group)).write_text("")
    for n, device in enumerate(pci):
        folder = root / "sys" / "bus" / "pci" / "devices" / f"0000:00:{8 + n:02x}.0"
        folder.mkdir(parents=True)
        (folder / "vendor").write_text("0x1ae0\n")
        (folder / "device").write_text(device + "\n")
    return str(root)


# -- counting ---------------------------------------------------------------------

def test_chips_are_the_accel_files_or_the_vfio_groups_that_pci_lists_as_tpus(tmp_path):
    assert devices.host_tpu_chips({}, machine(tmp_path / "v4", accel=4)) == [0, 1, 2, 3]
    assert devices.host_tpu_chips({}, machine(tmp_path / "v5e-8", vfio=range(8), pci=[TPU_V5E] * 8)) == list(range(8))
    # The TPU host of issue 71: PCI lists four v5e chips, one VFIO group (/dev/vfio/1) is
    # there, and JAX sees one chip.
    assert devices.host_tpu_chips({}, machine(tmp_path / "sandbox", vfio=[1], pci=[TPU_V5E] * 4)) == [0]
    # VFIO groups of other devices (a GPU passed through), Google's network card: no TPU.
    assert devices.host_tpu_chips({}, machine(tmp_path / "vm", vfio=[0, 1], pci=[GVNIC])) is None
    assert devices.host_tpu_chips({}, str(tmp_path / "nothing")) is None


def test_tpu_visible_chips_is_the_set_and_a_job_off_the_tpu_has_none(tmp_path):
    root = machine(tmp_path, accel=4)
    assert devices.host_tpu_chips({"TPU_VISIBLE_CHIPS": "2,3"}, root) == [2, 3]
    assert devices.host_tpu_chips({"TPU_VISIBLE_CHIPS": "0,1,2,3"}, str(tmp_path / "no-tpu")) == [0, 1, 2, 3]
    assert devices.host_tpu_chips({"JAX_PLATFORMS": "cpu"}, root) is None
    assert devices.host_tpu_chips({"JAX_PLATFORMS": "tpu,cpu"}, root) == [0, 1, 2, 3]


# -- each process's share: JAX's runner's variables ------------------------------------

def test_one_chip_one_process_has_the_runners_bounds_and_no_address():
    assert devices.tpu_env([0], 0, 1, 1, ()) == {
        "TPU_VISIBLE_CHIPS": "0", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "1,1,1",
        "CLOUD_TPU_TASK_ID": "0", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        # the Cloud TPU VM's names say the same: jaxrun's numbering, not the VM's
        "TPU_WORKER_ID": "0", "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "1,1,1",
        "TPU_WORKER_HOSTNAMES": "localhost",
    }


# (chips, processes, --devices-per-process) -> each process's chips, and the runner's
# (TPU_PROCESS_BOUNDS, TPU_CHIPS_PER_PROCESS_BOUNDS) for that many chips in all and per process.
SPLITS = [
    (4, 4, None, ["0", "1", "2", "3"], ("2,2,1", "1,1,1")),
    (4, 2, None, ["0,1", "2,3"], ("2,1,1", "1,2,1")),
    (4, 1, 4, ["0,1,2,3"], ("1,1,1", "2,2,1")),
    (4, 1, 1, ["0"], ("1,1,1", "1,1,1")),
    (8, 8, None, [str(c) for c in range(8)], ("4,2,1", "1,1,1")),
    (8, 8, 1, [str(c) for c in range(8)], ("4,2,1", "1,1,1")),
    (8, 2, None, ["0,1,2,3", "4,5,6,7"], ("1,2,1", "2,2,1")),
    (8, 1, 8, ["0,1,2,3,4,5,6,7"], ("1,1,1", "2,4,1")),
    (8, 4, None, ["0,1", "2,3", "4,5", "6,7"], ("2,2,1", "1,2,1")),
]


@pytest.mark.parametrize("chips, count, per_process, shares, bounds", SPLITS)
def test_each_process_gets_its_chips_its_place_and_every_peers_port(chips, count, per_process, shares, bounds):
    ports = [9000 + r for r in range(count)] if count > 1 else []
    envs = [devices.tpu_env(list(range(chips)), r, count, per_process, ports) for r in range(count)]
    assert [env["TPU_VISIBLE_CHIPS"] for env in envs] == shares
    for r, env in enumerate(envs):
        assert (env["TPU_PROCESS_BOUNDS"], env["TPU_CHIPS_PER_PROCESS_BOUNDS"]) == bounds
        assert (env["TPU_HOST_BOUNDS"], env["TPU_CHIPS_PER_HOST_BOUNDS"]) == bounds
        assert env["CLOUD_TPU_TASK_ID"] == env["TPU_WORKER_ID"] == str(r)
        assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
        if count > 1:
            assert env["TPU_PROCESS_ADDRESSES"] == ",".join(f"localhost:{p}" for p in ports)
            assert env["TPU_PROCESS_PORT"] == str(ports[r])
            assert env["TPU_WORKER_HOSTNAMES"] == ",".join(["localhost"] * count)
        else:
            assert "TPU_PROCESS_ADDRESSES" not in env and "TPU_PROCESS_PORT" not in env


def test_the_chips_tpu_visible_chips_named_are_the_ones_shared_out():
    assert [devices.tpu_env([4, 5, 6, 7], r, 2, None, (1, 2))["TPU_VISIBLE_CHIPS"] for r in (0, 1)] == ["4,5", "6,7"]


@pytest.mark.parametrize("chips, count, per_process, message", [
    (1, 2, None, "-n 2: this machine has 1 TPU chip, and a chip is held by one process at a time; at most 1 "
                 "process here (or --cpu-devices D for CPU processes)"),
    (4, 8, None, "-n 8: this machine has 4 TPU chips, and a chip is held by one process at a time; at most 4 "
                 "processes here (or --cpu-devices D for CPU processes)"),
    (1, 2, 1, "-n 2 x --devices-per-process 1 needs 2 TPU chips, but this machine has 1"),
    (4, 1, 8, "-n 1 x --devices-per-process 8 needs 8 TPU chips, but this machine has 4"),
    (8, 3, None, "8 TPU chips cannot be split evenly among 3 processes; pass --devices-per-process"),
    (8, 3, 2, "-n 3 x 2 TPU chips: jaxrun lays out a host's chips as JAX's multi-process runner does, 1, 4 or 8 "
              "chips in all, 1, 2, 4 or 8 to a process"),
])
def test_what_does_not_fit_the_chips_is_one_line(chips, count, per_process, message):
    with pytest.raises(ValueError) as e:
        devices.tpu_split(chips, count, per_process)
    assert str(e.value) == message


# -- the launch: counted, refused before anything starts, planned ----------------------

class Host(System):
    """This machine's environment and programs, no GPU, its /dev and /sys under ``root``."""

    def local_gpus(self):
        return None


class Sandbox(Host):
    """A machine whose every internet socket is refused (errno 97)."""

    def loopback_refused(self):
        return "Address family not supported by protocol"


def configured(tmp_path, system, *args):
    """The dry run's configuration for ``jaxrun --dry-run ARGS s.py``."""
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    argv = ["--dry-run", "--log-dir", str(tmp_path / "logs"), *args, str(script)]
    return config_from_args(cli.main.make_context("jaxrun", argv).params, BACKENDS, system)


def test_more_processes_than_the_hosts_chips_are_refused_before_anything_starts(tmp_path):
    one_chip = Host({}, root=machine(tmp_path / "root", vfio=[1], pci=[TPU_V5E] * 4))
    with pytest.raises(LaunchError) as e:
        configured(tmp_path, one_chip, "-n", "2")
    assert str(e.value).startswith("-n 2: this machine has 1 TPU chip,")
    assert not os.path.exists(tmp_path / "logs")
    # CPU processes, or a job whose JAX_PLATFORMS leaves the TPU alone, use no chip.
    assert configured(tmp_path, one_chip, "-n", "2", "--cpu-devices", "1").options.tpu_chips == ()
    assert configured(tmp_path, Host({"JAX_PLATFORMS": "cpu"}, root=one_chip.root),
                      "-n", "2").options.tpu_chips == ()
    assert configured(tmp_path, one_chip, "-n", "2", "-x", "JAX_PLATFORMS=cpu").options.tpu_chips == ()
    # One process owns every chip, as a bare python does: nothing is set.
    config = configured(tmp_path, one_chip)
    assert config.options.tpu_chips == ()
    assert not any(k.startswith("TPU_") for k in planning.plan(config.options)[0].env)


def test_a_four_chip_host_gives_four_processes_a_chip_and_a_port_each(tmp_path):
    config = configured(tmp_path, Host({}, root=machine(tmp_path / "root", vfio=range(4), pci=[TPU_V5E] * 4)),
                        "-n", "4")
    opts = config.options
    assert opts.tpu_chips == (0, 1, 2, 3) and len(set(opts.tpu_ports)) == 4
    specs = planning.plan(opts)
    assert [s.env["TPU_VISIBLE_CHIPS"] for s in specs] == ["0", "1", "2", "3"]
    assert [s.env["TPU_PROCESS_PORT"] for s in specs] == [str(p) for p in opts.tpu_ports]
    assert all("JAX_LOCAL_DEVICE_IDS" not in s.env for s in specs)


def test_several_processes_where_internet_sockets_are_refused_say_why(tmp_path):
    with pytest.raises(LaunchError) as e:
        configured(tmp_path, Sandbox({}, root=machine(tmp_path / "root", accel=4)), "-n", "4")
    assert str(e.value) == ("-n 4: libtpu's processes meet on TCP ports (TPU_PROCESS_ADDRESSES), and this machine "
                            "refuses internet sockets (Address family not supported by protocol); a job of one "
                            "process needs none")
    # CPU processes meet over them too.
    with pytest.raises(LaunchError) as e:
        configured(tmp_path, Sandbox({}, root=str(tmp_path / "no-tpu")), "-n", "2", "--cpu-devices", "1")
    assert str(e.value).startswith("-n 2: a job's processes meet over internet sockets (JAX's CPU collectives, ")
    # One process with one chip of four needs no port.
    config = configured(tmp_path, Sandbox({}, root=machine(tmp_path / "r1", accel=4)), "--devices-per-process", "1")
    assert planning.plan(config.options)[0].env["TPU_VISIBLE_CHIPS"] == "0"
