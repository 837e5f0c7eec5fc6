"""Existing schedulers as backends: Slurm (``srun``) and Open MPI (``mpirun``).

In jaxrun's own process: ``backend.py`` (``SchedulerBackend`` and the pure
command lines), ``step.py`` (one scheduler step per attempt), ``channel.py``
(the launcher's end of the task channel) and ``child.py`` (each rank's Child).

At the far end, in each task: ``task_agent.py``.
"""
