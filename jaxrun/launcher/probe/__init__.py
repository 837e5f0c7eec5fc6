"""``jaxrun probe`` and ``--probe``: a short job that measures every host's
compute and links with JAX (``jaxrun.child.controllers.probe``), read here into a
verdict (``verdict``: the rule), shown (``table``) and used by the launch
(``first``: which hosts the job starts on).  The run loop runs the probe's
job as it runs an attempt; nothing here starts a process."""
