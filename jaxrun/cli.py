"""The ``jaxrun`` command line.  Parsing and validation only: it builds a
``RunConfig``, and ``jaxrun.launcher.run.run`` does the work with the backend
the factory picks from it."""

from __future__ import annotations

import datetime
import math
import os
import re
import resource
import shutil
import sys

import click

from jaxrun import __version__, contract, meshspec
from jaxrun.core import logfiles
from jaxrun.core.config import LAUNCHERS, SCHEDULERS, LaunchError, RunConfig, SchedulerOptions, SshOptions
from jaxrun.core.ranks import DIGITS, RankList, console_rank_set
from jaxrun.launcher import plan as planning
from jaxrun.launcher.run import run
from jaxrun.reporting import github

# The longest wait any option may ask for (about 31 years).  Beyond it the
# event loop's waits overflow (threading.TIMEOUT_MAX is about 292 years).
MAX_SECONDS = 1e9
# The most accelerators one process may own when jaxrun cannot count them
# (remote hosts, TPUs): more than any one host has.
MAX_DEVICES_PER_PROCESS = 256
# File descriptors jaxrun itself holds for each process while it runs, by how
# the processes start: locally, the two log files it follows for the console
# (each child writes its own); over SSH, the ssh session's three pipes and the
# two log files it pumps into; under a scheduler, the two pipes (both ends),
# the task's three sockets and the two log files.
FDS_PER_PROCESS = {"local": 2, "ssh": 5, "scheduler": 9}
# And for itself: standard streams, the lifeline pipe, the pump's selector and
# inotify, the fork server's socket, a process being started.
FDS_RESERVED = 64


class Seconds(click.FloatRange):
    """A finite number of seconds.  FloatRange takes "nan" and "inf": every
    comparison with nan is false, so a nan deadline never fires and the loop
    spins, and an infinite one overflows the first wait."""

    name = "SECONDS"

    def convert(self, value, param, ctx):
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds) or seconds > MAX_SECONDS:
            self.fail(f"{value!r} is not a finite number of seconds up to {MAX_SECONDS:.0f}", param, ctx)
        return seconds


class OptionalCount(click.Option):
    """An option whose count may be left out: ``--flight-recorder`` or
    ``--flight-recorder 128``.  Click would take the script that follows a
    bare option for its count; this one takes the next word only when it is
    a whole number, and otherwise gives it back to the command line."""

    def add_to_parser(self, parser, ctx) -> None:
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            parsed = getattr(parser, "_long_opt", {}).get(name)
            if parsed is not None:
                parsed.process = self._giving_back(parsed.process)

    def _giving_back(self, process):
        def process_count(value, state):
            if isinstance(value, str) and not DIGITS.match(value):
                state.rargs.insert(0, value)
                value = str(self.flag_value)
            process(value, state)

        return process_count


class HostPort(click.ParamType):
    name = "HOST:PORT"

    def convert(self, value, param, ctx):
        host, sep, port = str(value).rpartition(":")
        if not sep or not host or not DIGITS.match(port) or not 0 < int(port) < 65536:
            self.fail(f"{value!r} is not HOST:PORT with a port between 1 and 65535", param, ctx)
        return f"{host}:{int(port)}"


class KeyValue(click.ParamType):
    name = "KEY=VALUE"

    def convert(self, value, param, ctx):
        try:
            return contract.parse_env_pair(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


class MeshSpecType(click.ParamType):
    """Checks --mesh syntax at parse time; the device count is checked in the children."""

    name = "SPEC"

    def convert(self, value, param, ctx):
        try:
            spec = meshspec.parse(str(value))
        except meshspec.MeshSpecError as e:
            self.fail(str(e), param, ctx)
        # Children parse the text again; pass it on normalized.
        return str(spec)


def default_log_dir(run_id: str) -> str:
    """RUN_ID's folder in the user's private base, ``$TMPDIR/jaxrun-logs-UID``.
    (Not "$TMPDIR/jaxrun...": a folder of that name in the working directory
    would shadow the package for "python -m jaxrun" in an editable install.)"""
    return os.path.join(logfiles.default_base(), run_id)


def new_run_id() -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{os.urandom(3).hex()}"


CONTEXT = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
}


# --help shows the options in these sections, in this order; an option not
# listed lands in the last one.  (Only the listing: parsing is click's.)
HELP_SECTIONS = {
    "Processes": ("num_processes", "cpu_devices", "devices_per_process", "coordinator", "env_pairs", "exports",
                  "python", "preload", "preload_modules"),
    "Output": ("log_dir", "output", "console_ranks", "timestamps", "report_path", "junit_path", "verbose"),
    "Failures": ("timeout", "grace", "max_restarts", "flight_recorder", "check_divergence"),
    "Across hosts (SSH)": ("hosts_file", "host_opts", "ssh_config", "ssh_options", "connect_timeout", "chdir",
                           "sync"),
    "Engines (Slurm, Open MPI)": ("launcher", "nodes", "tasks_per_node", "scheduler_args"),
    "Runtime": ("mesh", "mesh_axis_types"),
    "Other": (),
}


class SectionedCommand(click.Command):
    """The one command, with --help in sections and close matches suggested
    for a mistyped option (which, since unknown options pass through to the
    script, click never sees)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, list] = {title: [] for title in HELP_SECTIONS}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            title = next((t for t, names in HELP_SECTIONS.items() if param.name in names), "Other")
            rows[title].append(record)
        for title, records in rows.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)

    def option_names(self) -> list[str]:
        return [name for param in self.params if isinstance(param, click.Option)
                for name in (*param.opts, *param.secondary_opts) if name.startswith("--")]


def no_such_option(word: str) -> click.UsageError:
    import difflib

    given = word.split("=", 1)[0]
    close = difflib.get_close_matches(given, main.option_names(), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return click.UsageError(f"no such option: {given}{hint}")


@click.command(cls=SectionedCommand, context_settings=CONTEXT)
@click.option("-n", "--num-processes", type=click.IntRange(min=1), help="Number of controllers (default: 1, or every host slot).")
@click.option("--cpu-devices", type=click.IntRange(min=1), metavar="D", help="Simulate D CPU devices per process (JAX_PLATFORMS=cpu).")
@click.option("--devices-per-process", type=click.IntRange(min=1), metavar="K", help="GPU/TPU hosts: each local process owns K devices (default: split each host's devices evenly).")
@click.option("--coordinator", type=HostPort(), help="Coordinator address (default: a free loopback port; over SSH, a free port on the first host).")
@click.option("--log-dir", type=click.Path(file_okay=False), help="Folder for per-process logs (default: $TMPDIR/jaxrun-logs-UID/RUN_ID).")
@click.option("--output", type=click.Choice(["stream", "grouped"]), help="Live, rank-prefixed lines, or one block per process at the end (default: stream; grouped on GitHub Actions).")
@click.option("--console-ranks", type=RankList(), metavar="RANKS", help="Show only these processes' output on the console, e.g. 0 or 0,2-3, or none (default: all; the logs always hold everything).")
@click.option("--timeout", type=Seconds(min=0, min_open=True), metavar="SECONDS", help="Dump every stack and stop the job after this long (exit 124).")
@click.option("--flight-recorder", "flight_recorder", cls=OptionalCount, type=click.IntRange(1, contract.FLIGHT_RECORDER_MAX), is_flag=False, flag_value=contract.FLIGHT_RECORDER_DEFAULT, default=None, metavar="[K]", help=f"Each process keeps its last K program executions (default {contract.FLIGHT_RECORDER_DEFAULT}) and writes them to its log with every stack dump; the summary lines them up.")
@click.option("--check-divergence", is_flag=True, help="Debug mode: before each program that spans processes, the processes agree on it; the first that differs stops the job and names the call (one key-value round trip per execution).")
@click.option("--grace", type=Seconds(min=0), default=30.0, show_default=True, metavar="SECONDS", help="After forwarding SIGINT/SIGTERM/SIGHUP, wait this long before SIGKILL.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True, help="Restart the whole job this many times after a failure.")
@click.option("--timestamps", is_flag=True, help="Start each console line with the wall-clock time it arrived (the logs stay byte-exact).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), metavar="FILE.json", help="Write a JSON run report.")
@click.option("--junit-xml", "junit_path", type=click.Path(dir_okay=False), metavar="FILE.xml", help="Write a JUnit XML report: one testcase per process.")
@click.option("--mesh", type=MeshSpecType(), help="Build a global mesh in every process, e.g. i=4,j=2 or data=-1.")
@click.option("--mesh-axis-types", type=click.Choice(meshspec.AXIS_TYPES), help="Axis type of every mesh axis.")
@click.option("--env", "env_pairs", type=KeyValue(), multiple=True, help="Set KEY=VALUE in every process (repeatable).")
@click.option("--preload/--no-preload", "preload", default=None, help=f"Fork local controllers from one process that already imported jax (default on; {contract.NO_PRELOAD}=1 turns it off).")
@click.option("--preload-module", "preload_modules", multiple=True, metavar="MOD", help="Also import MOD in the preloading process (repeatable).")
@click.option("-x", "--export", "exports", multiple=True, metavar="KEY", help="Forward this variable's local value to every process (repeatable).")
@click.option("--hosts", "hosts_file", type=click.Path(exists=True, dir_okay=False), metavar="FILE", help="Run over SSH on the hosts in FILE: one '[user@]host[:sshport] [slots=N]' per line.")
@click.option("-H", "--host", "host_opts", multiple=True, metavar="HOST[:SLOTS]", help="Run over SSH on HOST (repeatable or comma-separated).")
@click.option("--ssh-config", type=click.Path(exists=True, dir_okay=False), metavar="FILE", help="ssh client configuration file (ssh -F).")
@click.option("--ssh-option", "ssh_options", multiple=True, metavar="OPT", help="Extra ssh -o option, e.g. Port=2222 (repeatable).")
@click.option("--connect-timeout", type=Seconds(min=1), default=10.0, show_default=True, metavar="SECONDS", help="ssh connect timeout per host.")
@click.option("--python", "python", metavar="PATH", help="Python interpreter for every process, here or on the hosts (default: this one's path).")
@click.option("--chdir", metavar="DIR", help="Working directory on the hosts (default: the current one).")
@click.option("--sync", is_flag=True, help="Copy the working directory (--chdir) to the same path on every host first (rsync, else tar; .git and git-ignored files stay behind).")
@click.option("--launcher", type=click.Choice(LAUNCHERS), help="How to start the controllers (default: local, or ssh when hosts are given).")
@click.option("--nodes", type=click.IntRange(min=1), help="slurm: spread the processes over this many nodes (srun -N).")
@click.option("--ntasks-per-node", "tasks_per_node", type=click.IntRange(min=1), help="slurm/mpirun: processes per node.")
@click.option("--scheduler-arg", "scheduler_args", multiple=True, metavar="ARG", help="Pass ARG to srun or mpirun unchanged (repeatable), e.g. --scheduler-arg=--overcommit.")
@click.option("--dry-run", is_flag=True, help="Print each process's command and environment, then exit.")
@click.option("-v", "--verbose", is_flag=True, help="Show JAX's noise lines and the startup preflight table.")
@click.version_option(__version__, "--version", prog_name="jaxrun")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(num_processes, cpu_devices, devices_per_process, coordinator, log_dir, output, console_ranks, timeout, grace, max_restarts,
         report_path, junit_path, mesh, mesh_axis_types, env_pairs, exports, hosts_file, host_opts, ssh_config,
         ssh_options, connect_timeout, python, chdir, preload, preload_modules,
         launcher, nodes, tasks_per_node, scheduler_args, dry_run, verbose, args, sync=False, timestamps=False,
         flight_recorder=None, check_divergence=False):
    """Start N JAX controllers that join one distributed job.

    \b
      jaxrun -n 4 --cpu-devices 2 toy.py          4 local controllers
      jaxrun -n 2 -m mypkg.train --lr 3e-4        a module, like python -m
      jaxrun --hosts hosts.txt train.py           over SSH, one process per slot
      jaxrun k8s --image IMG -n 4 train.py        print a Kubernetes JobSet manifest instead

    Everything after SCRIPT (or -m MODULE) is passed to it untouched.  The
    placeholders {process_id}, {num_processes}, {local_process_id} and
    {coordinator} in those arguments are replaced in each process.
    """
    target = parse_target(args)
    if cpu_devices is not None and devices_per_process is not None:
        raise click.UsageError("--cpu-devices and --devices-per-process cannot be used together")
    hosts = read_hosts(hosts_file, host_opts)
    if sync and not hosts:
        raise click.UsageError("--sync copies the working directory to SSH hosts: it needs --hosts or -H")
    if sync and not os.path.isdir(chdir or os.getcwd()):
        raise click.UsageError(f"--sync: {chdir} is not a folder here, so there is nothing to copy")
    scheduler = scheduler_options(launcher, bool(hosts), nodes, tasks_per_node, scheduler_args)
    if hosts:
        from jaxrun.launcher.hosts import total_slots

        num_processes = num_processes or total_slots(hosts)
    if scheduler and not num_processes and scheduler.launcher == "slurm" and DIGITS.match(os.environ.get("SLURM_NTASKS", "")):
        num_processes = int(os.environ["SLURM_NTASKS"])  # inside sbatch/salloc: the allocation's task count
    num_processes = num_processes or 1
    check_scale(num_processes, "ssh" if hosts else "scheduler" if scheduler else "local")
    if hosts:
        planning.assign_hosts(hosts, num_processes)  # too few slots: exit 2 before any ssh
    console_ranks = console_rank_set(console_ranks, num_processes)
    check_devices_per_process(devices_per_process)  # before counting GPUs, which may run nvidia-smi
    devices_per_host = local_device_count(cpu_devices, devices_per_process, num_processes, hosts or scheduler)
    check_devices_per_process(devices_per_process, devices_per_host)
    github_actions = github.on_github_actions()
    run_id = new_run_id()
    if not dry_run:
        check_engine(scheduler, bool(hosts), python)
        for option, path in (("--report", report_path), ("--junit-xml", junit_path)):
            if path:
                logfiles.check_writable_file(option, path)
        log_dir = prepared_log_dir(log_dir, run_id)  # last: it may create the private base folder
    python = python or sys.executable
    options = planning.LaunchOptions(
        target=target,
        num_processes=num_processes,
        coordinator="",
        run_id=run_id,
        cpu_devices=cpu_devices,
        hosts=tuple(hosts) if hosts else (planning.LOCAL_HOST,),
        python=python,
        extra_env=exported_env(exports, env_pairs),
        mesh=mesh,
        mesh_axis_types=mesh_axis_types,
        verbose=verbose,
        devices_per_process=devices_per_process,
        devices_per_host=devices_per_host,
        scheduled=scheduler is not None,
        flight_recorder=flight_recorder,
        check_divergence=check_divergence,
    )
    config = RunConfig(
        options=options,
        log_dir=log_dir or default_log_dir(run_id),
        output=output or ("grouped" if github_actions else "stream"),
        console_ranks=console_ranks,
        grace=grace,
        timeout=timeout,
        max_restarts=max_restarts,
        report_path=report_path,
        dry_run=dry_run,
        verbose=verbose,
        fixed_coordinator=coordinator,
        junit_path=junit_path,
        timestamps=timestamps,
        github_actions=github_actions,
        preload=preload if preload is not None else os.environ.get(contract.NO_PRELOAD, "") in ("", "0"),
        preload_modules=preload_modules,
        scheduler=scheduler,
        ssh=SshOptions(
            python=python,
            chdir=chdir or os.getcwd(),
            config_file=ssh_config,
            options=tuple(ssh_options),
            connect_timeout=connect_timeout,
            env=options.extra_env,
            script=None if target.is_module else target.name,
            sync=sync,
        ) if hosts else None,
    )
    sys.exit(run(config))


def prepared_log_dir(log_dir: str | None, run_id: str) -> str:
    """The run's log folder, checked before anything starts: an explicit one
    must be usable or creatable; the default one's base must be private."""
    if log_dir:
        log_dir = os.path.abspath(log_dir)
        logfiles.check_log_dir(log_dir)
        return log_dir
    logfiles.ensure_private_base(logfiles.default_base())
    return default_log_dir(run_id)


def check_scale(num_processes: int, kind: str) -> None:
    """Refuse a job this machine cannot hold, naming the limit, before a plan
    of that size is even built.  When the soft open-file limit is too low for
    it, raise it to the hard one, as other launchers do (the processes inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    problem = scale_problem(num_processes, kind, hard, read_pid_max())
    if problem:
        raise LaunchError(problem)
    if soft != resource.RLIM_INFINITY and fds_needed(num_processes, kind) > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # an unlimited hard limit the kernel will not grant: carry on with the soft one


def fds_needed(num_processes: int, kind: str) -> int:
    return FDS_RESERVED + FDS_PER_PROCESS[kind] * num_processes


def scale_problem(num_processes: int, kind: str, nofile_hard: int, pid_max: int) -> str | None:
    """Why ``num_processes`` processes started ``kind``-wise do not fit here, or None."""
    need = fds_needed(num_processes, kind)
    if nofile_hard != resource.RLIM_INFINITY and need > nofile_hard:
        most = max(0, (nofile_hard - FDS_RESERVED) // FDS_PER_PROCESS[kind])
        return (f"-n {num_processes}: jaxrun needs about {need} open files for that many processes "
                f"({FDS_PER_PROCESS[kind]} each, {kind} run), but the open-file limit is {nofile_hard} "
                f"(ulimit -Hn); at most {most} processes")
    if num_processes > pid_max // 2:  # each process, and jaxrun's thread waiting for it, takes a pid here
        return (f"-n {num_processes}: this machine numbers at most {pid_max} processes and threads "
                f"(kernel.pid_max), and jaxrun needs two for each process; at most {pid_max // 2} processes")
    return None


def read_pid_max() -> int:
    from jaxrun import portable

    return portable.pid_max()


def check_devices_per_process(per_process: int | None, local_gpus: int | None = None) -> None:
    """Bound --devices-per-process by what exists: MAX_DEVICES_PER_PROCESS,
    and this machine's GPUs when jaxrun counted them.  (Each process gets the
    list of its device ids in its environment.)"""
    if per_process is None:
        return
    if per_process > MAX_DEVICES_PER_PROCESS:
        raise click.UsageError(f"--devices-per-process {per_process}: at most {MAX_DEVICES_PER_PROCESS} devices "
                               f"per process (no host has more)")
    if local_gpus is not None and per_process > local_gpus:
        raise click.UsageError(f"--devices-per-process {per_process}: this machine has {local_gpus} GPUs")


def check_engine(scheduler: SchedulerOptions | None, has_hosts: bool, python: str | None) -> None:
    """The programs a run starts must exist here: srun or mpirun, ssh, and the
    --python of a local or scheduler run.  (Over SSH the preflight checks the
    hosts' python.)"""
    if scheduler and not shutil.which(scheduler.command):
        raise LaunchError(f"--launcher {scheduler.launcher}: {scheduler.command} is not on PATH")
    if has_hosts and not shutil.which("ssh"):
        raise LaunchError("--hosts/-H: ssh (the OpenSSH client) is not on PATH")
    if python and not has_hosts:
        check_python(python)


def check_python(python: str) -> None:
    path = python if os.sep in python else shutil.which(python)
    if not path or not os.path.exists(path):
        raise LaunchError(f"--python {python}: " + ("no such file" if os.sep in python else "not found on PATH"))
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise LaunchError(f"--python {python}: not an executable file")


def local_device_count(cpu_devices, devices_per_process, num_processes: int, elsewhere) -> int | None:
    """This machine's GPUs, only when the plan needs them: to split them among
    several local processes, or to check --devices-per-process against them.
    (nvidia-smi is not free, and a single process simply owns every device.)
    Remote hosts may differ from this one; there only --devices-per-process applies."""
    if cpu_devices is not None or elsewhere:
        return None
    if num_processes == 1 and devices_per_process is None:
        return None
    from jaxrun.launcher.devices import count_local_gpus

    return count_local_gpus()


def read_hosts(hosts_file: str | None, host_opts: tuple[str, ...]) -> list[planning.Host]:
    """Hosts from --hosts or -H; an empty list means a local run."""
    if not hosts_file and not host_opts:
        return []
    from jaxrun.launcher import hosts as hostfile

    if hosts_file and host_opts:
        raise click.UsageError("--hosts and -H cannot be used together")
    try:
        if hosts_file:
            return hostfile.parse_hosts_file(read_hosts_text(hosts_file), hosts_file)
        return hostfile.merge_host_options(host_opts)
    except hostfile.HostsError as e:
        raise LaunchError(str(e)) from None


# A hosts file lists hosts; more than this is not one (--hosts /dev/zero).
MAX_HOSTS_FILE = 1 << 20


def read_hosts_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_HOSTS_FILE + 1)
        if len(data) > MAX_HOSTS_FILE:
            raise LaunchError(f"{path}: more than {MAX_HOSTS_FILE >> 20} MiB; is it a hosts file?")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchError(f"{path}: cannot read it ({e})") from None


def exported_env(exports: tuple[str, ...], env_pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """-x KEY takes the local value; --env KEY=VALUE wins over it."""
    env = {}
    for key in exports:
        if key not in os.environ:
            raise click.UsageError(f"-x {key}: {key} is not set here")
        env[key] = os.environ[key]
    env.update(env_pairs)
    return env


def scheduler_options(launcher, has_hosts, nodes, tasks_per_node, scheduler_args) -> SchedulerOptions | None:
    if launcher == "ssh" and not has_hosts:
        raise click.UsageError("--launcher ssh needs --hosts FILE or -H HOST")
    if has_hosts and launcher in ("local", *SCHEDULERS):
        raise click.UsageError(f"--hosts and -H start processes over SSH; they do not work with --launcher {launcher}")
    if launcher not in SCHEDULERS:
        if nodes or tasks_per_node or scheduler_args:
            raise click.UsageError("--nodes, --ntasks-per-node and --scheduler-arg need --launcher slurm or mpirun")
        return None
    if launcher == "mpirun" and nodes:
        raise click.UsageError("--nodes works with --launcher slurm only; give mpirun its hosts with --scheduler-arg")
    return SchedulerOptions(launcher, nodes, tasks_per_node, tuple(scheduler_args))


def parse_target(args: tuple[str, ...]) -> planning.Target:
    if not args:
        raise click.UsageError("missing SCRIPT (or -m MODULE)")
    if args[0] == "-m":
        if len(args) < 2:
            raise click.UsageError("-m needs a MODULE")
        return planning.Target(args[1], tuple(args[2:]), is_module=True)
    if args[0].startswith("-"):
        raise no_such_option(args[0])
    script = args[0]
    if not os.path.isfile(script):
        raise click.UsageError(f"script not found: {script}")
    return planning.Target(script, tuple(args[1:]))


def entry_point(argv: list[str] | None = None) -> None:
    """Console-script entry: click's errors become one line and exit 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command, prog = main, "jaxrun"
    if argv[:1] == ["k8s"]:  # a subcommand without making `jaxrun SCRIPT` a click group
        from jaxrun import k8s

        command, prog, argv = k8s.command, "jaxrun k8s", argv[1:]
    elif argv[:1] == ["logs"] and not os.path.isfile("logs"):  # a script named "logs" still runs
        from jaxrun.launcher import logs

        command, prog, argv = logs.command, "jaxrun logs", argv[1:]
    try:
        command.main(args=argv, prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        print(f"jaxrun: error: {e.format_message()}", file=sys.stderr)
        sys.exit(2)
    except (LaunchError, planning.PlanError) as e:
        print(f"jaxrun: error: {e}", file=sys.stderr)
        sys.exit(2)
    except click.Abort:
        sys.exit(130)
