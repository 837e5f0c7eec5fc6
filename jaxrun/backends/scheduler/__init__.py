"""Existing schedulers as backends: Slurm (``srun``) and Open MPI (``mpirun``).

In jaxrun's own process: ``options.py`` (each engine's options type, built
from the command line), ``engines.py`` (which backend takes which options),
``backend.py`` (``SchedulerBackend``, what both engines share), ``slurm.py``
and ``mpirun.py`` (each engine's own: its command line, its ``StepProcess``,
Slurm's node checks), ``step.py`` (the shared step: the task channel, the
ranks, the coordinator), ``channel.py`` (the launcher's end of the task
channel) and ``child.py`` (each rank's Child).

At the far end, in each task: ``task_agent.py``.
"""
