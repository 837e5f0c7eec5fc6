"""``--launcher ray``: the controllers run on a running Ray cluster, one Ray actor each.

An attempt is a scheduler step (:mod:`jaxrun.backends.scheduler.step`) whose
process is the attempt's Ray driver (:mod:`jaxrun.backends.ray.driver`):

1. ``place`` starts the driver, which connects to the cluster and asks for a
   placement group of one bundle per controller (1 CPU; K GPUs with
   ``--devices-per-process K``), placed as ``--placement`` says, and tells
   the launcher each bundle's node;
2. the plan's hosts are those nodes (``Placement.hosts``), each named by its
   node id's first 8 hex digits and its address, so the local ranks and the
   report's hosts are the nodes';
3. given each process's bundle, command and environment (``Go``, on its
   stdin), it starts one actor per bundle (:mod:`jaxrun.backends.ray.actor`),
   which runs the scheduler's task agent as its child.  From there on all is
   the scheduler backend's: the task channel carries bytes, signals, joins
   and exits, and each rank is a ``RankChild``.  Ray's log forwarding is
   off.  Ray hands out the GPUs (``CUDA_VISIBLE_DEVICES``), so no device ids
   are set;
4. it exits once every agent has, with the first failing status.

Nothing outlives jaxrun: the driver's stdin is its lifeline, and Ray ends
the actors and the placement group of a driver that is gone; each agent
dies with its actor (a pipe), and the controller with its agent.  Only the
driver and the actors import ray.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from jaxrun import contract
from jaxrun.backends.ray.words import PLACEMENTS, DriverFailed, Go, Placed
from jaxrun.backends.scheduler.mpirun import mpi_forwards
from jaxrun.backends.scheduler.step import Say, Step, StepProcess
from jaxrun.backends.shield import shielded
from jaxrun.core import reaper, spec as planning
from jaxrun.core.backend import Ask, Backend, News, Placement, RunHooks, start_thread, wait_until
from jaxrun.core.config import LaunchError
from jaxrun.wire import encoding

NO_RAY = "--launcher ray needs Ray, which this Python cannot import: pip install 'jaxrun[ray]'"
CLOSE_WAIT = 10.0  # for the driver to end once its stdin is closed


@dataclasses.dataclass(frozen=True)
class RayOptions:
    address: str  # --ray-address, else $RAY_ADDRESS, else "auto"
    placement: str = "spread"  # a key of PLACEMENTS
    chdir: str | None = None  # the controllers' working directory on every node (--chdir, else ours)


def options(values: Mapping[str, Any], launch: planning.LaunchOptions,
            environ: Mapping[str, str] = os.environ) -> RayOptions:
    """The registry's ``options``: refuses what cannot work before anything starts."""
    if importlib.util.find_spec("ray") is None:
        raise LaunchError(NO_RAY)
    if values.get("nodes") or values.get("tasks_per_node") or values.get("scheduler_args"):
        raise LaunchError("--nodes, --ntasks-per-node and --scheduler-arg are for slurm and mpirun; "
                          "Ray places the processes as --placement says")
    address = values.get("ray_address") or environ.get("RAY_ADDRESS") or "auto"
    if address.startswith("ray://"):
        raise LaunchError(f"--ray-address {address}: jaxrun runs its Ray driver here, on a node of the cluster: "
                          "give the GCS address (HOST:PORT) or auto, not a Ray Client address")
    placement = values.get("placement") or "spread"
    if placement not in PLACEMENTS:
        raise LaunchError(f"--placement {placement}: it takes {', '.join(PLACEMENTS)}")
    return RayOptions(address, placement, values.get("chdir") or os.getcwd())


def bundles(count: int, devices_per_process: int | None) -> list[dict[str, float]]:
    """One placement group bundle per controller: what each asks of its node."""
    one = {"CPU": 1.0, **({"GPU": float(devices_per_process)} if devices_per_process else {})}
    return [dict(one) for _ in range(count)]


def hosts_of(placed: Sequence[Sequence[str]]) -> tuple[tuple[planning.Host, ...], list[int]]:
    """Bundle i is on node ``placed[i]`` (node id, address): the plan's hosts, a node each with a slot
    per bundle, in the order the bundles name them; and each rank's bundle (the plan fills hosts in order)."""
    by_node: dict[tuple[str, str], list[int]] = {}
    for index, (node, address) in enumerate(placed):
        by_node.setdefault((node, address), []).append(index)
    # A node's name: its id's first 8 hex digits and its address (two nodes may share one).
    hosts = tuple(planning.Host(f"{node[:8]}@{address}", slots=len(indices))
                  for (node, address), indices in by_node.items())
    return hosts, [index for indices in by_node.values() for index in indices]


def sent_env(environ: Mapping[str, str], planned: Mapping[str, str]) -> dict[str, str]:
    """What a process's actor adds to its node's environment: what mpirun forwards (the plan's
    variables, jaxrun's, JAX's, XLA's, PATH and the like), less the device split: Ray gives the GPUs."""
    env = {k: v for k, v in environ.items() if mpi_forwards(k)}
    env.update(planned)
    env.pop(contract.TASK_DEVICES_PER_PROCESS, None)
    return env


# -- the launcher's side ------------------------------------------------------------------
class Driver:
    """One attempt's Ray driver, from the launcher's side.  Its output goes
    to the console at once, and into ``engine.log`` once the step knows its
    folder; its words come on a pipe of their own."""

    def __init__(self, options: RayOptions, asks: list[dict], console: TextIO, hooks: RunHooks):
        settings = {"address": options.address, "placement": options.placement, "bundles": asks}
        words_r, words_w = os.pipe()
        try:
            with shielded():  # a SIGTERM to jaxrun's whole tree is jaxrun's to handle
                self.popen = subprocess.Popen(
                    [sys.executable, "-m", contract.RAY_DRIVER_MODULE, str(words_w), json.dumps(settings)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(words_w,),
                    start_new_session=True)
        finally:
            os.close(words_w)
        self.words = os.fdopen(words_r, "rb")
        self.console, self.hooks = console, hooks
        self.lines: list[bytes] = []  # its output (a few lines: Ray's own goes to Ray's logs)
        self.log = None
        self.lock = threading.Lock()
        self.copied = threading.Event()
        start_thread("ray-driver-output", self._copy, hooks=hooks)

    def placement(self) -> Placed:
        """Where the cluster placed the bundles; LaunchError (exit 2) if it cannot."""
        heard: list[bytes] = []
        start_thread("ray-placement", lambda: heard.append(self.words.readline()), hooks=self.hooks)
        wait_until(lambda: bool(heard), self.hooks)  # a signal cuts it short
        try:
            said = encoding.decode(heard[0])
        except encoding.WireError:  # nothing: it ended first
            said = None
        if isinstance(said, Placed):
            return said
        if isinstance(said, DriverFailed):
            raise LaunchError(f"--launcher ray: {said.why}")
        self.copied.wait(CLOSE_WAIT)  # its output ends as it does
        code = self.popen.poll()
        last = [line.decode(errors="replace").strip() for line in self.lines if line.strip()][-1:]
        raise LaunchError(f"--launcher ray: the Ray driver ended (exit code {code}) before it placed the "
                          f"processes{''.join(': ' + line for line in last)}")

    def _copy(self) -> None:
        try:
            for line in self.popen.stdout:
                with self.lock:
                    self.lines.append(line)
                    self._write([line])
                print(f"[ray] {line.decode(errors='replace').rstrip()}", file=self.console, flush=True)
        finally:
            self.copied.set()

    def _write(self, lines: list[bytes]) -> None:
        try:
            if self.log is not None:
                self.log.writelines(lines)
                self.log.flush()
        except OSError:  # a full disk stops the log, not the run
            self.log = None

    def into_log(self, path: str) -> None:
        """Its output so far and to come in ``path``, until it ends (from the step watcher's thread)."""
        try:
            with open(path, "wb") as log:
                with self.lock:
                    self.log = log
                    self._write(self.lines)
                self.copied.wait()
                with self.lock:
                    self.log = None
        except OSError as e:
            print(f"[ray] jaxrun: cannot write {path}: {e}", file=self.console, flush=True)
            self.copied.wait()

    def go(self, processes: list, cwd: str | None) -> None:
        try:
            self.popen.stdin.write(Go(processes, cwd).line())
            self.popen.stdin.flush()
        except (OSError, ValueError):
            pass  # it has ended: the step watcher ends every rank

    def hang_up(self) -> None:
        """Close its lifeline: it ends at once, and Ray ends its actors."""
        try:
            self.popen.stdin.close()
        except OSError:
            pass

    def kill(self) -> None:
        if self.popen.returncode is None:  # set as Popen reaps it: no group is signalled after that
            reaper.kill_group(self.popen.pid, signal.SIGKILL)

    def close(self) -> None:
        self.hang_up()
        try:
            self.popen.wait(timeout=CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            self.kill()
            self.popen.wait()
        self.copied.wait(1.0)
        self.words.close()


class DriverProcess(StepProcess):
    """The step's process: the attempt's Ray driver, already running since
    ``place``; starting the step tells it to start the actors."""

    program = "ray"

    def __init__(self, driver: Driver, processes: list, cwd: str | None):
        self.driver, self.processes, self.cwd = driver, processes, cwd

    def start(self, env: Mapping[str, str], hooks: RunHooks) -> None:
        self.popen = self.driver.popen
        self.driver.go([[bundle, command, {**sent, **env}] for bundle, command, sent in self.processes], self.cwd)

    def copy_output(self, log_path: str, say: Say) -> None:
        self.driver.into_log(log_path)  # the console has had it all along


class RayBackend(Backend):
    """Every attempt is one Ray driver and its actors; each rank is a Child."""

    name = "ray"
    title = "Ray"
    writes_log_files = False

    def __init__(self, options: RayOptions, launch: planning.LaunchOptions, console: TextIO,
                 environ: Mapping[str, str] | None = None):
        self.options, self.launch, self.console = options, launch, console
        self.environ = dict(os.environ if environ is None else environ)
        self.fixed: str | None = None
        self.driver: Driver | None = None
        self.placed: Placed | None = None
        self.bundle_of: list[int] = []  # by rank
        self.step: Step | None = None

    def choose_coordinator(self, fixed: str | None) -> tuple[str, None]:
        # Process 0's agent picks a free port on its node (see the task agent).
        self.fixed = fixed
        return fixed or "", None

    def place(self, ask: Ask) -> Placement:
        """The cluster places the bundles first, while ``--timeout`` counts:
        its nodes are the plan's hosts.  The driver that placed them runs the
        attempt (``begin_attempt``)."""
        if ask.recheck:
            return super().place(ask)  # Ray chooses the nodes itself: no elastic restart
        self.end_attempt()  # a restart's driver is a new one
        asks = bundles(ask.num_processes, self.launch.devices_per_process)
        self.driver = Driver(self.options, asks, self.console, self.hooks)
        self.placed = self.driver.placement()
        hosts, self.bundle_of = hosts_of(self.placed.nodes)
        # The nodes are the plan's hosts too (a scheduler step's plan keeps its own): a fact.
        return Placement(hosts, ask.num_processes, facts={"hosts": hosts})

    def begin_attempt(self, specs: Sequence[planning.ProcessSpec], log_dir: str) -> None:
        command = list(contract.shim_argv(self.launch.python, planning.shim_args(self.launch.target)))
        processes = [[self.bundle_of[s.rank], command, sent_env(self.environ, s.env)] for s in specs]
        # The task channel listens where Ray reaches this node, unless told otherwise.
        channel_host = None if self.environ.get(contract.TASK_CHANNEL_HOST) else self.placed.address
        process = DriverProcess(self.driver, processes, self.options.chdir)
        self.step = Step(process, specs, {}, log_dir, self.console, self.fixed, channel_host, self.hooks)

    def spawn(self, spec: planning.ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None, news: News) -> Any:
        return self.step.spawn(spec, extra_env, news)

    def job_is_recoverable(self) -> None:
        if self.step is not None:
            self.step.job_is_recoverable()

    def end_attempt(self) -> None:
        step, driver, self.step, self.driver = self.step, self.driver, None, None
        if driver is not None:
            driver.hang_up()  # every rank has ended: the driver goes, and Ray ends what it holds
        if step is not None:
            step.close()
        if driver is not None:
            driver.close()

    def close(self) -> None:
        self.end_attempt()

    def abort(self) -> None:
        step, driver = self.step, self.driver  # read once: end_attempt may clear them meanwhile
        if step is not None:
            step.abort()
        if driver is not None:
            driver.kill()
