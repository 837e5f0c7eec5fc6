"""``--launcher slurm``: each attempt is one ``srun`` step.

Here is all that is Slurm's own: srun's command line, the step process and
how it is stopped, which nodes Slurm reports unusable, and the allocation's
nodes an elastic restart chooses from.

Stopping srun needs care, because an srun that dies by SIGKILL may leave its
job behind.  On SIGTERM or SIGINT it withdraws a pending job, or ends a
running one with its step, in about 0.2 s.  After SIGKILL a queued job stays
in the queue.  An allocation that srun made and had not yet launched its step
into stays RUNNING with nothing in it, until its time limit where
``InactiveLimit`` is 0, Slurm's default.  Measured on the suite's cluster
(tests/e2e/test_faults_channel.py): srun's process group SIGKILLed 5 to 41 ms
after its start left such a job at nearly every moment tried.  CI once had
one this way: its first task had reached jaxrun and its second was still
being launched.

So ``SrunProcess.stop`` always sends SIGTERM first, and SIGKILL only
``SRUN_WITHDRAW_WAIT`` later.  SIGTERM is not enough alone: an srun that took
it while launching its step hung there until the SIGKILL at about one moment
in 19.  So outside an allocation the job is named after the run
(``jaxrun-RUN_ID``, unless the user names it), and an srun that did not end
by itself has its job cancelled by that name.  A job that srun reported as
queued is cancelled by its id.  The stop's thread is ``step-kill``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TextIO

from jaxrun.backends.scheduler.backend import SchedulerBackend
from jaxrun.backends.scheduler.options import SlurmOptions
from jaxrun.backends.scheduler.step import Command
from jaxrun.core import spec as planning
from jaxrun.core.backend import Ask, Placement, RunHooks, start_thread
from jaxrun.core.config import LaunchError

# How long srun gets after SIGTERM to withdraw its pending job before SIGKILL.
SRUN_WITHDRAW_WAIT = 2.0
SRUN_ABORT_WAIT = 1.0  # the most abort() waits for that
SCANCEL_TIMEOUT = 10.0
# What srun prints (at its default verbosity) when its job must wait, and once it
# runs or srun itself withdrew it.
QUEUED = re.compile(rb"srun: job (\d+) queued and waiting for resources")
# Only an allocation ends the wait.  "Job allocation N has been revoked" is
# srun asking for the withdrawal, which a loaded controller may not have done
# yet: the job is still cancelled (a job gone already is no error).
ALLOCATED = re.compile(rb"srun: job (\d+) has been allocated resources")

# Node states (sinfo's %T) in which an elastic restart leaves a node of the
# allocation out; a state ending in "*" means the node does not respond.
UNUSABLE_NODE_STATES = ("down", "drain", "drained", "draining", "fail", "failing", "maint", "unknown",
                        "not_responding", "no_respond", "reboot", "power_down", "powered_down", "powering_down")
SLURM_QUERY_TIMEOUT = 30.0


def srun_command(options: SlurmOptions, num_processes: int, task: Sequence[str],
                 placement: Placement | None = None, job_name: str | None = None,
                 env: Mapping[str, str] | None = None) -> list[str]:
    """One step.  Inside an allocation (SLURM_JOB_ID set) srun uses it; outside,
    srun asks for one.  --kill-on-bad-exit ends every task once one fails,
    even if jaxrun itself cannot reach them.  An elastic restart's
    ``placement`` leaves out the nodes it dropped, and asks for no more
    nodes than it holds.  ``job_name``: the name of the job srun allocates.

    ``env``, srun's environment, which every task needs whole (jaxrun's
    variables): --export=ALL, since srun takes SLURM_EXPORT_ENV=NONE from an
    ``sbatch --export=NONE`` job and would pass the tasks none of them.  The
    allocation's SLURM_CPUS_PER_TASK goes to --cpus-per-task: srun no longer
    reads it from the environment (Slurm 22.05 on).  --scheduler-arg wins."""
    env = env or {}
    argv = ["srun", "--kill-on-bad-exit=1", f"--ntasks={num_processes}"]
    given = options.scheduler_args
    if not _gives(given, "--export"):
        argv.append("--export=ALL")
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isdigit() and not _gives(given, "--cpus-per-task", "-c"):
        argv.append(f"--cpus-per-task={cpus}")
    if job_name:
        argv.append(f"--job-name={job_name}")
    nodes = options.nodes
    if placement is not None and nodes and placement.hosts:
        nodes = min(nodes, len(placement.hosts))
    if nodes:
        argv.append(f"--nodes={nodes}")
    if placement is not None and placement.dropped:
        argv.append(f"--exclude={','.join(placement.dropped)}")
    if options.tasks_per_node:
        argv.append(f"--ntasks-per-node={options.tasks_per_node}")
    return argv + list(options.scheduler_args) + list(task)


def _gives(args: Sequence[str], long: str, short: str = "") -> bool:
    """Whether srun's own arguments (--scheduler-arg) set that option."""
    return any(a == long or a.startswith(long + "=") or (short and a.startswith(short)) for a in args)


def expand_nodelist(nodelist: str, run=subprocess.run) -> list[str]:
    """The node names of a Slurm node list (``node[1-3,7]``), by scontrol."""
    done = _slurm(["scontrol", "show", "hostnames", nodelist], run)
    return done.split()


def node_problems(names: Sequence[str], run=subprocess.run) -> dict[str, str]:
    """{node: why} for each node Slurm reports down, drained or draining,
    failing, not responding (or does not know); the others are fine."""
    lines = _slurm(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%T|%E"], run)
    states: dict[str, tuple[str, str]] = {}
    for line in lines.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        states.setdefault(name.strip(), (state.strip().lower(), reason.strip()))
    problems = {}
    for name in names:
        state, reason = states.get(name, ("unknown to sinfo", ""))
        base = state.rstrip("*~#!%$@^-+")
        if state.endswith("*") or base in UNUSABLE_NODE_STATES or name not in states:
            why = "not responding" if state.endswith("*") else base
            problems[name] = f"Slurm says {why}" + (f" ({reason})" if reason and reason != "none" else "")
    return problems


def _slurm(argv: list[str], run) -> str:
    try:
        done = run(argv, capture_output=True, text=True, timeout=SLURM_QUERY_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"{argv[0]} failed: {e}") from None
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise LaunchError(f"{' '.join(argv[:3])} exited with status {done.returncode}"
                          + (f": {said[-1]}" if said else ""))
    return done.stdout


def names_its_job(args: Sequence[str]) -> bool:
    """Whether srun's own arguments (``--scheduler-args``) name the job."""
    return any(a.startswith(("--job-name", "-J")) for a in args)


class SrunProcess(Command):
    """The srun of one step: its job may wait in Slurm's queue, or be
    allocated, and must then be withdrawn, never left (see the module
    docstring).  ``job_name``: the name its job is given and may be cancelled
    by; None where srun allocates nothing, or the user names the job."""

    program = "srun"

    def __init__(self, options: SlurmOptions, count: int, task: Sequence[str],
                 placement: Placement | None, scancel_env: Mapping[str, str], console: TextIO,
                 job_name: str | None = None):
        self.options, self.count, self.task, self.placement = options, count, list(task), placement
        self.scancel_env, self.console, self.job_name = dict(scancel_env), console, job_name
        self.queued_job: str | None = None  # the job srun said it waits for, until it runs
        self._named_cancelled = False  # the step watcher and close() both clean up: one scancel
        self._killing = False
        self._lock = threading.Lock()
        self._withdraw_lock = threading.Lock()

    def argv(self, env: Mapping[str, str]) -> list[str]:
        return srun_command(self.options, self.count, self.task, self.placement, self.job_name, env)

    def heard(self, line: bytes) -> None:
        queued = QUEUED.search(line)
        if queued:
            self.queued_job = queued.group(1).decode()
        elif ALLOCATED.search(line):
            self.queued_job = None

    def stop(self, reached: bool, hooks: RunHooks) -> None:
        """SIGTERM, on which srun withdraws or ends its job, whether or not a
        task has ``reached`` jaxrun (one may have while another is still being
        launched), and SIGKILL only ``SRUN_WITHDRAW_WAIT`` later (see the
        module docstring)."""
        self.signal(signal.SIGTERM)
        with self._lock:
            if self._killing:
                return
            self._killing = True
        start_thread("step-kill", self._kill_later, hooks=hooks)

    def _kill_later(self) -> None:
        deadline = time.monotonic() + SRUN_WITHDRAW_WAIT
        while self.popen.returncode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self.signal(signal.SIGKILL)

    def cleanup(self, timeout: float = SCANCEL_TIMEOUT) -> None:
        """srun did not end by itself (a signal ended it, or is about to), or
        ended while its job was still queued: cancel the job, by its name if
        it has one of ours, else by the id srun reported; a job left queued
        would run later, and one left allocated would stay RUNNING."""
        with self._withdraw_lock:
            job, self.queued_job = self.queued_job, None
            code = self.popen.returncode if self.popen is not None else 0
            if self.job_name and not self._named_cancelled and (code is None or code < 0):
                target, self._named_cancelled = f"--name={self.job_name}", True
            elif job is not None:
                target = job
            else:
                return
            try:
                subprocess.run(["scancel", target], env=self.scancel_env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
            except (OSError, subprocess.SubprocessError):
                try:
                    print(f"[srun] jaxrun: could not cancel its job; run: scancel {target}",
                          file=self.console, flush=True)
                except (OSError, ValueError):
                    pass  # a console that went away

    def settle(self) -> None:
        """It waits for one thing only, and briefly: srun's end after the
        SIGTERM that ``stop`` sent, since a SIGKILL that came first could
        leave its job queued or allocated; then its job is cancelled, as
        after any end that srun did not come to by itself."""
        if not self._killing and self.queued_job is None:
            return
        deadline = time.monotonic() + SRUN_ABORT_WAIT
        while not _has_exited(self.popen.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        # srun may end without withdrawing it (a loaded controller), and
        # the step watcher that would cancel it may not outlive this
        # process: cancel it here, briefly (a job gone already is no error).
        self.cleanup(timeout=SRUN_ABORT_WAIT)


def _has_exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited, without reaping it (the
    step watcher's ``Popen.wait`` does that)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already


class SlurmBackend(SchedulerBackend):
    """Every attempt is one srun step; an elastic restart checks the nodes
    with sinfo first and leaves out those Slurm cannot use."""

    name = "slurm"
    title = "Slurm"
    options_type = SlurmOptions
    rank_source = "slurm"

    def __init__(self, options: SlurmOptions, launch: planning.LaunchOptions, console: TextIO,
                 base_env: Mapping[str, str] | None = None, run=subprocess.run):
        super().__init__(options, launch, console, base_env)
        self.run = run  # how scontrol and sinfo are asked
        # An elastic restart's placement, which shapes its step (--exclude,
        # fewer --nodes); None: Slurm alone places the step.
        self.placement: Placement | None = None

    def pool(self) -> list[planning.Host]:
        """Inside an allocation: its nodes, each with the tasks one node runs
        (--ntasks-per-node, else an even share of -n)."""
        nodes = expand_nodelist(self.base_env.get("SLURM_JOB_NODELIST", ""), self.run)
        per_node = self.options.tasks_per_node or -(-self.launch.num_processes // max(1, len(nodes)))
        return [planning.Host(name, slots=per_node) for name in nodes]

    def place(self, ask: Ask) -> Placement:
        """An elastic restart (``ask.recheck``) leaves out the nodes Slurm
        reports down, drained, failing or not responding (``srun --exclude``)."""
        self.placement = None  # also when the check below fails: no stale one stays
        if not ask.recheck:
            return Placement(ask.hosts, ask.num_processes)
        self.placement = Placement.chosen(ask, node_problems([h.name for h in ask.hosts], self.run))
        return self.placement

    def step_process(self, count: int, task: Sequence[str], planned: Iterable[str]) -> SrunProcess:
        allocates = "SLURM_JOB_ID" not in self.base_env  # else each step is one of the user's allocation
        name = f"jaxrun-{self.launch.run_id}" if allocates and not names_its_job(self.options.scheduler_args) else None
        return SrunProcess(self.options, count, task, self.placement, self.base_env, self.console, name)
