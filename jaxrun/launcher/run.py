"""The programmatic entry point: run a planned job, with restarts, and report."""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from typing import TextIO

from jaxrun.backends import create_backend
from jaxrun.backends.base import Backend
from jaxrun.launcher import plan as planning
from jaxrun.launcher.config import RunConfig
from jaxrun.launcher.console import ConsolePrinter
from jaxrun.launcher.outcome import Outcome, StopReason
from jaxrun.launcher.supervisor import Supervisor, install_signal_handlers, restore_signal_handlers
from jaxrun.reporting import github, report, summary


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


def plan_attempt(config: RunConfig, coordinator: tuple[str, str | None], attempt: int):
    address, bind = coordinator
    opts = dataclasses.replace(config.options, coordinator=address, bind_address=bind, restart_count=attempt)
    return opts, planning.plan(opts)


def run(config: RunConfig, backend: Backend | None = None, console: TextIO | None = None) -> int:
    console = console or sys.stderr
    backend = backend or create_backend(config, console)
    if config.dry_run:
        _, specs = plan_attempt(config, backend.dry_run_coordinator(config.fixed_coordinator), 0)
        print(dry_run_text(specs))
        return 0
    outcomes: list[Outcome] = []
    dirs: list[str] = []
    with backend:
        for attempt in range(config.max_restarts + 1):
            opts, specs = plan_attempt(config, backend.choose_coordinator(config.fixed_coordinator), attempt)
            log_dir = attempt_dir(config.log_dir, attempt)
            outcome = run_attempt(config, specs, backend, log_dir, console)
            outcomes.append(outcome)
            dirs.append(log_dir)
            report_attempt(config, outcomes, dirs, opts, console)
            if outcome.reason is not StopReason.FAILURE or attempt == config.max_restarts:
                break
            print(f"jaxrun: restarting the whole job (restart {attempt + 1} of {config.max_restarts})", file=console)
    return outcomes[-1].exit_code


def report_attempt(config: RunConfig, outcomes: list[Outcome], dirs: list[str], opts: planning.LaunchOptions,
                   console: TextIO) -> None:
    outcome = outcomes[-1]
    for line in summary.summary_lines(outcome, dirs[-1]):
        print(line, file=console, flush=True)
    if config.github_actions:
        annotation = github.error_annotation(outcome, os.environ.get("GITHUB_WORKSPACE"))
        if annotation:
            print(annotation, file=console, flush=True)
    if config.report_path:
        report.write_report(config.report_path, report.report_dict(outcomes, opts.run_id, dirs))
    if config.junit_path:
        from jaxrun.reporting import junit

        junit.write(config.junit_path, outcome, suite=f"jaxrun {opts.target.name}")


def run_attempt(config: RunConfig, specs, backend: Backend, log_dir: str, console: TextIO) -> Outcome:
    github_options = github.printer_options() if config.github_actions else {}
    printer = ConsolePrinter(config.output, show_noise=config.verbose, ranks=config.console_ranks, **github_options)
    backend.begin(specs, log_dir)
    try:
        supervisor = Supervisor(specs, backend, printer, log_dir, grace=config.grace, timeout=config.timeout)
        previous = install_signal_handlers(supervisor)
        try:
            outcome = supervisor.run()
        finally:
            restore_signal_handlers(previous)
    finally:
        backend.end()
    for rec in outcome.records:
        printer.grouped(rec.spec.rank, rec.stdout_log, rec.stderr_log)
    return outcome
