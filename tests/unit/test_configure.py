"""From the command line's values to a RunConfig, without click: the backend
registry decides what a run costs, needs and carries; bad input is one
LaunchError before anything is created."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import tempfile

import pytest

from jaxrun.backends import BACKENDS, create_backend
from jaxrun.backends.scheduler.options import MpirunOptions, SlurmOptions
from jaxrun.backends.ssh.options import SshOptions
from jaxrun.core.config import BackendEntry, Flag, LaunchError, OutOfFiles
from jaxrun.launcher.setup.configure import System, config_from_args
from jaxrun.launcher.setup.limits import FDS_RESERVED

# Every value the command hands over when nothing is given (click's defaults).
NOTHING_GIVEN = {
    "num_processes": None, "cpu_devices": None, "devices_per_process": None, "coordinator": None, "log_dir": None,
    "output": None, "console_ranks": None, "timeout": None, "flight_recorder": None, "check_divergence": False,
    "grace": 30.0, "max_restarts": 0, "timestamps": False, "report_path": None, "junit_path": None, "mesh": None,
    "mesh_axis_types": None, "env_pairs": (), "preload": None, "preload_modules": (), "exports": (),
    "hosts_file": None, "host_opts": (), "hosts_command": None, "min_hosts": None, "ssh_config": None,
    "ssh_options": (), "connect_timeout": 10.0, "python": None, "chdir": None, "sync": False, "launcher": None,
    "nodes": None, "tasks_per_node": None, "scheduler_args": (), "ray_address": None, "placement": None,
    "dry_run": False, "verbose": False, "args": (),
}


class FakeSystem(System):
    """A machine with the given programs, GPUs and limits, that records what
    jaxrun would change on it."""

    def __init__(self, environ=None, programs=("srun", "mpirun", "ssh", "python3"), gpus=None,
                 limits=(1 << 20, 1 << 20), pid_max=4194304, open_files=3):
        super().__init__(dict(environ or {}))
        self.programs, self.gpus, self.limits, self.pids = set(programs), gpus, limits, pid_max
        self.open = open_files  # descriptors open before the check (the standard streams, inherited ones)
        self.gpu_counts = 0
        self.raised = False

    def which(self, program):
        return f"/usr/bin/{program}" if program in self.programs else None

    def local_gpus(self):
        self.gpu_counts += 1
        return self.gpus

    def open_file_limits(self):
        return self.limits

    def open_files(self):
        return self.open

    def raise_open_file_limit(self):
        self.raised = True

    def pid_max(self):
        return self.pids


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "s.py"
    path.write_text("print('hi')\n")
    return str(path)


def configured(script, *, system=None, backends=BACKENDS, **given):
    values = {**NOTHING_GIVEN, "args": (script,), "log_dir": os.path.dirname(script) + "/logs", **given}
    return config_from_args(values, backends, system or FakeSystem())


def refused(script, message, **given):
    with pytest.raises(LaunchError) as e:
        configured(script, **given)
    assert str(e.value) == message


# -- choosing the backend ------------------------------------------------------------


def test_a_plain_run_is_local_and_preloads_unless_the_environment_says_no(script):
    config = configured(script)
    assert (config.backend, config.backend_options, config.options.scheduled) == ("local", None, False)
    assert config.options.num_processes == 1 and config.preload
    assert not configured(script, system=FakeSystem({"JAXRUN_NO_PRELOAD": "1"})).preload


def test_hosts_mean_ssh_with_its_options(script, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = configured(script, host_opts=("a:2,b",), exports=("TOKEN",), ssh_options=("Port=2222",), sync=True,
                        system=FakeSystem({"TOKEN": "t"}))
    assert config.backend == "ssh" and config.options.num_processes == 3
    assert config.backend_options == SshOptions(python=sys.executable, chdir=str(tmp_path), options=("Port=2222",),
                                                env={"TOKEN": "t"}, script=script, sync=True)


def test_slurm_takes_the_allocation_task_count_and_mpirun_does_not(script):
    inside = FakeSystem({"SLURM_NTASKS": "6"})
    config = configured(script, launcher="slurm", nodes=2, scheduler_args=("--overcommit",), system=inside)
    assert config.options.num_processes == 6 and config.options.scheduled
    assert config.backend_options == SlurmOptions(nodes=2, scheduler_args=("--overcommit",))
    assert configured(script, launcher="mpirun", system=inside).options.num_processes == 1
    assert configured(script, launcher="slurm", num_processes=2, system=inside).options.num_processes == 2


@pytest.mark.parametrize("given, message", [
    ({"launcher": "ssh"}, "--launcher ssh needs --hosts FILE or -H HOST"),
    ({"launcher": "slurm", "host_opts": ("a",)},
     "--hosts and -H start processes over SSH; they do not work with --launcher slurm"),
    ({"launcher": "local", "host_opts": ("a",)},
     "--hosts and -H start processes over SSH; they do not work with --launcher local"),
    ({"tasks_per_node": 2}, "--nodes, --ntasks-per-node and --scheduler-arg need --launcher slurm or mpirun"),
    ({"host_opts": ("a",), "scheduler_args": ("-x",)},
     "--nodes, --ntasks-per-node and --scheduler-arg need --launcher slurm or mpirun"),
    ({"launcher": "mpirun", "nodes": 2},
     "--nodes works with --launcher slurm only; give mpirun its hosts with --scheduler-arg"),
    ({"sync": True}, "--sync copies the working directory to SSH hosts: it needs --hosts or -H"),
    ({"sync": True, "launcher": "mpirun"}, "--sync copies the working directory to SSH hosts: it needs --hosts or -H"),
    ({"sync": True, "host_opts": ("a",), "chdir": "/no/such/folder"},
     "--sync: /no/such/folder is not a folder here, so there is nothing to copy"),
    ({"placement": "pack"}, "--placement works with --launcher ray only"),
    ({"ray_address": "h:1", "host_opts": ("a",)}, "--ray-address works with --launcher ray only"),
])
def test_options_that_do_not_fit_the_backend_are_refused(script, given, message):
    refused(script, message, **given)


def test_the_ssh_connection_options_and_chdir_are_ignored_elsewhere_as_always(script, tmp_path):
    ssh_file = tmp_path / "ssh_config"
    ssh_file.write_text("")
    given = {"ssh_config": str(ssh_file), "ssh_options": ("Port=1",), "connect_timeout": 3.0, "chdir": "/w"}
    for launcher in ("local", "slurm", "mpirun"):
        assert configured(script, launcher=launcher, **given).backend == launcher


def test_a_flag_two_entries_list_is_refused_elsewhere_naming_both(script):
    shared = Flag("pool", ("--pool",), "The pool.")
    entries = {name: BackendEntry(name, name, kind=name, fds_per_process=3, start=lambda config, console: None,
                                  scheduled=True, flags=(shared,)) for name in ("cloud", "grid")}
    backends = {**BACKENDS, **entries}
    assert configured(script, backends=backends, launcher="grid", pool="p").backend == "grid"
    refused(script, "--pool works with --launcher cloud or grid only", backends=backends, pool="p")
    refused(script, "--pool works with --launcher cloud or grid only", backends=backends, pool="p",
            launcher="mpirun")


def test_an_entry_s_own_refusal_speaks_before_the_registry_s(script):
    # Ray says why it takes no --nodes (its options run first); without ray
    # installed, that it is missing.
    with pytest.raises(LaunchError) as e:
        configured(script, launcher="ray", nodes=2)
    assert "Ray places the processes as --placement says" in str(e.value) or "pip install" in str(e.value)


# -- what each backend needs on this machine ---------------------------------------------


# -- elastic restarts ----------------------------------------------------------------

@pytest.mark.parametrize("given, message", [
    ({"min_hosts": 1, "max_restarts": 1},
     "--min-hosts and --hosts-command choose hosts for restarts; --launcher local does not start processes on "
     "chosen hosts"),
    ({"min_hosts": 1, "host_opts": ("a,b",)},
     "--min-hosts replaces lost hosts when the job restarts: give --max-restarts N too"),
    ({"min_hosts": 3, "max_restarts": 1, "host_opts": ("a,b,c",), "num_processes": 2},
     "--min-hosts 3: the job starts on only 2 hosts"),
    ({"hosts_command": "echo a", "host_opts": ("a",)}, "--hosts, -H and --hosts-command cannot be used together"),
    ({"min_hosts": 1, "max_restarts": 1, "launcher": "slurm", "num_processes": 2},
     "--min-hosts with --launcher slurm works inside an allocation (sbatch or salloc, with --no-kill): outside "
     "one, each restart asks Slurm for new nodes"),
])
def test_elastic_options_are_checked_before_anything_starts(script, given, message):
    refused(script, message, **given)


def test_elastic_restarts_keep_their_minimum_and_a_hosts_command_alone_means_one(script):
    config = configured(script, min_hosts=2, max_restarts=1, host_opts=("a,b,c",), num_processes=2)
    assert config.min_hosts == 2 and config.hosts_command is None
    config = configured(script, hosts_command="printf 'a slots=2\\nb\\n'", max_restarts=2)
    assert config.min_hosts == 1 and config.backend == "ssh"
    assert [(h.name, h.slots) for h in config.options.hosts] == [("a", 2), ("b", 1)]
    assert config.options.num_processes == 3  # every slot the command listed
    assert configured(script, host_opts=("a,b",), max_restarts=1).min_hosts is None
    inside = FakeSystem({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "4"})
    assert configured(script, launcher="slurm", min_hosts=1, max_restarts=1, system=inside).min_hosts == 1


def test_probe_leaves_hosts_out_without_a_restart_budget(script):
    """--probe --min-hosts K: the hosts the probe names are left out before
    the first attempt, which spends no restart."""
    config = configured(script, min_hosts=2, host_opts=("a,b,c",), probe="strict")
    assert config.min_hosts == 2 and config.probe == "strict" and config.max_restarts == 0



@pytest.mark.parametrize("given, missing, message", [
    ({"launcher": "slurm"}, "srun", "--launcher slurm: srun is not on PATH"),
    ({"launcher": "mpirun"}, "mpirun", "--launcher mpirun: mpirun is not on PATH"),
    ({"host_opts": ("a",)}, "ssh", "--hosts/-H: ssh (the OpenSSH client) is not on PATH"),
])
def test_each_backend_s_engine_must_be_on_path_except_for_a_dry_run(script, given, missing, message):
    system = FakeSystem(programs={"srun", "mpirun", "ssh"} - {missing})
    refused(script, message, system=system, **given)
    assert configured(script, system=system, dry_run=True, **given).dry_run


def test_python_is_checked_here_unless_the_processes_run_over_ssh(script):
    for launcher in ("local", "slurm"):
        refused(script, "--python nopython: not found on PATH", launcher=launcher, python="nopython")
    assert configured(script, host_opts=("a",), python="nopython").options.python == "nopython"


@pytest.mark.parametrize("given, each, kind", [({}, 6, "local"), ({"host_opts": ("a:4",)}, 5, "ssh"),
                                               ({"launcher": "mpirun"}, 9, "scheduler")])
def test_the_open_file_budget_is_the_backend_s(script, given, each, kind):
    need = 3 + FDS_RESERVED + each * 4  # the standard streams, the launcher's own (measured), the processes
    with pytest.raises(LaunchError, match=fr"needs about {need} open files .*\({each} each, {kind} run\)"):
        configured(script, num_processes=4, system=FakeSystem(limits=(need - 1, need - 1)), **given)
    short = FakeSystem(limits=(need - 1, need))
    configured(script, num_processes=4, system=short, **given)
    assert short.raised
    plenty = FakeSystem(limits=(need, need))
    configured(script, num_processes=4, system=plenty, **given)
    assert not plenty.raised


def test_what_is_open_already_counts_and_is_one_line_with_exit_70(script):
    """Descriptors inherited from the shell count against the same limit: a
    job that fits an empty launcher but not this one is OutOfFiles (exit 70)."""
    need = 3 + FDS_RESERVED + 6
    configured(script, num_processes=1, system=FakeSystem(limits=(need, need)))
    with pytest.raises(OutOfFiles, match=r"^-n 1: jaxrun needs about 30 more open files \(6 for each process, local "
                                         r"run\), but 40 are open already \(inherited\) and the open-file limit is "
                                         fr"{need} \(ulimit -Hn\); close them, or raise the limit$"):
        configured(script, num_processes=1, system=FakeSystem(limits=(need, need), open_files=40))
    # One that cannot fit however little is open stays bad input (exit 2), as before.
    with pytest.raises(LaunchError, match="at most 0 processes"):
        configured(script, num_processes=1, system=FakeSystem(limits=(need - 1, need - 1)))


def test_gpus_are_counted_only_for_several_local_processes(script):
    for given, counts in [({"num_processes": 2}, 1), ({}, 0), ({"num_processes": 2, "cpu_devices": 1}, 0),
                          ({"num_processes": 2, "launcher": "slurm"}, 0), ({"host_opts": ("a:2",)}, 0)]:
        system = FakeSystem(gpus=4)
        config = configured(script, system=system, **given)
        assert system.gpu_counts == counts, given
        assert config.options.devices_per_host == (4 if counts else None)
    refused(script, "--devices-per-process 3: this machine has 2 GPUs", devices_per_process=3,
            system=FakeSystem(gpus=2))


# -- bad input creates nothing -------------------------------------------------------


def test_an_unset_export_is_refused_before_the_default_log_folder_exists(script):
    refused(script, "-x NOPE: NOPE is not set here", exports=("NOPE",), log_dir=None)
    assert os.listdir(tempfile.gettempdir()) == []
    config = configured(script, log_dir=None, exports=("YES",), env_pairs=(("YES", "2"),),
                        system=FakeSystem({"YES": "1"}))
    assert dict(config.options.extra_env) == {"YES": "2"}  # --env wins over -x
    assert os.listdir(tempfile.gettempdir()) == [f"jaxrun-logs-{os.geteuid()}"]


@pytest.mark.parametrize("args, message", [
    ((), "missing SCRIPT (or -m MODULE)"),
    (("-m",), "-m needs a MODULE"),
    (("--cpu-device",), "no such option: --cpu-device (did you mean --cpu-devices?)"),
    (("--zzz=1",), "no such option: --zzz"),
    (("nothere.py",), "script not found: nothere.py"),
])
def test_the_target_is_a_script_or_a_module(args, message):
    with pytest.raises(LaunchError) as e:
        config_from_args({**NOTHING_GIVEN, "args": args}, BACKENDS, FakeSystem(), ["--cpu-devices", "--hosts"])
    assert str(e.value) == message


# -- a new backend is one entry -------------------------------------------------------


def test_a_new_backend_brings_its_options_and_costs_without_other_changes(script):
    @dataclasses.dataclass(frozen=True)
    class CloudOptions:
        address: str
        processes: int

    cloud = BackendEntry("cloud", "processes on an imagined cloud pool", kind="cloud", fds_per_process=3,
                         start=lambda config, console: None, scheduled=True,
                         options=lambda values, launch: CloudOptions(values["pool"], launch.num_processes))
    backends = {**BACKENDS, "cloud": cloud}
    config = configured(script, backends=backends, launcher="cloud", pool="10.0.0.1:6379", num_processes=2)
    assert (config.backend, config.backend_options) == ("cloud", CloudOptions("10.0.0.1:6379", 2))
    assert config.options.scheduled
    with pytest.raises(LaunchError, match=r"\(3 each, cloud run\)"):
        configured(script, backends=backends, launcher="cloud", pool="", num_processes=10,
                   system=FakeSystem(limits=(50, 50)))
    # --nodes and its kin are the srun/mpirun steps' (kind "scheduler"), not every scheduled backend's.
    refused(script, "--nodes, --ntasks-per-node and --scheduler-arg need --launcher slurm or mpirun",
            backends=backends, nodes=2)


def test_each_entry_builds_its_own_backend(script):
    from jaxrun.backends.forkserver.client import ForkServerBackend
    from jaxrun.backends.local import LocalBackend
    from jaxrun.backends.scheduler.mpirun import MpirunBackend

    assert type(create_backend(configured(script), sys.stderr)) is ForkServerBackend
    assert type(create_backend(configured(script, preload=False), sys.stderr)) is LocalBackend
    mpirun = create_backend(configured(script, launcher="mpirun"), sys.stderr)
    assert type(mpirun) is MpirunBackend and mpirun.options == MpirunOptions()
    assert list(BACKENDS) == ["local", "ssh", "slurm", "mpirun", "ray"]
    assert [e.name for e in BACKENDS.values() if e.default] == ["local"]


def test_a_local_run_never_imports_ssh_or_scheduler_code(script):
    program = ("import sys\nfrom jaxrun import cli\ntry:\n    cli.entry_point(['-n', '2', '--dry-run', sys.argv[1]])\n"
               "except SystemExit:\n    pass\n"
               "print(sorted(m for m in sys.modules if m.startswith('jaxrun.backends.')))\n")
    done = subprocess.run([sys.executable, "-c", program, script], capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(done.stdout.splitlines()[-1])
    assert "jaxrun.backends.forkserver.client" in loaded
    assert [m for m in loaded if m.split(".")[-1].startswith(("ssh", "scheduler", "ray"))] == []
