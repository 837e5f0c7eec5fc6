"""From the command line's values to a ``RunConfig``: ``jaxrun.cli`` parses,
this decides.

``config_from_args`` checks every input before anything starts and raises
``LaunchError`` (exit 2, one line) for the first bad one, so that nothing
is half-started: the only thing it may create, the private base of the
default log folder, comes last.  The backends come in as their registry
(``jaxrun.backends.table.BACKENDS``): the chosen entry says what its runs cost
and need, and builds its own options.  The machine comes in as a
``System``, which tests replace.
"""

from __future__ import annotations

import datetime
import difflib
import os
import resource
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrun import contract
from jaxrun.contract import devices
from jaxrun.core import forward, logfiles, modes
from jaxrun.core.config import BackendEntry, LaunchError, RunConfig, declared_flags, on_github_actions
from jaxrun.core.ranks import console_rank_set
from jaxrun.launcher.setup import allocation, limits, plan as planning
from jaxrun.launcher.setup.devices import MEET_ON_CPU, check_loopback, free_ports, tpu_share

# The most accelerators one process may own when jaxrun cannot count them
# (remote hosts, TPUs): more than any one host has.
MAX_DEVICES_PER_PROCESS = 256
# A hosts file lists hosts; more than this is not one (--hosts /dev/zero).
MAX_HOSTS_FILE = 1 << 20
# The folder of a local run's log folder where its attempts share JAX's compile cache.
COMPILE_CACHE_FOLDER = "compile-cache"


class System:
    """This machine as the checks see it: its environment, its programs, its
    GPUs and its limits.  Tests pass one with fixed answers."""

    def __init__(self, environ: Mapping[str, str] | None = None, root: str = "/"):
        self.environ = os.environ if environ is None else environ
        self.root = root  # where its /dev and /sys are (a test's folder of fake TPU chips)

    def which(self, program: str) -> str | None:
        return shutil.which(program, path=self.environ.get("PATH"))

    def local_gpus(self) -> int | None:
        from jaxrun.launcher.setup.devices import count_local_gpus

        return count_local_gpus(self.environ)

    def local_tpu_chips(self, environ: Mapping[str, str]) -> list[int] | None:
        return devices.host_tpu_chips(environ, self.root)

    def tcp_ports(self, count: int) -> list[int]:
        return free_ports(count)

    def loopback_refused(self) -> str | None:
        return contract.loopback_refused()

    def open_file_limits(self) -> tuple[int, int]:
        return resource.getrlimit(resource.RLIMIT_NOFILE)

    def open_files(self) -> int:
        """How many file descriptors this process holds now (inherited ones too)."""
        return limits.open_files()

    def raise_open_file_limit(self) -> None:
        """Soft to hard, as other launchers do (the processes inherit it)."""
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # an unlimited hard limit the kernel will not grant: carry on with the soft one

    def pid_max(self) -> int:
        from jaxrun import portable

        return portable.pid_max()


def config_from_args(values: Mapping[str, Any], backends: Mapping[str, BackendEntry], system: System | None = None,
                     option_names: Sequence[str] = ()) -> RunConfig:
    """The run ``values`` ask for: every option of the command by its
    parameter name (``num_processes``, ``hosts_file``, ...), and ``args``,
    the words from SCRIPT (or -m) on.  ``option_names`` are the command's
    long options, for the close match a mistyped one gets."""
    system = system or System()
    allocation.refuse_a_step(system.environ)
    mode = chosen_mode(values)
    try:
        mode.check(values)
        target = mode.target(values["args"], lambda args: parse_target(args, option_names))
    except modes.ModeError as e:
        raise LaunchError(str(e)) from None
    cpu_devices, per_process = values["cpu_devices"], values["devices_per_process"]
    if cpu_devices is not None and per_process is not None:
        raise LaunchError("--cpu-devices and --devices-per-process cannot be used together")
    hosts = read_hosts(values["hosts_file"], values["host_opts"], values["hosts_command"])
    entry = chosen_backend(backends, values, bool(hosts))
    extra_env = exported_env(values["exports"], values["env_pairs"], system.environ)
    if entry.takes_hosts and not values.get("no_forward"):  # sshd gives its processes a fresh environment
        extra_env = {**forward.forwarded(system.environ), **extra_env}
    layout = allocation.process_count(values, entry, hosts, system.environ)
    num_processes = layout.count
    limits.check_scale(num_processes, entry, system)
    if hosts:
        planning.assign_hosts(hosts, num_processes)  # too few slots: exit 2 before any ssh
    min_hosts = elastic_minimum(values, entry, hosts, num_processes, system.environ)
    console_ranks = mode.console_ranks(console_rank_set(values["console_ranks"], num_processes))
    check_devices_per_process(per_process)  # before counting GPUs, which may run nvidia-smi
    elsewhere = entry.takes_hosts or entry.scheduled
    devices_per_host = local_device_count(cpu_devices, per_process, num_processes, elsewhere, system)
    check_devices_per_process(per_process, devices_per_host)
    tpu_chips, tpu_ports = ((), ()) if devices_per_host or cpu_devices is not None or elsewhere else \
        tpu_share(system, num_processes, per_process, extra_env)
    if num_processes > 1 and not elsewhere and not tpu_ports:
        check_loopback(system, num_processes, MEET_ON_CPU)
    run_id = new_run_id()
    launch = planning.LaunchOptions(
        target=target,
        num_processes=num_processes,
        coordinator="",
        run_id=run_id,
        cpu_devices=cpu_devices,
        hosts=tuple(hosts) if hosts else (planning.LOCAL_HOST,),
        python=values["python"] or sys.executable,
        extra_env=extra_env,
        mesh=values["mesh"],
        mesh_axis_types=values["mesh_axis_types"],
        verbose=values["verbose"],
        devices_per_process=per_process,
        devices_per_host=devices_per_host,
        tpu_chips=tpu_chips,
        tpu_ports=tpu_ports,
        scheduled=entry.scheduled,
        flight_recorder=values["flight_recorder"],
        check_divergence=values["check_divergence"],
        checks=values.get("checks") or contract.CHECKS_ON,
        stall_timeout=mode.stall_timeout(values.get("stall_timeout", 0.0)),
        account=not values.get("no_account", False),
        recoverable=mode.recoverable(values.get("recoverable")),
        compile_cache=shared_compile_cache(values, entry, run_id, extra_env, system.environ),
    )
    # The entry's own checks first: it may say better why it takes no flag of
    # another's (Ray, of --nodes).
    backend_options = entry.options(values, launch)
    refuse_others_flags(backends, entry, values)
    log_dir = values["log_dir"]
    if not values["dry_run"]:
        log_dir = ready_for_a_run(values, entry, run_id, system)
    return run_config(values, launch, console_ranks, log_dir or default_log_dir(run_id), entry.name,
                      backend_options, system.environ, mode=mode, min_hosts=min_hosts, probe=values.get("probe") or "",
                      hosts_command=values["hosts_command"], count_source=layout.source)


def chosen_mode(values: Mapping[str, Any]) -> modes.Mode:
    """What the run is for: -i at a terminal, -i behind the kernel's pipe, or a script."""
    if values.get("kernel_pipe"):
        return modes.Jupyter()
    return modes.Terminal() if values.get("interactive") else modes.Script()


def ready_for_a_run(values: Mapping[str, Any], entry: BackendEntry, run_id: str, system: System) -> str:
    """The last checks, of what a real run needs here; the log folder."""
    check_engine(entry, values["python"], system.which)
    for option, path in (("--report", values["report_path"]), ("--junit-xml", values["junit_path"])):
        if path:
            logfiles.check_writable_file(option, path)
    return prepared_log_dir(values["log_dir"], run_id)  # last: it may create the private base folder


def run_config(values: Mapping[str, Any], launch: planning.LaunchOptions, console_ranks: frozenset[int] | None,
               log_dir: str, backend: str, backend_options: Any, environ: Mapping[str, str],
               **rest: Any) -> RunConfig:
    """``rest``: the RunConfig fields decided above (the mode, elastic restarts)."""
    github_actions = on_github_actions(environ)
    preload = values["preload"]
    return RunConfig(
        options=launch,
        log_dir=log_dir,
        output=values["output"] or ("grouped" if github_actions else "stream"),
        console_ranks=console_ranks,
        grace=values["grace"],
        timeout=values["timeout"],
        max_restarts=values["max_restarts"],
        report_path=values["report_path"],
        dry_run=values["dry_run"],
        verbose=values["verbose"],
        quiet=values.get("quiet", False),
        fixed_coordinator=values["coordinator"],
        junit_path=values["junit_path"],
        timestamps=values["timestamps"],
        github_actions=github_actions,
        preload=preload if preload is not None else environ.get(contract.NO_PRELOAD, "") in ("", "0"),
        preload_modules=tuple(values["preload_modules"]),
        backend=backend,
        backend_options=backend_options,
        profile=values.get("profile"),
        **rest,
    )


def parse_target(args: Sequence[str], option_names: Sequence[str] = ()) -> planning.Target:
    if not args:
        raise LaunchError("missing SCRIPT (or -m MODULE)")
    if args[0] == "-m":
        if len(args) < 2:
            raise LaunchError("-m needs a MODULE")
        return planning.Target(args[1], tuple(args[2:]), is_module=True)
    if args[0].startswith("-"):
        # Unknown options pass through to the script, so click never refuses one.
        given = args[0].split("=", 1)[0]
        close = difflib.get_close_matches(given, option_names, n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise LaunchError(f"no such option: {given}{hint}")
    script = args[0]
    if not os.path.isfile(script):
        raise LaunchError(f"script not found: {script}")
    return planning.Target(script, tuple(args[1:]))


def read_hosts(hosts_file: str | None, host_opts: Sequence[str], command: str | None = None) -> list[planning.Host]:
    """Hosts from --hosts, -H or --hosts-command; an empty list means no hosts."""
    if sum(map(bool, (hosts_file, host_opts, command))) > 1:
        raise LaunchError("--hosts, -H and --hosts-command cannot be used together")
    if command:
        from jaxrun.launcher.setup.discover import discover

        return discover(command)
    if not hosts_file and not host_opts:
        return []
    from jaxrun.launcher.setup import hosts as hostfile

    try:
        if hosts_file:
            return hostfile.parse_hosts_file(read_hosts_text(hosts_file), hosts_file)
        return hostfile.merge_host_options(host_opts)
    except hostfile.HostsError as e:
        raise LaunchError(str(e)) from None


def elastic_minimum(values: Mapping[str, Any], entry: BackendEntry, hosts: Sequence[planning.Host],
                    num_processes: int, environ: Mapping[str, str]) -> int | None:
    """--min-hosts, checked; with --hosts-command alone, restarts are elastic
    down to one host.  None: restarts run on the same hosts."""
    given = values["min_hosts"]
    if given is None and not values["hosts_command"]:
        return None
    if not entry.elastic:
        raise LaunchError(f"--min-hosts and --hosts-command choose hosts for restarts; --launcher {entry.name} "
                          "does not start processes on chosen hosts")
    if not values["max_restarts"] and not values.get("probe"):  # --probe's hosts left out need no restart
        raise LaunchError("--min-hosts replaces lost hosts when the job restarts: give --max-restarts N too")
    if entry.elastic_variable and not environ.get(entry.elastic_variable):
        raise LaunchError(entry.elastic_refusal)
    if not entry.takes_hosts:  # its engine knows the hosts: nothing to count here
        return given or 1
    from jaxrun.launcher.setup.hosts import used_hosts

    used = len(used_hosts(hosts, num_processes))
    if given is not None and given > used:
        raise LaunchError(f"--min-hosts {given}: the job starts on only {used} host{'' if used == 1 else 's'}")
    return given or 1


def shared_compile_cache(values: Mapping[str, Any], entry: BackendEntry, run_id: str,
                         extra_env: Mapping[str, str], environ: Mapping[str, str]) -> str:
    """Where the attempts keep JAX's persistent compile cache
    (``contract.COMPILE_CACHE``): in the run's log folder when the processes
    run here and no other user can swap a folder on its way (a team's
    --log-dir can: ``contract.trusted_path``), else a folder named after the
    run on each host; empty without restarts, or when the processes get a
    cache of their own (SSH does not carry this environment to the hosts;
    the shim checks theirs)."""
    carried = {} if entry.takes_hosts else environ
    if not values["max_restarts"] or contract.own_compile_cache({**carried, **extra_env}):
        return ""
    if entry.takes_hosts or entry.scheduled:
        return run_id
    folder = os.path.join(os.path.abspath(values["log_dir"]) if values["log_dir"] else default_log_dir(run_id),
                          COMPILE_CACHE_FOLDER)
    try:
        trusted = contract.trusted_path(folder)[1] is None
    except OSError:
        trusted = False
    return folder if trusted else run_id


def read_hosts_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_HOSTS_FILE + 1)
        if len(data) > MAX_HOSTS_FILE:
            raise LaunchError(f"{path}: more than {MAX_HOSTS_FILE >> 20} MiB; is it a hosts file?")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchError(f"{path}: cannot read it ({e})") from None


def chosen_backend(backends: Mapping[str, BackendEntry], values: Mapping[str, Any], has_hosts: bool) -> BackendEntry:
    """--launcher's entry, or the one hosts imply; hosts only with the
    backends that take them."""
    name = values["launcher"]
    if name is None:
        entry = next(e for e in backends.values() if (e.takes_hosts if has_hosts else e.default))
    else:
        entry = backends[name]
    if entry.takes_hosts and not has_hosts:
        raise LaunchError(f"--launcher {name} needs --hosts FILE or -H HOST")
    if has_hosts and not entry.takes_hosts:
        raise LaunchError(f"--hosts and -H start processes over SSH; they do not work with --launcher {name}")
    return entry


def refuse_others_flags(backends: Mapping[str, BackendEntry], entry: BackendEntry, values: Mapping[str, Any]) -> None:
    """A backend's flag given to a run of a backend that does not list it:
    refused, naming every launcher that takes it (unless the flag says that
    other launchers ignore it)."""
    for declared in declared_flags(backends).values():
        if declared.flag.exclusive and entry.name not in declared.launchers and declared.flag.given(values):
            raise LaunchError(declared.flag.refused(declared.launchers))


def exported_env(exports: Sequence[str], env_pairs: Sequence[tuple[str, str]],
                 environ: Mapping[str, str]) -> dict[str, str]:
    """``exports``: -x KEY (or --export KEY) takes the local value;
    ``env_pairs``: -x KEY=VALUE (or --env KEY=VALUE) wins over it."""
    env = {}
    for key in exports:
        if key not in environ:
            raise LaunchError(f"-x {key}: {key} is not set here")
        env[key] = environ[key]
    env.update(env_pairs)
    return env


def check_devices_per_process(per_process: int | None, local_gpus: int | None = None) -> None:
    """Bound --devices-per-process by what exists: MAX_DEVICES_PER_PROCESS,
    and this machine's GPUs when jaxrun counted them.  (Each process gets the
    list of its device ids in its environment.)"""
    if per_process is None:
        return
    if per_process > MAX_DEVICES_PER_PROCESS:
        raise LaunchError(f"--devices-per-process {per_process}: at most {MAX_DEVICES_PER_PROCESS} devices "
                          f"per process (no host has more)")
    if local_gpus is not None and per_process > local_gpus:
        raise LaunchError(f"--devices-per-process {per_process}: this machine has {local_gpus} GPUs")


def local_device_count(cpu_devices: int | None, per_process: int | None, num_processes: int, elsewhere: bool,
                       system: System) -> int | None:
    """This machine's GPUs, only when the plan needs them: to split them among
    several local processes, or to check --devices-per-process against them.
    (nvidia-smi is not free, and a single process simply owns every device.)
    Remote hosts may differ from this one; there only --devices-per-process applies."""
    if cpu_devices is not None or elsewhere:
        return None
    if num_processes == 1 and per_process is None:
        return None
    return system.local_gpus()


def check_engine(entry: BackendEntry, python: str | None, which: Callable[[str], str | None]) -> None:
    """The programs a run starts must exist here: its engine (srun, mpirun,
    ssh), and the --python of a run whose processes see this machine's files.
    (Over SSH the preflight checks the hosts' python.)"""
    if entry.engine and not which(entry.engine):
        raise LaunchError(entry.engine_missing)
    if python and not entry.takes_hosts:
        check_python(python, which)


def check_python(python: str, which: Callable[[str], str | None] = shutil.which) -> None:
    path = python if os.sep in python else which(python)
    if not path or not os.path.exists(path):
        raise LaunchError(f"--python {python}: " + ("no such file" if os.sep in python else "not found on PATH"))
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise LaunchError(f"--python {python}: not an executable file")


def prepared_log_dir(log_dir: str | None, run_id: str) -> str:
    """The run's log folder, checked before anything starts: an explicit one
    must be usable or creatable; the default one's base must be private."""
    if log_dir:
        log_dir = os.path.abspath(log_dir)
        logfiles.check_log_dir(log_dir)
        return log_dir
    base, why = logfiles.private_base()
    if why:
        print(why, file=sys.stderr, flush=True)
    return os.path.join(base, run_id)


def default_log_dir(run_id: str) -> str:
    """RUN_ID's folder in the user's private base, ``$TMPDIR/jaxrun-logs-UID``.
    (Not "$TMPDIR/jaxrun...": a folder of that name in the working directory
    would shadow the package for "python -m jaxrun" in an editable install.)"""
    return os.path.join(logfiles.default_base(), run_id)


def new_run_id() -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{os.urandom(3).hex()}"
