"""``--launcher ray``: each controller under one Ray actor of a placement group.

``backend.py`` holds ``RayBackend`` (jaxrun's own process) and its client of
the attempt's Ray driver; ``driver.py`` is that driver (a child process on
this machine), ``actor.py`` the actor's body and the task agent it starts at
the far end, and ``words.py`` what the driver and the launcher say to each
other.
"""
