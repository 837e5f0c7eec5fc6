"""Child side: join the distributed system, at the moment a plain launch would.

``prepare`` runs in the shim before the user's script and imports no jax.
It checks the launcher's environment and arranges that the process joins the
job exactly once, before jax creates a backend:

- when the script calls ``initialize(...)`` itself, through
  ``jax.distributed`` or ``jax._src.distributed``, the call reaches jax with
  jaxrun's coordinator, process count and id, and with the script's other
  arguments intact (timeouts, ``local_device_ids``, ...); a conflicting id or
  count stops the script with an error naming both values;
- when it never does, jaxrun initializes right before the first backend is
  created (``jax._src.xla_bridge.backends``);
- ``--mesh`` is the exception: its mesh must exist before the script runs,
  so then jaxrun initializes before it.

Until then the script may change ``os.environ``, ``XLA_FLAGS`` and
``jax.config`` as it would under a plain launch.  A controller forked from
the preloading server found jax imported already; ``note_preloaded_jax``
(``join.preloaded``) makes the script's own ``JAX_*`` settings reach
``jax.config`` at its first ``import jax``, as jax would have read them there.
"""

from __future__ import annotations

import functools
import os
import sys

from jaxrun import contract
from jaxrun.child import hooks
from jaxrun.child.join import preloaded
from jaxrun.child.join.addresses import (
    TRANSPORT_LISTENERS,
    advertise_for_collectives,
    alone,
    reachable_address,
    transfer_address,
    wait_for_coordinator,
)
from jaxrun.child.join.errors import BootstrapError


class Launch:
    """This process's place in the job, and how far its join has come (no
    dataclass: that import, and inspect's, would cost every start-up)."""

    def __init__(self, coordinator: str, count: int, rank: int, local: int, bind: str | None, verbose: bool,
                 joined_file: str | None = None) -> None:
        self.coordinator, self.count, self.rank, self.local = coordinator, count, rank, local
        self.bind, self.verbose = bind, verbose
        self.initialized = False
        self.busy = False  # inside jaxrun's own initialize: the backend hook stands back
        self.noted_address = False
        self.joined_file = joined_file  # created on arrival at the rendezvous (contract.JOINED_FILE)


_launch: Launch | None = None


def identity_from_env(environ=os.environ) -> tuple[int, int, int]:
    """(process id, process count, local process id) from the launcher or scheduler."""
    try:
        return contract.identity_from_env(environ)
    except ValueError as e:
        raise BootstrapError(str(e)) from None


def scheduled_devices(environ, local: int) -> None:
    """A task that a scheduler started with no jaxrun task agent (``srun
    python -m jaxrun.shim``, as examples/deploy/slurm.sbatch does) gets its
    GPUs by the agent's rule (``contract.devices``): the engine's binding, or
    its local rank's share of the node's.  JAX's own Slurm detection, which
    would pick them, is off (``cluster_detection_method="deactivate"``)."""
    if environ.get(contract.JAX_LOCAL_DEVICE_IDS) or environ.get(contract.RANK_SOURCE) not in contract.RANK_SOURCES:
        return
    from jaxrun.contract import devices

    ids, _ = devices.task_device_ids(local, devices.local_count_from_env(environ), None, environ,
                                     devices.node_gpus(environ))
    if ids is not None:
        environ[contract.JAX_LOCAL_DEVICE_IDS] = ",".join(map(str, ids))


def prepare(environ=os.environ) -> Launch:
    """Check the launcher's environment and hook jax's initialization; no jax import."""
    global _launch
    coordinator = environ.get(contract.COORDINATOR_ADDRESS)
    if not coordinator:
        raise BootstrapError(f"{contract.COORDINATOR_ADDRESS} is not set; start this process with jaxrun")
    rank, count, local = identity_from_env(environ)
    # The scheduler gave us our rank; publish it in jaxrun's own names too.
    environ[contract.PROCESS_ID] = str(rank)
    environ[contract.NUM_PROCESSES] = str(count)
    environ[contract.LOCAL_PROCESS_ID] = str(local)
    scheduled_devices(environ, local)
    bind = environ.get(contract.COORDINATOR_BIND_ADDRESS) if rank == 0 else None
    bind = contract.bracketed(bind) if bind else None
    _launch = Launch(coordinator, count, rank, local, bind, environ.get(contract.VERBOSE) == "1",
                     joined_file=environ.get(contract.JOINED_FILE))
    hooks.after_import("jax._src.distributed", _patch_distributed)
    hooks.after_import("jax._src.xla_bridge", _patch_xla_bridge)
    return _launch


def begin(environ=os.environ) -> None:
    """After the checks are installed: join now for ``--mesh``, or make a
    forked controller's own JAX_* settings reach jax at its import."""
    if environ.get(contract.MESH):
        initialize_now(environ)
    elif preloaded.forked():
        hooks.on_first_import("jax", preloaded.sync_preloaded_config)


def initialize_now(environ=os.environ) -> None:
    """Join before the script runs (``--mesh``) and install the mesh."""
    import jax  # noqa: F401 - the mesh needs it now

    from jaxrun.child.join import mesh  # and meshspec's dataclasses: only for --mesh

    rows = ensure_initialized()
    try:
        mesh.install_from_env(environ, hosts={r["host"] for r in rows or ()})
    except mesh.MeshSetupError as e:
        raise BootstrapError(str(e)) from None


# -- the hooks ---------------------------------------------------------------

def _patch_distributed(module) -> None:
    real = module.initialize

    @functools.wraps(real)
    def initialize(*args, **kwargs):
        return _script_initialize(real, args, kwargs)

    module._jaxrun_real_initialize = real
    module.initialize = initialize
    public = sys.modules.get("jax.distributed")  # bound the original when it was imported
    if public is not None and getattr(public, "initialize", None) is real:
        public.initialize = initialize


def _patch_xla_bridge(module) -> None:
    real = module.backends

    @functools.wraps(real)
    def backends(*args, **kwargs):
        if _launch is not None and not _launch.initialized and not _launch.busy:
            ensure_initialized()
            module.backends = real  # joined: nothing left to do on later calls
        return real(*args, **kwargs)

    module.backends = backends


def _script_initialize(real, args: tuple, kwargs: dict) -> None:
    import inspect  # here, as in _join: only a join needs it, never a start-up

    given = dict(inspect.signature(real).bind(*args, **kwargs).arguments)
    for name, expected in (("process_id", _launch.rank), ("num_processes", _launch.count)):
        value = given.get(name)
        if value is not None and int(value) != expected:
            raise RuntimeError(
                f"jax.distributed.initialize({name}={value}) disagrees with jaxrun, "
                f"which started this process with {name}={expected}"
            )
    address = given.get("coordinator_address")
    if address and address != _launch.coordinator and not _launch.noted_address:
        _launch.noted_address = True
        print(
            f"jaxrun: ignoring coordinator_address={address!r} in "
            f"jax.distributed.initialize(); using jaxrun's {_launch.coordinator}",
            file=sys.stderr,
        )
    if _launch.initialized:
        return  # jaxrun joined already (--mesh): the script's call is a checked no-op
    _join(real, given, own=True)


def recoverable() -> bool:
    """Whether this process enabled JAX's fault tolerance
    (``jax_enable_recoverability``, set by the script or its environment)
    before it joins: the launcher then lets the others go on without it."""
    from jax._src import config

    holder = config.config._value_holders.get("jax_enable_recoverability")
    return bool(holder is not None and holder.value)


def ensure_initialized() -> list[dict] | None:
    """Join the job now, unless this process has already; the preflight rows."""
    if _launch is None or _launch.initialized or _launch.busy:
        return None
    from jax._src import distributed

    if distributed.global_state.client is not None:  # joined by other means
        _launch.initialized = True
        contract.mark_joined(_launch.joined_file, recoverable())
        _account_begins()
        return None
    return _join(getattr(distributed, "_jaxrun_real_initialize", distributed.initialize), {})


def _join(real, given: dict, own: bool = False) -> list[dict]:
    """Join with jaxrun's values and ``given`` (the script's other arguments);
    ``own``: the script called initialize() itself."""
    import inspect

    import jax

    preloaded.sync_preloaded_config()
    params = inspect.signature(real).parameters
    kwargs = dict(given)
    kwargs.update(coordinator_address=_launch.coordinator, num_processes=_launch.count, process_id=_launch.rank)
    if "cluster_detection_method" in params:
        # Our values are complete: no Slurm/MPI detection may fill in parts.
        kwargs.setdefault("cluster_detection_method", "deactivate")
    if _launch.bind and "coordinator_bind_address" in params:
        kwargs["coordinator_bind_address"] = _launch.bind  # never all interfaces
    device_ids = os.environ.get(contract.JAX_LOCAL_DEVICE_IDS)
    if device_ids and kwargs.get("local_device_ids") is None:
        kwargs["local_device_ids"] = [int(i) for i in device_ids.split(",")]
    from jax._src import config

    # Every listener on one reachable address, unless the script chose its own.
    # One process has none (it opens no internet socket), unless its script
    # initializes itself where the machine takes internet sockets: a plain
    # launch then has JAX's CPU collectives, whose reductions round as the
    # script's numbers expect.
    single = _launch.count == 1 and (not own or contract.loopback_refused() is not None)
    try:
        ip = None if single else reachable_address(_launch.coordinator)
    except OSError:
        ip = None  # no route to the coordinator: initialize() will say so
    if single:
        alone()
    if ip is not None:
        advertise_for_collectives(ip)
        transfer = config.config._value_holders.get("jax_cross_host_transfer_socket_address")
        if transfer is not None and not transfer.value:  # older jax has no such option
            jax.config.update("jax_cross_host_transfer_socket_address", transfer_address(ip))
        transport = config.config._value_holders.get("jax_cross_host_transport_addresses")
        if transport is not None and not transport.value:
            jax.config.update("jax_cross_host_transport_addresses",
                              ",".join([contract.join_address(ip, 0)] * TRANSPORT_LISTENERS))
    _launch.busy = True
    profiling = sys.modules.get("jaxrun.child.watch.profiling")  # installed where a trace folder was named
    if profiling is not None:
        profiling.joining()  # a trace asked from now on waits for the join: its start makes the backend
    # Arrived: tell the launcher now, not when initialize() returns, which
    # it does in every process at once, when the last one has arrived.
    contract.mark_joined(_launch.joined_file, recoverable())
    try:
        if _launch.rank != 0:
            wait_for_coordinator(_launch.coordinator)
        real(**kwargs)
    finally:
        _launch.busy = False
        if profiling is not None:
            profiling.joined()
    _launch.initialized = True
    from jaxrun.child.join import preflight  # here: json and the versions' table only once joining

    # Restarted alone: the others passed the preflight's barrier long ago.
    rows = [] if os.environ.get(contract.PROCESS_RESTARTS, "0") != "0" else preflight.exchange(
        _launch.rank, _launch.count, _launch.verbose)
    _account_begins()  # every process is in
    return rows


def _account_begins() -> None:
    """The account of this process's time begins (where the launcher wants one)."""
    from jaxrun.child.watch import accounting

    accounting.joined()


def allgather_json(tag: str, payload: object, timeout_s: float = 300.0) -> dict[int, object]:
    """*Collective*: every process's JSON-able ``payload``, keyed by process id
    (``join.preflight.gather``: through the coordination service's store, no
    device).  Joins first, where this process has not yet."""
    from jaxrun.child.join import preflight

    ensure_initialized()
    if _launch is not None:
        return preflight.gather(tag, payload, _launch.rank, _launch.count, timeout_s)
    import jax  # the runtime helpers, in a job jaxrun did not start

    return preflight.gather(tag, payload, jax.process_index(), jax.process_count(), timeout_s)
