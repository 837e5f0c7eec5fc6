"""The error of a process that cannot join its job (``child.join.bootstrap``):
its own module, below both the bootstrap and the preflight's version check
that raise it, and the shim that reports it."""


class BootstrapError(RuntimeError):
    """The process cannot join the job; the message says why."""
