"""``--launcher ray``: the controllers run on a running Ray cluster, one Ray actor each.

An attempt is a scheduler step (:mod:`jaxrun.backends.scheduler.step`) whose
scheduler is a Ray driver, this module run as ``--driver``:

1. it connects to the cluster and asks for a placement group of one bundle
   per controller (1 CPU; K GPUs with ``--devices-per-process K``), placed
   as ``--placement`` says, and tells the launcher each bundle's node;
2. the plan's hosts are those nodes (``plan_facts``), each named by its node
   id's first 8 hex digits and its address, so the local ranks and the
   report's hosts are the nodes';
3. given each process's bundle, command and environment (``Go``, on its
   stdin), it starts one actor per bundle, which runs the scheduler's task
   agent as its child (``--agent``).  From there on all is the scheduler
   backend's: the task channel carries bytes, signals, joins and exits, and
   each rank is a ``RankChild``.  Ray's log forwarding is off.  Ray hands
   out the GPUs (``CUDA_VISIBLE_DEVICES``), so no device ids are set;
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
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from jaxrun import contract, wire
from jaxrun.backends.scheduler.backend import MPI_FORWARD, MPI_FORWARD_PREFIXES
from jaxrun.backends.scheduler.step import Step
from jaxrun.backends.shield import shielded
from jaxrun.core import reaper, spec as planning
from jaxrun.core.backend import Backend, RunHooks, start_thread, wait_until
from jaxrun.core.config import LaunchError

MODULE = "jaxrun.backends.ray.backend"
NO_RAY = "--launcher ray needs Ray, which this Python cannot import: pip install 'jaxrun[ray]'"
PLACEMENTS = {"pack": "PACK", "spread": "SPREAD", "strict-spread": "STRICT_SPREAD"}
REACH_TIMEOUT = 5.0  # the driver's first look at the cluster's address, before ray.init (which waits minutes)
WAIT_NOTE = 5.0  # a placement that takes longer is said once, like srun's "queued and waiting"
CLOSE_WAIT = 10.0  # for the driver to end once its stdin is closed
# What a Ray worker's environment holds for Ray alone (and PYTHONBREAKPOINT=ray.util.rpdb...).
WORKER_ONLY = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_CLIENT_MODE", "RAY_LD_PRELOAD_ON_WORKERS", "PYTHONDONTWRITEBYTECODE")


# -- the driver's words with the launcher (one module holds both ends) -----------------
@wire.message("ray-placed")
class Placed(wire.Message):
    nodes: list  # [node id, node address] of each bundle, in bundle order
    address: str  # the driver's own node's address, as Ray knows it


@wire.message("ray-failed")
class Failed(wire.Message):
    why: str  # one line: the cluster cannot be reached, or refused the placement group


@wire.message("ray-go")
class Go(wire.Message):
    processes: list  # per rank: [bundle index, command, environment]
    cwd: str | None  # where the agents start on their nodes


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
    return RayOptions(address, values.get("placement") or "spread", values.get("chdir") or os.getcwd())


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
    env = {k: v for k, v in environ.items() if k in MPI_FORWARD or k.startswith(MPI_FORWARD_PREFIXES)}
    env.update(planned)
    env.pop(contract.TASK_DEVICES_PER_PROCESS, None)
    return env


def node_env(worker_env: Mapping[str, str], sent: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment: its Ray worker's, less what is Ray's alone, plus ``sent``."""
    env = {k: v for k, v in worker_env.items()
           if k not in WORKER_ONLY and not (k == "PYTHONBREAKPOINT" and v.startswith("ray."))}
    env.update(sent)
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
                    [sys.executable, "-m", MODULE, "--driver", str(words_w), json.dumps(settings)],
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
            said = wire.decode(heard[0])
        except wire.WireError:  # nothing: it ended first
            said = None
        if isinstance(said, Placed):
            return said
        if isinstance(said, Failed):
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


class RayStep(Step):
    """The scheduler step whose scheduler is the attempt's Ray driver, already running."""

    def __init__(self, driver: Driver, processes: list, cwd: str | None, specs: Sequence[planning.ProcessSpec],
                 log_dir: str, console: TextIO, fixed_coordinator: str | None, channel_host: str | None,
                 hooks: RunHooks):
        super().__init__("ray", specs, lambda env: [], {}, log_dir, console, fixed_coordinator, channel_host, hooks)
        self.driver, self.processes, self.cwd = driver, processes, cwd

    def _start_step(self) -> None:
        home = {contract.TASK_CHANNEL: self.channel, contract.TASK_SECRET: self.secret}
        os.makedirs(self.log_dir, exist_ok=True)
        self.popen = self.driver.popen
        self.driver.go([[bundle, command, {**env, **home}] for bundle, command, env in self.processes], self.cwd)
        start_thread("step-watcher", self._watch_step, hooks=self.hooks)

    def _copy_scheduler_output(self, log_path: str) -> None:
        self.driver.into_log(log_path)


class RayBackend(Backend):
    """Every attempt is one Ray driver and its actors; each rank is a Child."""

    name = "ray"
    writes_log_files = False

    def __init__(self, options: RayOptions, launch: planning.LaunchOptions, console: TextIO,
                 environ: Mapping[str, str] | None = None):
        self.options, self.launch, self.console = options, launch, console
        self.environ = dict(os.environ if environ is None else environ)
        self.fixed: str | None = None
        self.driver: Driver | None = None
        self.placed: Placed | None = None
        self.bundle_of: list[int] = []  # by rank
        self.step: RayStep | None = None

    def choose_coordinator(self, fixed: str | None) -> tuple[str, None]:
        # Process 0's agent picks a free port on its node (see the task agent).
        self.fixed = fixed
        return fixed or "", None

    def plan_facts(self) -> dict:
        """The cluster places the bundles first: its nodes are the plan's hosts."""
        self.end_attempt()  # a restart's driver is a new one
        asks = bundles(self.launch.num_processes, self.launch.devices_per_process)
        self.driver = Driver(self.options, asks, self.console, self.hooks)
        self.placed = self.driver.placement()
        hosts, self.bundle_of = hosts_of(self.placed.nodes)
        return {"hosts": hosts}

    def begin_attempt(self, specs: Sequence[planning.ProcessSpec], log_dir: str) -> None:
        command = list(contract.shim_argv(self.launch.python, planning.shim_args(self.launch.target)))
        processes = [[self.bundle_of[s.rank], command, sent_env(self.environ, s.env)] for s in specs]
        # The task channel listens where Ray reaches this node, unless told otherwise.
        channel_host = None if self.environ.get(contract.TASK_CHANNEL_HOST) else self.placed.address
        self.step = RayStep(self.driver, processes, self.options.chdir, specs, log_dir, self.console, self.fixed,
                            channel_host, self.hooks)

    def spawn(self, spec: planning.ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None, on_join) -> Any:
        return self.step.spawn(spec, extra_env, on_join)

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


# -- the driver ---------------------------------------------------------------------------
def unreachable(address: str) -> str | None:
    """Why the cluster's GCS cannot be reached, or None (ray.init would wait for minutes)."""
    if address == "auto":
        return None
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT).close()
    except (OSError, ValueError) as e:
        return f"cannot reach the Ray cluster at {address}: {e}"
    return None


def drive(words_fd: int, settings: dict) -> int:
    """The driver's life; its exit status is the first failing process's."""
    words = os.fdopen(words_fd, "wb", buffering=0)
    plans: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    threading.Thread(target=_lifeline, args=(plans,), name="lifeline", daemon=True).start()
    address, count = settings["address"], len(settings["bundles"])
    problem = unreachable(address)
    if problem:
        words.write(Failed(problem).line())
        return 2
    import logging

    import ray
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    try:  # Ray's forwarding of worker output is off: the task channel carries it
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as e:  # noqa: BLE001 -- whatever Ray raises, it is one line for the user
        words.write(Failed(f"cannot connect to the Ray cluster at {address}: {e}".splitlines()[0]).line())
        return 2
    group = placement_group(settings["bundles"], strategy=PLACEMENTS[settings["placement"]])
    ready = group.ready()
    if not ray.wait([ready], timeout=WAIT_NOTE)[0]:
        print(f"jaxrun: waiting for the Ray cluster to place {count} processes ({settings['bundles'][0]} each, "
              f"--placement {settings['placement']})", flush=True)
        ray.get(ready)
    table = placement_group_table(group)["bundles_to_node_id"]
    addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    nodes = [[table[i], addresses.get(table[i], "unknown")] for i in range(count)]
    words.write(Placed(nodes, ray.util.get_node_ip_address()).line())
    go = wire.decode(plans.get())
    # Ray's working_dir (``ray job submit --working-dir``): each worker starts in its copy.
    cwd = None if ray.get_runtime_context().runtime_env.get("working_dir") else go.cwd
    gpus = settings["bundles"][0].get("GPU", 0)
    actor = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(ControllerHost)
    runs = {}
    for rank, (bundle, command, env) in enumerate(go.processes):
        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
        runs[actor.options(scheduling_strategy=where).remote().run.remote(command, env, cwd)] = rank
    return first_failure(ray, runs)


def first_failure(ray: Any, runs: dict) -> int:
    """Wait for every actor's agent; the first failing status, in the order they ended."""
    status, pending = 0, list(runs)
    while pending:
        (done,), pending = ray.wait(pending, num_returns=1)
        try:
            code, said = ray.get(done)
        except ray.exceptions.RayError as e:
            code, said = 1, f"its Ray actor failed: {str(e).strip().splitlines()[0]}"
        for line in said.splitlines():
            print(f"jaxrun: process {runs[done]}: {line}", flush=True)
        status = status or code
    return status


def _lifeline(plans: queue.SimpleQueue) -> None:
    """The launcher's one word, then nothing until it closes our stdin, or dies."""
    data, told = b"", False
    while chunk := os.read(0, 1 << 16):  # unbuffered: this thread may still read as the driver exits
        if not told:
            data += chunk
            if b"\n" in data:
                plans.put(data)
                told = True
    os._exit(0)  # Ray ends this driver's actors and placement group


class ControllerHost:
    """A Ray actor's body: it runs one controller's task agent as its child."""

    def run(self, command: list[str], env: dict, cwd: str | None) -> tuple[int, str]:
        """The agent's exit status, and what it said itself (the controller's
        bytes go over the task channel)."""
        lifeline_r, lifeline_w = os.pipe()  # the agent dies with this actor
        argv = [command[0], "-m", MODULE, "--agent", str(lifeline_r), "--", *command]
        try:
            agent = subprocess.Popen(argv, env=node_env(os.environ, env), cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(lifeline_r,))
        except OSError as e:
            return 127, f"cannot start its task agent on this node (in {cwd}): {e}"
        finally:
            os.close(lifeline_r)
        said = agent.stdout.read()
        code = agent.wait()
        os.close(lifeline_w)
        return contract.exit_status(code), said.decode(errors="replace")[-4000:]


def agent(argv: list[str]) -> int:
    """``--agent FD -- COMMAND``: the task agent, which dies with the actor that holds FD's other end."""
    lifeline = int(argv[0])

    def watch() -> None:  # the controller's lifeline is ours: it goes too
        os.read(lifeline, 1)  # the actor writes nothing: this returns as it ends
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="actor-lifeline", daemon=True).start()
    from jaxrun.backends.scheduler import task_agent as scheduler_agent

    return scheduler_agent.main(argv[1:])


def main(argv: list[str]) -> int | str:
    if argv[:1] == ["--agent"] and len(argv) > 2:
        return agent(argv[1:])
    if argv[:1] == ["--driver"] and len(argv) == 3:
        return drive(int(argv[1]), json.loads(argv[2]))
    return f"usage: python -m {MODULE} --driver FD SETTINGS | --agent FD -- COMMAND..."  # sys.exit prints it


if __name__ == "__main__":
    from jaxrun.backends.ray.backend import main as module_main  # Ray pickles this module's classes by name

    sys.exit(module_main(sys.argv[1:]))
