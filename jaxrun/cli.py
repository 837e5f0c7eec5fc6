"""The ``jaxrun`` command line.  Parsing and validation only: it builds a
``RunConfig``, and ``jaxrun.launcher.run.run`` does the work with the backend
the factory picks from it."""

from __future__ import annotations

import datetime
import os
import sys
import tempfile

import click

from jaxrun import __version__, contract, meshspec
from jaxrun.launcher import plan as planning
from jaxrun.launcher.config import LAUNCHERS, SCHEDULERS, LaunchError, RunConfig, SchedulerOptions, SshOptions
from jaxrun.launcher.run import run
from jaxrun.reporting import github


class HostPort(click.ParamType):
    name = "HOST:PORT"

    def convert(self, value, param, ctx):
        host, sep, port = str(value).rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
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


class RankList(click.ParamType):
    """0 | 0,2 | 0-3,6 | all | none, checked against -n once that is known."""

    name = "RANKS"

    def convert(self, value, param, ctx):
        text = str(value).strip().lower()
        if text in ("all", "none"):
            return None if text == "all" else frozenset()
        ranks = set()
        for part in text.split(","):
            first, dash, last = part.strip().partition("-")
            if not first.isdigit() or (dash and not last.isdigit()) or (dash and int(last) < int(first)):
                self.fail(f"{value!r} is not a list of ranks like 0 or 0,2-3 (or all, or none)", param, ctx)
            ranks.update(range(int(first), int(last or first) + 1))
        return frozenset(ranks)


def default_log_dir(run_id: str) -> str:
    # Not "$TMPDIR/jaxrun": a folder of that name in the working directory
    # would shadow the package for "python -m jaxrun" in an editable install.
    return os.path.join(tempfile.gettempdir(), "jaxrun-logs", run_id)


def new_run_id() -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{os.urandom(3).hex()}"


CONTEXT = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
}


@click.command(context_settings=CONTEXT)
@click.option("-n", "--num-processes", type=click.IntRange(min=1), help="Number of controllers (default: 1, or every host slot).")
@click.option("--cpu-devices", type=click.IntRange(min=1), metavar="D", help="Simulate D CPU devices per process (JAX_PLATFORMS=cpu).")
@click.option("--devices-per-process", type=click.IntRange(min=1), metavar="K", help="GPU/TPU hosts: each local process owns K devices (default: split each host's devices evenly).")
@click.option("--coordinator", type=HostPort(), help="Coordinator address (default: a free loopback port; over SSH, a free port on the first host).")
@click.option("--log-dir", type=click.Path(file_okay=False), help="Folder for per-process logs (default: $TMPDIR/jaxrun-logs/RUN_ID).")
@click.option("--output", type=click.Choice(["stream", "grouped"]), help="Live, rank-prefixed lines, or one block per process at the end (default: stream; grouped on GitHub Actions).")
@click.option("--console-ranks", type=RankList(), metavar="RANKS", help="Show only these processes' output on the console, e.g. 0 or 0,2-3, or none (default: all; the logs always hold everything).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS", help="Dump every stack and stop the job after this long (exit 124).")
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True, metavar="SECONDS", help="After forwarding SIGINT/SIGTERM/SIGHUP, wait this long before SIGKILL.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True, help="Restart the whole job this many times after a failure.")
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
@click.option("--connect-timeout", type=click.FloatRange(min=1), default=10.0, show_default=True, metavar="SECONDS", help="ssh connect timeout per host.")
@click.option("--python", "python", metavar="PATH", help="Python interpreter for every process, here or on the hosts (default: this one's path).")
@click.option("--chdir", metavar="DIR", help="Working directory on the hosts (default: the current one).")
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
         launcher, nodes, tasks_per_node, scheduler_args, dry_run, verbose, args):
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
    if hosts:
        from jaxrun.launcher.hosts import total_slots

        num_processes = num_processes or total_slots(hosts)
        planning.assign_hosts(hosts, num_processes)  # too few slots: exit 2 before any ssh
    github_actions = github.on_github_actions()
    run_id = new_run_id()
    python = python or sys.executable
    scheduler = scheduler_options(launcher, bool(hosts), nodes, tasks_per_node, scheduler_args)
    if scheduler and not num_processes and scheduler.launcher == "slurm" and os.environ.get("SLURM_NTASKS", "").isdigit():
        num_processes = int(os.environ["SLURM_NTASKS"])  # inside sbatch/salloc: the allocation's task count
    if console_ranks and max(console_ranks) >= (num_processes or 1):
        raise click.UsageError(f"--console-ranks: there is no process {max(console_ranks)} among {num_processes or 1}")
    options = planning.LaunchOptions(
        target=target,
        num_processes=num_processes or 1,
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
        devices_per_host=local_device_count(cpu_devices, devices_per_process, num_processes or 1, hosts or scheduler),
    )
    config = RunConfig(
        options=options,
        log_dir=os.path.abspath(log_dir) if log_dir else default_log_dir(run_id),
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
        ) if hosts else None,
    )
    sys.exit(run(config))


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
            try:
                with open(hosts_file, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError) as e:
                raise LaunchError(f"{hosts_file}: cannot read it ({e})") from None
            return hostfile.parse_hosts_file(text, hosts_file)
        return hostfile.merge_host_options(host_opts)
    except hostfile.HostsError as e:
        raise LaunchError(str(e)) from None


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
        raise click.UsageError(f"no such option: {args[0]}")
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
