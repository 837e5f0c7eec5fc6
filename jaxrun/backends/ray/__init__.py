"""``--launcher ray``: each controller under one Ray actor of a placement group.

``backend.py`` holds ``RayBackend`` (jaxrun's own process), the Ray driver it
starts per attempt (``--driver``, a child process on this machine) and the
actor's body, which runs the scheduler's task agent at the far end.
"""
