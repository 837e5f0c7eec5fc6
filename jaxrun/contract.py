"""The environment contract between the launcher and the child-side shim.

The parent (cli, plan, spawn, supervisor) and the child (shim, runtime) meet only
here: the launcher writes these variables into each child's environment and the
shim reads them.  Nothing in this module imports jax.
"""

COORDINATOR_ADDRESS = "JAXRUN_COORDINATOR_ADDRESS"
COORDINATOR_BIND_ADDRESS = "JAXRUN_COORDINATOR_BIND_ADDRESS"
NUM_PROCESSES = "JAXRUN_NUM_PROCESSES"
PROCESS_ID = "JAXRUN_PROCESS_ID"
LOCAL_PROCESS_ID = "JAXRUN_LOCAL_PROCESS_ID"
LOCAL_PROCESS_COUNT = "JAXRUN_LOCAL_PROCESS_COUNT"
RUN_ID = "JAXRUN_RUN_ID"
RESTART_COUNT = "JAXRUN_RESTART_COUNT"
# Read end of a pipe whose write end only the launcher holds.  EOF means the
# launcher is gone, and the shim kills its own process group.
LIFELINE_FD = "JAXRUN_LIFELINE_FD"
# Where the shim records an uncaught exception (JSON) for the run summary.
ERROR_FILE = "JAXRUN_ERROR_FILE"
# Optional mesh spec, e.g. "i=4,j=2", and its axis types ("auto"/"explicit").
MESH = "JAXRUN_MESH"
MESH_AXIS_TYPES = "JAXRUN_MESH_AXIS_TYPES"
# "1" makes the shim print the startup preflight table from process 0.
VERBOSE = "JAXRUN_VERBOSE"
# Where the rank comes from: "jaxrun" (the variables above), "slurm" or "mpi".
RANK_SOURCE = "JAXRUN_RANK_SOURCE"

# JAX's own variables, set for code that reads them directly.
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
JAX_COORDINATOR_BIND_ADDRESS = "JAX_COORDINATOR_BIND_ADDRESS"
JAX_PLATFORMS = "JAX_PLATFORMS"
JAX_NUM_CPU_DEVICES = "JAX_NUM_CPU_DEVICES"
JAX_LOCAL_DEVICE_IDS = "JAX_LOCAL_DEVICE_IDS"

# Variables forwarded to remote hosts in addition to user-chosen ones.
CONTRACT_PREFIXES = ("JAXRUN_", "JAX_")

PLACEHOLDERS = ("process_id", "num_processes", "local_process_id", "coordinator")
