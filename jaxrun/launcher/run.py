"""The programmatic entry point: options in, exit status out.

Each attempt is placed, started and supervised (``launcher.attempt``), then
reported; after each, the restart policy (``launcher.restarts.policy``) says
whether another follows, on the same hosts or placed anew.  A mode's type
says how the attempts are driven (``DRIVERS``): a script's here, an
interactive session's under its frontend.

One ``RunControl`` spans the whole run, from opening the backend to the last
report: signals, ``--timeout`` and a dead launcher thread stop whatever stage
the run is in, and its watchdog ends a run that does not stop in time.  jaxrun
claims its orphaned descendants (``core.reaper``), and kills whatever of
them is left after each attempt.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from typing import TextIO

from jaxrun import contract, portable
from jaxrun.backends import create_backend
from jaxrun.core import logclaim, modes, reaper
from jaxrun.core.backend import Ask, Backend, Interrupted, Placement
from jaxrun.core.config import PROBE_ALONE, PROBE_JSON, LaunchError, RunConfig
from jaxrun.core.deadline import NEVER, Deadline
from jaxrun.core.outcome import BUG_REPORT, Outcome
from jaxrun.core.spec import PlanError
from jaxrun.launcher.attempt.profiling import Profiler
from jaxrun.launcher.attempt.supervisor import Supervisor
from jaxrun.launcher.channel import JobView, open_channel
from jaxrun.launcher.control import RunControl
from jaxrun.launcher.output.printer import ConsolePrinter, SafeConsole
from jaxrun.launcher.output.timeline import Timeline
from jaxrun.launcher.probe import first as probing, table as probe_table
from jaxrun.launcher.probe.verdict import ProbeVerdict
from jaxrun.launcher.restarts import elastic
from jaxrun.launcher.restarts.policy import Answer, AttemptEnd, Decision, Engine, RestartPolicy
from jaxrun.launcher.setup import hosts as hostfile, plan as planning
from jaxrun.reporting import github, goodput, history, report, summary

# An interactive session's variables for the processes, given the attempt's
# coordinator address (where process 0 finds the session).
SessionEnv = Callable[[str], dict[str, str]]


def attempt_dir(log_dir: str, attempt: int) -> str:
    """The attempt's log folder: the run's, then ``restart-N`` in it (a
    private one of a random name where another user made that first)."""
    return log_dir if attempt == 0 else contract.folder_to_use(log_dir, f"restart-{attempt}")


def dry_run_text(specs: list[planning.ProcessSpec], count_source: str = "",
                 engine: list[str] | None = None) -> str:
    """Each process's environment and command; first, as comments, what
    decided the process count (when -n did not) and the engine's command."""
    lines = [f"# {len(specs)} processes: {count_source}"] if count_source else []
    if engine:
        lines.append(f"# {engine[0]}: {shlex.join(engine)}")
    for spec in specs:
        where = "" if spec.host.name == "localhost" else f" on {spec.host.name}"
        lines.append(f"process {spec.rank}{where}:")
        for key in sorted(spec.env):
            lines.append(f"  {key}={shlex.quote(spec.env[key])}")
        lines.append("  " + shlex.join(spec.argv))
    return "\n".join(lines)


def open_coordinator_line(address: str) -> str:
    """What --coordinator costs, said once: the service has no authentication."""
    return (f"jaxrun: --coordinator {address}: the job's coordination service listens there, "
            "open to whoever can reach that address")


def plan_attempt(config: RunConfig, coordinator: tuple[str, str | None], attempt: int,
                 placement: Placement | None = None, session_env: SessionEnv | None = None):
    """The attempt's specs: the launch, with its coordinator and where the
    backend placed it (its process count and what else the plan needs)."""
    address, bind = coordinator
    changes = {} if placement is None else {"num_processes": placement.num_processes, **placement.facts}
    if session_env is not None:
        changes["extra_env"] = {**config.options.extra_env, **session_env(address)}
    opts = dataclasses.replace(config.options, coordinator=address, bind_address=bind, restart_count=attempt,
                               **changes)
    return opts, planning.plan(opts)


def run(config: RunConfig, backend: Backend | None = None, console: TextIO | None = None,
        early: object = None, began: float | None = None) -> int:
    """``early``: what ``backends.table.head_start`` began for this run's backend;
    the caller ends it afterwards, whatever happened.  ``began``: when jaxrun
    started, where the caller knows (the run's goodput counts from there)."""
    console = SafeConsole(console or sys.stderr)
    reaper.become_subreaper()  # first: where it cannot, it marks the environment the backend copies
    if config.verbose and not config.dry_run:
        for line in portable.notes():  # what this system lacks, once
            print(line, file=console, flush=True)
    backend = backend or create_backend(config, console, early)
    if config.dry_run:
        if config.probe:
            probe_config = probing.probe_config(config)  # and its own backend, as it runs (run_attempts)
            prober = backend if config.probe in PROBE_ALONE else create_backend(probe_config, console)
            print("\n".join(probe_table.plan_lines(probing.probe_hosts_of(config), probing.SIZES)))
            _, specs = plan_attempt(probe_config, prober.dry_run_coordinator(config.fixed_coordinator), 0)
            print(dry_run_text(specs, "", prober.dry_run_command(specs)))
            if config.probe in PROBE_ALONE:
                return 0
            print("# then the job:")
        _, specs = plan_attempt(config, backend.dry_run_coordinator(config.fixed_coordinator), 0)
        print(dry_run_text(specs, config.count_source, backend.dry_run_command(specs)))
        return 0
    # One running job per log folder: refused here, before anything starts (core.logclaim).
    held = logclaim.claim(config.log_dir, config.options.run_id, ["jaxrun", *sys.argv[1:]],
                          lambda line: print(line, file=sys.stderr, flush=True))
    running: list[Supervisor] = []  # the current attempt's, for the watchdog

    def emergency(why: str, code: int) -> None:
        """The watchdog's last resort, from its own thread: kill, tell, exit."""
        for supervisor in running:
            for child in supervisor.slots.children():
                child.send(signal.SIGKILL)
        backend.abort()
        reaper.kill_descendants()
        last_words(f"jaxrun: {why}; killed every process it started ({BUG_REPORT})")
        os._exit(code)

    started = time.time()
    began = min(began, started) if began is not None else started
    control = RunControl(config.grace, emergency)
    backend.hooks = control.hooks
    control.install()
    control.start_watchdog()
    # The channel that `jaxrun stacks` and `jaxrun top` reach this run through.
    view = JobView(config.options.run_id, ["jaxrun", *sys.argv[1:]], config.log_dir, config.max_restarts, running,
                   control.events.put)
    listening = open_channel(view, note=lambda line: print(line, file=console, flush=True) if config.verbose else None)
    code = 1
    try:
        drive = DRIVERS[type(config.mode)]
        code = drive(config, control,
                     lambda session_env=None: run_attempts(config, backend, control, console, running, session_env,
                                                            view, began),
                     lambda: bool(running) and running[0].joins_settled())
        return code
    except Interrupted:  # stopped while connecting, before any process started
        print(f"jaxrun: stopped during start-up: {stop_cause(control)}; no process was started",
              file=console, flush=True)
        code = control.exit_status() or 1
        return code
    except (LaunchError, PlanError):  # the caller says why, in one line, and exits with this
        code = 2
        raise
    finally:
        if listening is not None:
            listening.close()
        if held.kept():  # else a folder it made was left empty: gone again
            history.record_run(config.log_dir, ["jaxrun", *sys.argv[1:]], code, started)
        reaper.kill_descendants()  # daemons of the last attempt, and anything a backend left
        control.restore()
        control.close()
        held.release()


def drive_script(config: RunConfig, control: RunControl, attempts: Callable[..., int],
                 settled: Callable[[], bool]) -> int:
    return attempts()


def drive_session(config: RunConfig, control: RunControl, attempts: Callable[..., int],
                  settled: Callable[[], bool]) -> int:
    """The attempts in a thread, an interactive frontend here (``interactive.frontend``)."""
    from jaxrun.launcher.interactive import frontend

    return frontend.drive(config, control, attempts, settled)


# How each mode is driven: a script's attempts run here; a session's under its frontend.
DRIVERS: dict[type[modes.Mode], Callable[..., int]] = {
    modes.Script: drive_script, modes.Terminal: drive_session, modes.Jupyter: drive_session}


def run_attempts(config: RunConfig, backend: Backend, control: RunControl, console: TextIO,
                 running: list, session_env: SessionEnv | None = None, view: JobView | None = None,
                 began: float | None = None) -> int:
    """Every attempt: placed once, started, supervised, diagnosed, each
    reported as it ends; after each, the restart policy says whether another
    follows (``restarts.policy``).  jaxrun's exit status is the last
    attempt's, so the report, ``run.json`` and the exit agree.  Each attempt
    has one deadline (``--timeout``), made before it is placed.  ``began``:
    when jaxrun started, where the run's goodput counts from."""
    began = time.time() if began is None else began
    outcomes: list[Outcome] = []
    dirs: list[str] = []
    options = config.options
    hosts = tuple(hostfile.used_hosts(options.hosts, options.num_processes))
    policy = restart_policy(config, backend)
    decision = Decision(Answer.RESTART_JOB)  # the first attempt
    profiler = Profiler(config.log_dir, config.profile)  # the run's traces, attached to each attempt in turn
    first: Ask | None = None
    probed: dict[str, str] = {}
    if config.probe in PROBE_ALONE:  # `jaxrun probe`: the run's backend starts the probe's job
        with backend:
            return probe_first(config, backend, control, console, running)[1]
    if config.probe:  # before the job: a backend of the probe's own (a scheduler's step runs one target)
        probe_backend = create_backend(probing.probe_config(config), console)
        probe_backend.hooks = control.hooks
        with probe_backend:
            verdict, _ = probe_first(config, probe_backend, control, console, running)
        try:
            first, probed, line = probing.placement_after(config, verdict, hosts)
        except probing.ProbeStop as stop:
            print(f"jaxrun: {stop}", file=console, flush=True)
            return 1
        if line:
            print(line, file=console, flush=True)
    with backend, Timeline(config.log_dir) as timeline:
        while decision.answer in (Answer.RESTART_JOB, Answer.RESTART_ELASTIC):
            attempt = len(outcomes)
            log_dir = attempt_dir(config.log_dir, attempt)
            control.deadline = deadline = Deadline(config.timeout)
            began_at = time.time()
            timeline.attempt_began(attempt, log_dir, began_at)
            lost: dict[str, str] = {}
            try:
                if decision.answer is Answer.RESTART_ELASTIC:  # its own hosts and count
                    ask, lost = elastic.restart_ask(config, backend, outcomes[-1], hosts)
                else:
                    if decision.why:
                        print(f"jaxrun: {decision.why}", file=console, flush=True)
                    ask = first if first is not None and attempt == 0 else Ask(hosts, options.num_processes)
                placement = backend.place(ask)
                dropped = {**lost, **elastic.check_reasons(placement.dropped), **(probed if attempt == 0 else {})}
                hosts = placement.hosts
                record = dataclasses.replace(placement.record(), dropped=tuple(dropped.items()))
                if decision.answer is Answer.RESTART_ELASTIC:
                    print(elastic.restart_line(policy.spent, config.max_restarts, record, options.num_processes),
                          file=console, flush=True)
                _, specs = plan_attempt(config, backend.choose_coordinator(config.fixed_coordinator), attempt,
                                        placement, session_env)
                if attempt == 0 and config.fixed_coordinator:  # once, when it was found free
                    print(open_coordinator_line(config.fixed_coordinator), file=console, flush=True)
                outcome = run_attempt(config, specs, backend, log_dir, console, control, running, deadline, policy,
                                      timeline, profiler)
            except elastic.ElasticStop as stop:  # too few hosts left: the failed attempt's status ends the run
                account = goodput.of_run(began, time.time(), outcomes)  # the run ends here
                print(f"jaxrun: {stop}", file=console, flush=True)
                if goodput.worth_a_line(account) and not config.quiet:
                    print(goodput.summary_line(account), file=console, flush=True)
                timeline.goodput(account)
                if config.report_path:  # the attempts so far, and why none follows
                    report.write_report(config.report_path,
                                        {**report.report_dict(outcomes, options.run_id, dirs, str(stop), account),
                                         **probing.report_part(config.log_dir)})
                break
            except (LaunchError, PlanError, Interrupted) as error:
                if attempt == 0:
                    raise  # nothing has run: bad input (exit 2), or a stop during start-up
                outcome = start_failure(error, control)
                record = Placement(hosts, options.num_processes, lost).record()  # where it was to run
            outcome.placement, outcome.began_at = record, began_at
            timeline.attempt_ended(outcome)
            outcomes.append(outcome)
            dirs.append(log_dir)
            decision = policy.decide(attempt_end(config, outcome))
            if view is not None:  # `jaxrun top` shows the job restarting until the next attempt starts
                view.attempt_over(decision.answer in (Answer.RESTART_JOB, Answer.RESTART_ELASTIC))
            if decision.answer in (Answer.RESTART_JOB, Answer.RESTART_ELASTIC):
                timeline.restart(decision.why, elastic=decision.answer is Answer.RESTART_ELASTIC)
            stopped = decision.why if decision.answer is Answer.STOP else ""  # why no restart follows, if it says
            last = decision.answer not in (Answer.RESTART_JOB, Answer.RESTART_ELASTIC)
            report_attempt(config, outcomes, dirs, console, stopped or None, began, timeline if last else None)
    return outcomes[-1].exit_code


def probe_first(config: RunConfig, backend: Backend, control: RunControl, console: TextIO,
                running: list) -> tuple[ProbeVerdict | None, int]:
    """The probe's job, run as an attempt on ``backend`` (open, and built
    from the probe's configuration: a scheduler's step runs one target);
    its verdict (None if it gave none), kept in the run's folder and shown
    (the table on stdout for `jaxrun probe`, on the console before a
    launch), and the probe's exit status."""
    probe_config = probing.probe_config(config)
    placement = backend.place(probing.probe_ask(probe_config))
    _, specs = plan_attempt(probe_config, backend.choose_coordinator(config.fixed_coordinator), 0, placement)
    print(f"jaxrun: probe: {len(specs)} process{'' if len(specs) == 1 else 'es'} on "
          f"{', '.join(dict.fromkeys(spec.host.name for spec in specs))}", file=console, flush=True)
    outcome = run_attempt(probe_config, specs, backend, probe_config.log_dir, console, control, running)
    verdict = probing.verdict_of(outcome) if outcome.exit_code == 0 else None
    if verdict is None:
        outcome.placement = placement.record()
        report_attempt(probe_config, [outcome], [probe_config.log_dir], console)
        print("jaxrun: probe: no verdict: the probe's job failed (above)", file=console, flush=True)
        return None, outcome.exit_code or 1
    probing.keep(config.log_dir, verdict)
    if config.probe == PROBE_JSON:
        print(json.dumps(probe_table.as_dict(verdict), indent=1), flush=True)
    else:
        lines = probe_table.table_lines(verdict)
        print("\n".join(lines if config.probe in PROBE_ALONE else [f"jaxrun: probe: {line}" for line in lines]),
              file=sys.stdout if config.probe in PROBE_ALONE else console, flush=True)
    return verdict, verdict.exit_code


def restart_policy(config: RunConfig, backend: Backend) -> RestartPolicy:
    """The run's one policy: its budget, what the engine can restart, the job's mode."""
    engine = Engine(backend.title or backend.name, backend.starts_one_again, elastic=bool(config.min_hosts))
    return RestartPolicy(config.max_restarts, engine, config.options.recoverable)


def attempt_end(config: RunConfig, outcome: Outcome) -> AttemptEnd:
    """The attempt's end as the policy reads it; the logs are read here, once."""
    from jaxrun.reporting import diagnosis

    found = diagnosis.attach(outcome, outputs=bool(config.junit_path))  # as report_attempt attaches it
    failure = found.root.failure if found.root else None
    finished = found.root.where if outcome.work_finished and found.root else None
    return AttemptEnd(outcome.reason, diagnosis.attempt_fingerprint(found), failure, outcome.ran_out, finished)


def start_failure(error: Exception, control: RunControl) -> Outcome:
    """A restart that ended in its start-up (planning, a preflight, a
    connection, a spawn), or was stopped there: its own status is the run's."""
    if isinstance(error, Interrupted):
        return Outcome.not_started(control.exit_status() or 1, f"stopped during start-up: {stop_cause(control)}",
                                   signum=control.signum)
    return Outcome.not_started(2, str(error))


def stop_cause(control: RunControl) -> str:
    if control.fault:
        return f"internal error: thread {control.fault.name} died: {control.fault.error} ({BUG_REPORT})"
    return signal.Signals(control.signum).name if control.signum else "--timeout"


def last_words(line: str) -> None:
    """One line on stderr that never blocks: a stuck console must not keep
    the watchdog from exiting."""
    try:
        os.set_blocking(2, False)
        os.write(2, line.encode() + b"\n")
    except OSError:
        pass


def report_attempt(config: RunConfig, outcomes: list[Outcome], dirs: list[str], console: TextIO,
                   not_restarted: str | None = None, began: float | None = None,
                   last: Timeline | None = None) -> None:
    """``not_restarted``: why no restart follows this failed attempt, though
    --max-restarts allows one.  ``began``: when jaxrun started, for the
    run's goodput; ``last``: the run's timeline, when no attempt follows
    (the goodput line is said and drawn once, at the run's end)."""
    from jaxrun.reporting import diagnosis

    outcome = outcomes[-1]
    account = goodput.of_run(time.time() if began is None else began, time.time(), outcomes)
    shown = dirs[-1] if os.path.isdir(dirs[-1]) else config.log_dir  # a restart that never started made none
    # The logs are read here, once; every report below only formats what they said.
    diagnosis.attach(outcome, outputs=bool(config.junit_path))
    # The run's goodput, once at its end, after the failure, where it tells something.
    said = [goodput.summary_line(account)] if last is not None and goodput.worth_a_line(account) else []
    said += [line for line in (goodput.host_line(account),) if line and last is not None]  # input- or idle-bound
    lines = summary.summary_lines(outcome, shown, said, quiet=config.quiet)
    if last is not None:
        last.goodput(account)
    for line in lines:
        print(line, file=console, flush=True)
    if not_restarted:
        print(f"jaxrun: {not_restarted}", file=console, flush=True)
    if config.github_actions:
        annotation = github.error_annotation(outcome, os.environ.get("GITHUB_WORKSPACE"))
        if annotation:
            print(annotation, file=console, flush=True)
    if config.report_path:
        report.write_report(config.report_path,
                            {**report.report_dict(outcomes, config.options.run_id, dirs, not_restarted, account),
                             **probing.report_part(config.log_dir)})
    if config.junit_path:
        from jaxrun.reporting import junit

        junit.write(config.junit_path, outcome, suite=f"jaxrun {config.options.target.name}")


def run_attempt(config: RunConfig, specs, backend: Backend, log_dir: str, console: TextIO,
                control: RunControl | None = None, running: list | None = None,
                deadline: Deadline | None = None, policy: RestartPolicy | None = None,
                timeline: Timeline | None = None, profiler: Profiler | None = None) -> Outcome:
    github_options = github.printer_options() if config.github_actions else {}
    printer = ConsolePrinter(config.output, show_noise=config.verbose, ranks=config.console_ranks, quiet=config.quiet,
                             timestamps=config.timestamps, log_dir=log_dir, **github_options)
    control = control or RunControl(config.grace)
    running = running if running is not None else []
    before = reaper.descendants()  # what the backend holds across attempts (ssh masters)
    deadline = deadline or Deadline(config.timeout)  # one attempt, one clock: see core.deadline
    supervisor = Supervisor(specs, backend, printer, log_dir, grace=config.grace, deadline=deadline,
                            events=control.events, hooks=control.hooks, stall_timeout=config.options.stall_timeout,
                            policy=policy or restart_policy(config, backend), timeline=timeline, profiler=profiler)
    running[:] = [supervisor]
    control.deadline = deadline
    try:
        outcome = supervisor.run()
    finally:
        control.deadline = NEVER
        backend.end_attempt()
        reaper.kill_descendants(spare=before)
        if control.signum is None and control.fault is None:
            control.reset()  # a failure or --timeout ended this attempt; a restart may follow
    for life in (life for rec in outcome.records for life in rec.lives):  # a process that restarted alone: each life
        printer.grouped(life.spec.rank, life.stdout_log, life.stderr_log)
    outcome.pages = printer.pages.said()  # JAX's fatal-error pages the console left to the logs, counted
    return outcome
