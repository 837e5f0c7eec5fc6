"""Looking into a running job from another terminal: ``jaxrun stacks`` and
``jaxrun top`` (``jaxrun profile`` too).  They reach the job only through
its control channel (``launcher/channel.py``, ``wire/inspect.py``):

- ``find.py``: which job (the newest running one of this user's, or
  ``--run RUN_ID``), and one request to it;
- ``stacks.py``: every process's stacks, grouped by the main thread's frames;
- ``top.py``: the live table of processes (rich draws it; ``--once`` prints
  one plain table);
- ``profile.py``: a trace of every process, gathered into one XProf session.
"""
