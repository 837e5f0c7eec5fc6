"""The ``jaxrun`` command line.  Parsing and validation only; ``launch.run`` does the work."""

from __future__ import annotations

import datetime
import os
import secrets
import sys
import tempfile

import click

from jaxrun import __version__, engines, meshspec
from jaxrun import plan as planning
from jaxrun.launch import LaunchError, RunConfig, run


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
        key, sep, val = str(value).partition("=")
        if not sep or not key.isidentifier():
            self.fail(f"{value!r} is not KEY=VALUE", param, ctx)
        return key, val


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
    return os.path.join(tempfile.gettempdir(), "jaxrun", run_id)


def new_run_id() -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


CONTEXT = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
}


@click.command(context_settings=CONTEXT)
@click.option("-n", "--num-processes", type=click.IntRange(min=1), help="Number of controllers (default: 1, or every host slot).")
@click.option("--cpu-devices", type=click.IntRange(min=1), metavar="D", help="Simulate D CPU devices per process (JAX_PLATFORMS=cpu).")
@click.option("--coordinator", type=HostPort(), help="Coordinator address (default: a free loopback port).")
@click.option("--log-dir", type=click.Path(file_okay=False), help="Folder for per-process logs (default: $TMPDIR/jaxrun/RUN_ID).")
@click.option("--output", type=click.Choice(["stream", "grouped"]), default="stream", show_default=True, help="Live, rank-prefixed lines, or one block per process at the end.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS", help="Dump every stack and stop the job after this long (exit 124).")
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True, metavar="SECONDS", help="After forwarding SIGINT/SIGTERM/SIGHUP, wait this long before SIGKILL.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True, help="Restart the whole job this many times after a failure.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), metavar="FILE.json", help="Write a JSON run report.")
@click.option("--mesh", type=MeshSpecType(), help="Build a global mesh in every process, e.g. i=4,j=2 or data=-1.")
@click.option("--mesh-axis-types", type=click.Choice(meshspec.AXIS_TYPES), help="Axis type of every mesh axis.")
@click.option("--env", "env_pairs", type=KeyValue(), multiple=True, help="Set KEY=VALUE in every process (repeatable).")
@click.option("--preload/--no-preload", "preload", default=None, help="Fork local controllers from one process that already imported jax (default on; JAXRUN_NO_PRELOAD=1 turns it off).")
@click.option("--preload-module", "preload_modules", multiple=True, metavar="MOD", help="Also import MOD in the preloading process (repeatable).")
@click.option("--launcher", type=click.Choice(["local", "ssh", *engines.ENGINES]), help="How to start the controllers (default: local, or ssh when hosts are given).")
@click.option("--nodes", type=click.IntRange(min=1), help="slurm: spread the processes over this many nodes (srun -N).")
@click.option("--ntasks-per-node", "tasks_per_node", type=click.IntRange(min=1), help="slurm/mpirun: processes per node.")
@click.option("--scheduler-arg", "scheduler_args", multiple=True, metavar="ARG", help="Pass ARG to srun or mpirun unchanged (repeatable), e.g. --scheduler-arg=--overcommit.")
@click.option("--dry-run", is_flag=True, help="Print each process's command and environment, then exit.")
@click.option("-v", "--verbose", is_flag=True, help="Show JAX's noise lines and the startup preflight table.")
@click.version_option(__version__, "--version", prog_name="jaxrun")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(num_processes, cpu_devices, coordinator, log_dir, output, timeout, grace, max_restarts,
         report_path, mesh, mesh_axis_types, env_pairs, preload, preload_modules,
         launcher, nodes, tasks_per_node, scheduler_args, dry_run, verbose, args):
    """Start N JAX controllers that join one distributed job.

    \b
      jaxrun -n 4 --cpu-devices 2 toy.py          4 local controllers
      jaxrun -n 2 -m mypkg.train --lr 3e-4        a module, like python -m

    Everything after SCRIPT (or -m MODULE) is passed to it untouched.  The
    placeholders {process_id}, {num_processes}, {local_process_id} and
    {coordinator} in those arguments are replaced in each process.
    """
    target = parse_target(args)
    run_id = new_run_id()
    engine = engine_options(launcher, nodes, tasks_per_node, scheduler_args)
    if engine and not num_processes and engine.kind == "slurm" and os.environ.get("SLURM_NTASKS", "").isdigit():
        num_processes = int(os.environ["SLURM_NTASKS"])  # inside sbatch/salloc: the allocation's task count
    options = planning.LaunchOptions(
        target=target,
        num_processes=num_processes or 1,
        coordinator="",
        run_id=run_id,
        cpu_devices=cpu_devices,
        extra_env=dict(env_pairs),
        mesh=mesh,
        mesh_axis_types=mesh_axis_types,
        verbose=verbose,
    )
    config = RunConfig(
        options=options,
        log_dir=os.path.abspath(log_dir) if log_dir else default_log_dir(run_id),
        output=output,
        grace=grace,
        timeout=timeout,
        max_restarts=max_restarts,
        report_path=report_path,
        dry_run=dry_run,
        verbose=verbose,
        fixed_coordinator=coordinator,
        preload=preload if preload is not None else os.environ.get("JAXRUN_NO_PRELOAD", "") in ("", "0"),
        preload_modules=preload_modules,
        engine=engine,
    )
    sys.exit(run(config))


def engine_options(launcher, nodes, tasks_per_node, scheduler_args) -> engines.EngineOptions | None:
    if launcher not in engines.ENGINES:
        if nodes or tasks_per_node or scheduler_args:
            raise click.UsageError("--nodes, --ntasks-per-node and --scheduler-arg need --launcher slurm or mpirun")
        return None
    if launcher == "mpirun" and nodes:
        raise click.UsageError("--nodes works with --launcher slurm only; give mpirun its hosts with --scheduler-arg")
    return engines.EngineOptions(launcher, nodes, tasks_per_node, tuple(scheduler_args))


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
