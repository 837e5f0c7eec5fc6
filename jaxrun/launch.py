"""The programmatic entry point: run a planned job, with restarts, and report."""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import sys
from typing import Callable, TextIO

from jaxrun import ci, engines, report
from jaxrun import plan as planning
from jaxrun import preload
from jaxrun.output import ConsolePrinter
from jaxrun.spawn import LocalSpawner, Spawner
from jaxrun.supervisor import Outcome, StopReason, Supervisor, install_signal_handlers, restore_signal_handlers


class LaunchError(Exception):
    """Bad input found before anything started: exit 2 with this one line."""


@dataclasses.dataclass
class RunConfig:
    options: planning.LaunchOptions  # coordinator filled in per attempt
    log_dir: str
    output: str = "stream"
    console_ranks: frozenset[int] | None = None  # None: every process on the console
    grace: float = 30.0
    timeout: float | None = None
    max_restarts: int = 0
    report_path: str | None = None
    dry_run: bool = False
    verbose: bool = False
    fixed_coordinator: str | None = None  # from --coordinator
    junit_path: str | None = None
    github_actions: bool = False  # group output per process, annotate the root cause
    preload: bool = True  # fork local controllers from a server that imported jax
    preload_modules: tuple[str, ...] = ()
    engine: engines.EngineOptions | None = None  # --launcher slurm|mpirun: one scheduler step


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise LaunchError(f"--coordinator {host}:{port}: cannot listen there ({e.strerror})") from None


def local_coordinator(fixed: str | None) -> tuple[str, str]:
    """(address to connect to, address to bind) for a run on this machine only."""
    if fixed:
        host, port = fixed.rsplit(":", 1)
        check_port_free(host, int(port))
        return fixed, fixed
    port = free_port()
    return f"127.0.0.1:{port}", f"127.0.0.1:{port}"


def attempt_dir(log_dir: str, attempt: int) -> str:
    return log_dir if attempt == 0 else os.path.join(log_dir, f"restart-{attempt}")


def dry_run_text(specs: list[planning.ProcessSpec]) -> str:
    lines = []
    for spec in specs:
        where = "" if spec.host.name == "localhost" else f" on {spec.host.name}"
        lines.append(f"process {spec.rank}{where}:")
        for key in sorted(spec.env):
            lines.append(f"  {key}={shlex.quote(spec.env[key])}")
        lines.append("  " + shlex.join(spec.argv))
    return "\n".join(lines)


def run(
    config: RunConfig,
    spawner: Spawner | None = None,
    choose_coordinator: Callable[[str | None], tuple[str, str | None]] = local_coordinator,
    console: TextIO | None = None,
) -> int:
    console = console or sys.stderr
    outcomes: list[Outcome] = []
    dirs: list[str] = []
    if config.engine:
        choose_coordinator = engines.task_coordinator  # task 0 picks it on its own node
    for attempt in range(config.max_restarts + 1):
        coordinator, bind = choose_coordinator(config.fixed_coordinator)
        opts = dataclasses.replace(
            config.options, coordinator=coordinator, bind_address=bind, restart_count=attempt
        )
        specs = planning.plan(opts)
        if config.dry_run:
            print(dry_run_text(specs))
            return 0
        log_dir = attempt_dir(config.log_dir, attempt)
        outcome = run_attempt(config, specs, spawner, log_dir, console)
        outcomes.append(outcome)
        dirs.append(log_dir)
        for line in report.summary_lines(outcome, log_dir):
            print(line, file=console, flush=True)
        if config.github_actions:
            annotation = ci.error_annotation(outcome, os.environ.get("GITHUB_WORKSPACE"))
            if annotation:
                print(annotation, file=console, flush=True)
        if config.report_path:
            report.write_report(config.report_path, report.report_dict(outcomes, opts.run_id, dirs))
        if config.junit_path:
            from jaxrun import junit

            junit.write(config.junit_path, outcome, suite=f"jaxrun {opts.target.name}")
        if outcome.reason is not StopReason.FAILURE or attempt == config.max_restarts:
            return outcome.exit_code
        print(f"jaxrun: restarting the whole job (restart {attempt + 1} of {config.max_restarts})", file=console)
    return outcomes[-1].exit_code


def local_spawner(config: RunConfig, specs, console: TextIO, log_dir: str = "") -> Spawner:
    if config.engine:
        return engines.step_spawner(config.engine, config.options, specs, log_dir, console, config.fixed_coordinator)
    if not config.preload:
        return LocalSpawner()
    differing = preload.differing_import_time_vars(specs)
    if differing:
        print(f"jaxrun: not preloading jax: {', '.join(differing)} differ between processes", file=console)
        return LocalSpawner()
    return preload.PreloadSpawner(specs, config.preload_modules)


def run_attempt(config: RunConfig, specs, spawner: Spawner | None, log_dir: str, console: TextIO) -> Outcome:
    github = ci.printer_options() if config.github_actions else {}
    printer = ConsolePrinter(config.output, show_noise=config.verbose, ranks=config.console_ranks, **github)
    spawner = spawner or local_spawner(config, specs, console, log_dir)
    supervisor = Supervisor(specs, spawner, printer, log_dir, grace=config.grace, timeout=config.timeout)
    previous = install_signal_handlers(supervisor)
    try:
        outcome = supervisor.run()
    finally:
        restore_signal_handlers(previous)
        if hasattr(spawner, "close"):
            spawner.close()
    for rec in outcome.records:
        printer.grouped(rec.spec.rank, rec.stdout_log, rec.stderr_log)
    return outcome
