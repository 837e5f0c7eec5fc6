"""Every message between two of jaxrun's processes, one module per protocol,
each imported by both of its ends, so that a message is spelled once:

- ``encoding``: the one encoding (``message``, ``Message``, ``decode``,
  ``WireError``; a line per message, or a frame where file descriptors
  travel with it);
- ``forkserver``: the fork server's frames;
- ``ssh``: the SSH far ends' channels, ``Spawn``, signal lines, the
  environment frame and the in-band markers and report home;
- ``preflight``: what each SSH host checks before a launch;
- ``tasks``: the scheduler task channel (srun, mpirun, a Ray actor);
- ``console``: the interactive session (``jaxrun -i``, the Jupyter kernel);
- ``inspect``: the control channel of a running jaxrun (``jaxrun stacks``,
  ``jaxrun top``);
- ``controller``: the words every far end says about its controller (its
  streams, ``Started``, ``Signal``, ``Exit``), which the protocols above
  re-export.

A caller imports the protocol it speaks (``from jaxrun.wire import encoding,
tasks``) and names the words through it (``tasks.TaskHello``).  A backend that
speaks only with a helper of its own may declare its words in its own module
(``backends/ray/words.py``), with ``encoding.message``.
"""

# A process loads the protocols it speaks, and no more (the preloading server
# starts faster for it); ``encoding.decode`` loads the rest the first time it
# meets a word it does not know, so every word of this version is known.
