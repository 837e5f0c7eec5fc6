"""The SSH backend: controllers on the hosts of ``--hosts``/``-H``, over the system's ssh client.

In jaxrun's own process: ``backend.py`` (``SshBackend``), ``connections.py`` (the
ControlMasters, the preflight, the forwards), ``children.py`` (each remote
process's Child), ``stream.py`` (what that child takes out of its stderr),
``commands.py`` (every command line, pure) and ``sync.py`` (``--sync``).

At the far end, on each host: ``preflight.py`` (the checks before launch),
``host_agent.py`` (one per host, runs its processes over channels),
``session_agent.py`` (one per SSH session, where a host refuses channels) and
``traces_agent.py`` (a process's finished traces, home as one tar stream).
"""
