"""Every name the sides agree on: the environment variables jaxrun sets or
reads (no ``JAXRUN_*`` name is spelled anywhere else) and the module names
put on command lines."""

# -- what every child gets ---------------------------------------------------
COORDINATOR_ADDRESS = "JAXRUN_COORDINATOR_ADDRESS"
COORDINATOR_BIND_ADDRESS = "JAXRUN_COORDINATOR_BIND_ADDRESS"
# A Kubernetes pod's own address (the downward API's status.podIP), which pod
# 0's coordination service binds (``jaxrun k8s``).
POD_ADDRESS = "JAXRUN_POD_ADDRESS"
NUM_PROCESSES = "JAXRUN_NUM_PROCESSES"
PROCESS_ID = "JAXRUN_PROCESS_ID"
LOCAL_PROCESS_ID = "JAXRUN_LOCAL_PROCESS_ID"
LOCAL_PROCESS_COUNT = "JAXRUN_LOCAL_PROCESS_COUNT"
RUN_ID = "JAXRUN_RUN_ID"
RESTART_COUNT = "JAXRUN_RESTART_COUNT"
# How many times this process was started again alone within its attempt (a
# recoverable job's, see RECOVERABLE_MODE); 0 or unset on its first run.
PROCESS_RESTARTS = "JAXRUN_PROCESS_RESTARTS"
# Read end of a pipe whose write end only the launcher holds.  EOF means the
# launcher is gone, and the shim kills its own process group.
LIFELINE_FD = "JAXRUN_LIFELINE_FD"
# Where the shim records an uncaught exception (see ErrorRecord).
ERROR_FILE = "JAXRUN_ERROR_FILE"
# A path the shim creates (0600, never through a symlink) when the process
# arrives at the job's rendezvous, right before the real
# jax.distributed.initialize() call: how the launcher counts joined processes.
# It holds RECOVERABLE when the process enabled jax_enable_recoverability, and
# is empty otherwise.
JOINED_FILE = "JAXRUN_JOINED_FILE"
RECOVERABLE = "recoverable"
# Whether the job is recoverable (--recoverable, --no-recoverable, or by what
# its processes announce), as the scheduler's task agents are told it: "on",
# "off" or "auto".  A task agent whose process is not process 0 exits 0 in a
# recoverable job, so that the scheduler's own fail-fast leaves the others be.
RECOVERABLE_MODE = "JAXRUN_RECOVERABLE"
# The stall watchdog (--stall-timeout): its timeout in seconds, and the path
# of the file where the shim's sampler writes this process's state (BUSY,
# IDLE or SPIN, see child.activity) each time it changes, and FINISHED once
# the script returned.  SPIN: the process's own threads burn CPU while its
# Python has not moved (native threads in a busy wait, as NCCL's in a hang);
# its line says how many and their CPU in cores ("spin 2 1.97", see
# contract.Spinning), and counts as not moving, as IDLE does.  PARKED: idle
# (no CPU, no I/O, its stack unmoved) with the main thread parked in a wait of
# Python's own, outside JAX, while no thread of the script's is inside JAX;
# not moving too, and the evidence that a wait every process shares at one
# line is a stall (IDLE alone may be a program running on an accelerator).
STALL_TIMEOUT = "JAXRUN_STALL_TIMEOUT"
ACTIVITY_FILE = "JAXRUN_ACTIVITY_FILE"
# Where the shim writes what the process spent on compiles and checkpoint
# saves, as JAX's and Orbax's own events (jax.monitoring) and the script's
# marks (jaxrun.checkpointing(), jaxrun.step()) say: one JSON object
# (contract.Marks), rewritten whole a few times a minute at most, read by
# the launcher (or the far end, which sends it home) when the process ends.
MARKS_FILE = "JAXRUN_MARKS_FILE"
STALL_EXIT = 125  # jaxrun's exit status when the watchdog stopped a stalled job
BUSY = "busy"
IDLE = "idle"
PARKED = "parked"
SPIN = "spin"
FINISHED = "finished"
# The time accounting (child.accounting; on unless --no-account, which sets
# ACCOUNT to ACCOUNT_OFF): each process's time since its join, split into its
# own work, its programs and its waits for the others (contract.TimeSplit),
# as a TIME line beside its activity line, every ACCOUNT_EVERY seconds at
# most and when its script returns.
ACCOUNT = "JAXRUN_ACCOUNT"
ACCOUNT_OFF = "off"
TIME = "time"
# On-demand traces (`jaxrun profile`, --profile): where this process keeps
# them (see contract.traces: a path of the launching machine, or a bare name
# in the host's per-user base).  Set, the shim takes PROFILE_SIGNAL (SIGUSR2)
# as "start tracing", the next as "stop"; a trace stops by itself after
# PROFILE_MAX_SECONDS.
PROFILE_DIR = "JAXRUN_PROFILE_DIR"
PROFILE_MAX_SECONDS = 600.0
# Where the attempts of a run share JAX's persistent compile cache (set only
# when restarts are possible): an absolute path is a folder on the launching
# machine, in the run's log folder; a bare name (the run id) is a folder of
# that name in the per-user temp area of whichever host runs the process (an
# SSH host, a scheduler's node).  Each process makes the folder private and
# sets JAX_COMPILATION_CACHE_DIR to it, unless its environment has a cache of
# its own (see contract.own_compile_cache).
COMPILE_CACHE = "JAXRUN_COMPILE_CACHE"
# Optional mesh spec, e.g. "i=4,j=2", and its axis types ("auto"/"explicit").
MESH = "JAXRUN_MESH"
MESH_AXIS_TYPES = "JAXRUN_MESH_AXIS_TYPES"
# "1" makes the shim print the startup preflight table from process 0.
VERBOSE = "JAXRUN_VERBOSE"
# Where the rank comes from: "jaxrun" (the variables above), or a scheduler
# named in RANK_SOURCES.
RANK_SOURCE = "JAXRUN_RANK_SOURCE"

# The interactive console (``jaxrun -i``, the Jupyter kernel): host:port of the
# launcher's listener, which process 0 connects to, and the per-session secret
# it proves itself with (process 0 takes both out of its environment).
CONSOLE_ADDRESS = "JAXRUN_CONSOLE_ADDRESS"
CONSOLE_SECRET = "JAXRUN_CONSOLE_SECRET"

# -- read by the launcher and its helpers -------------------------------------
NO_PRELOAD = "JAXRUN_NO_PRELOAD"  # "1": --no-preload by default
# The scheduler task channel: host:port of the launcher's listener, and the
# per-run secret that proves a connection belongs to the run.
TASK_CHANNEL = "JAXRUN_TASK_CHANNEL"
TASK_SECRET = "JAXRUN_TASK_SECRET"
# Optional, read by the launcher: the address (or name) the task channel binds
# and tells the tasks, for a launcher host whose name resolves to an address
# the compute nodes cannot reach (a loopback alias, the wrong network).
TASK_CHANNEL_HOST = "JAXRUN_TASK_CHANNEL_HOST"
# --devices-per-process K under a scheduler: which tasks share a node is known
# only once the step starts, so each task's agent turns its local rank r into
# JAX_LOCAL_DEVICE_IDS r*K ... r*K+K-1 itself.
TASK_DEVICES_PER_PROCESS = "JAXRUN_TASK_DEVICES_PER_PROCESS"
# The pytest plugin's private folder for one marked test's controllers.
PYTEST_WORKDIR = "JAXRUN_PYTEST_WORKDIR"
# Failure injection for jaxrun's own tests: comma-separated names of launcher
# threads that raise at once when they start (see core.backend.start_thread).
INJECT_THREAD_FAULT = "JAXRUN_INJECT_THREAD_FAULT"
# "1": take the portable path wherever jaxrun could use a Linux-only facility
# (read only by jaxrun.portable), so that the tests prove those paths on Linux.
PORTABLE = "JAXRUN_PORTABLE"
# Where a process cannot be a child subreaper, it puts this variable with a
# value of its own in its children's environment, so that its daemons can be
# found once they have left its process tree (see core.reaper).
ORPHAN_MARK = "JAXRUN_ORPHAN_MARK"
# An SSH host's preloading server's name (portable.server_address): it travels
# in the environment frame on stdin, never on a command line, where every user
# of the host could read it and bind the name first; each far end takes it out
# of its environment before anything inherits it.
FORKSERVER_NAME = "JAXRUN_FORKSERVER_NAME"

# JAX's own variables, set for code that reads them directly.
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
JAX_COORDINATOR_BIND_ADDRESS = "JAX_COORDINATOR_BIND_ADDRESS"
JAX_PLATFORMS = "JAX_PLATFORMS"
JAX_NUM_CPU_DEVICES = "JAX_NUM_CPU_DEVICES"
JAX_LOCAL_DEVICE_IDS = "JAX_LOCAL_DEVICE_IDS"
JAX_COMPILATION_CACHE_DIR = "JAX_COMPILATION_CACHE_DIR"
JAX_ENABLE_COMPILATION_CACHE = "JAX_ENABLE_COMPILATION_CACHE"

# Variables forwarded to remote hosts in addition to user-chosen ones.
CONTRACT_PREFIXES = ("JAXRUN_", "JAX_")

# (rank, count, local rank) variables of the schedulers a child can take its
# rank from; "mpi" is the older name of "mpirun", still accepted.
RANK_SOURCES = {
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    "mpirun": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
}
RANK_SOURCES["mpi"] = RANK_SOURCES["mpirun"]
# How many tasks share a task's node, per rank source: a variable that holds
# Slurm's compressed per-node list ("2(x3),1", or one count) and the one that
# holds this node's index in it (None: the list is this node's count).
LOCAL_COUNT_SOURCES = {
    "slurm": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"),
    "mpirun": ("OMPI_COMM_WORLD_LOCAL_SIZE", None),
}
LOCAL_COUNT_SOURCES["mpi"] = LOCAL_COUNT_SOURCES["mpirun"]
LAUNCHER_RANK_NAMES = (PROCESS_ID, NUM_PROCESSES, LOCAL_PROCESS_ID)


# -- command lines ---------------------------------------------------------------
# The stable entry users may put in their own scripts (Slurm recipes, manifests).
SHIM_MODULE = "jaxrun.shim"
FORKSERVER_AGENT_MODULE = "jaxrun.backends.forkserver.server"
SSH_AGENT_MODULE = "jaxrun.backends.ssh.session_agent"
# The preflight each host's ControlMaster session runs, and the host agent that
# session then becomes (its title in ps).
SSH_PREFLIGHT_MODULE = "jaxrun.backends.ssh.preflight"
SSH_HOST_AGENT_MODULE = "jaxrun.backends.ssh.host_agent"
# What brings a process's finished traces home from an SSH host.
SSH_TRACES_MODULE = "jaxrun.backends.ssh.traces_agent"
SCHEDULER_AGENT_MODULE = "jaxrun.backends.scheduler.task_agent"
RAY_DRIVER_MODULE = "jaxrun.backends.ray.driver"
RAY_ACTOR_MODULE = "jaxrun.backends.ray.actor"
PYTEST_CONTROLLER_MODULE = "jaxrun.child.controllers.pytest_run"
# What every controller of an interactive session runs instead of a script.
INTERACTIVE_CONTROLLER_MODULE = "jaxrun.child.controllers.console"
# What every process of `jaxrun probe` (and of --probe before a launch) runs.
PROBE_MODULE = "jaxrun.child.controllers.probe"
# XLA's own flags; the probe adds one for its CPU matmul.
XLA_FLAGS = "XLA_FLAGS"
# The pytest marker, as the plugin (parent side) and each controller's pytest declare it.
PYTEST_MARKER_HELP = (
    "jaxrun(n=2, cpu_devices=None, mesh=None, timeout=None): "
    "run this test in n jaxrun controllers; it passes when all of them pass"
)


# -- divergence: --flight-recorder and --check-divergence ------------------------------
# "K": each controller keeps its last K executions of compiled programs and writes
# them into its stderr log with every stack dump (the block below).  Unset: off.
FLIGHT_RECORDER = "JAXRUN_FLIGHT_RECORDER"
FLIGHT_RECORDER_DEFAULT = 64
# The most entries a block may hold: the summary reads a log's last megabyte only.
FLIGHT_RECORDER_MAX = 4096
# "1": before each execution of a program that spans processes, the processes agree
# on it through the coordination service; the first to differ stops the job.
CHECK_DIVERGENCE = "JAXRUN_CHECK_DIVERGENCE"
# --checks: the default checks of the guide's silent mistakes (programs that part,
# replicas that differ).  "on" (the default, and what an unset variable means): the
# programs every process uses agree, and replicas are sampled; "strict": every call
# that builds an array is checked, and a jax without the hook points refuses to run;
# "off": nothing is patched.
CHECKS = "JAXRUN_CHECKS"
CHECKS_ON, CHECKS_OFF, CHECKS_STRICT = "on", "off", "strict"
CHECKS_MODES = (CHECKS_ON, CHECKS_OFF, CHECKS_STRICT)

# Where a controller was when it wrote its block.  A process whose script returned
# but which has not exited waits for its peers in JAX's shutdown barrier.
IN_SCRIPT = "in the script"
SCRIPT_RETURNED = "finished the script"
IN_SHUTDOWN = "finished the script, waiting in JAX's shutdown"
