"""Child side: build and install the global mesh named by ``jaxrun --mesh``.

Runs inside ``bootstrap.initialize_now`` (``--mesh``) right after
``jax.distributed.initialize``, so the user's script starts with the mesh
already installed (``jax.set_mesh``) and available as ``jaxrun.mesh()``.
"""

from __future__ import annotations

import os

from jaxrun import contract, meshspec

# The mesh the shim installed, or None without --mesh.  Read by jaxrun.mesh().
installed = None


class MeshSetupError(RuntimeError):
    """The mesh asked for cannot be built here; the message says why."""


def spans_hosts(environ=os.environ, hosts=()) -> bool:
    """True when the job's processes run on more than one host.

    The launcher's counts decide; under Slurm or MPI, where it may not have
    set them, the host names the preflight collected do.
    """
    local = environ.get(contract.LOCAL_PROCESS_COUNT)
    total = environ.get(contract.NUM_PROCESSES)
    if local and total:
        return int(local) != int(total)
    return len(set(hosts)) > 1


def build_mesh(spec: meshspec.MeshSpec, axis_types: str | None, multi_host: bool):
    """The global mesh over every device of the job, or MeshSetupError."""
    import jax
    from jax.sharding import AxisType

    devices = jax.devices()
    try:
        sizes = meshspec.resolve(spec, len(devices))
    except meshspec.MeshSpecError as e:
        where = f"{jax.process_count()} processes x {jax.local_device_count()} local devices"
        raise MeshSetupError(f"--mesh: {e} ({where})") from None
    # Explicit by default, as jax.make_mesh does; jax.sharding.Mesh alone
    # would default to Auto, and the hybrid path must not differ.
    kind = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}[axis_types or "explicit"]
    types = (kind,) * len(sizes)
    if not multi_host:
        return jax.make_mesh(sizes, spec.names, axis_types=types)
    # Across hosts the leading axis must span hosts, so the fast intra-host
    # links carry the inner axes.  Processes are the granules: on CPU (and
    # GPU) JAX reports one slice for the whole job, and slice-based hybrid
    # meshes fail there.
    from jax.experimental import mesh_utils

    try:
        inner, outer = meshspec.split_across_processes(sizes, jax.process_count())
    except meshspec.MeshSpecError as e:
        raise MeshSetupError(f"--mesh: {e}") from None
    grid = mesh_utils.create_hybrid_device_mesh(inner, outer, devices, process_is_granule=True)
    return jax.sharding.Mesh(grid, spec.names, axis_types=types)


def install_from_env(environ=os.environ, hosts=()) -> None:
    """Build the mesh named by ``contract.MESH``, if any, and make it the default."""
    global installed
    text = environ.get(contract.MESH)
    if not text:
        return

    try:
        spec = meshspec.parse(text)
    except meshspec.MeshSpecError as e:
        raise MeshSetupError(f"--mesh: {e}") from None
    mesh = build_mesh(spec, environ.get(contract.MESH_AXIS_TYPES), spans_hosts(environ, hosts))
    import jax

    jax.set_mesh(mesh)
    installed = mesh
