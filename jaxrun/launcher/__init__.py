"""The launcher: jaxrun's own process, from the parsed command line to the exit status.

Its rooms, in the order of a run's life: ``setup`` turns the command line's
values into one frozen ``RunConfig`` and one spec per process; ``run`` loops
over attempts; each ``attempt`` starts, watches and stops the processes, one
slot each; ``restarts.policy`` decides what follows every end; ``output``
carries every byte the processes print; ``interactive`` drives ``-i``; and
``control`` holds the run's stop state and its exit status.
"""
