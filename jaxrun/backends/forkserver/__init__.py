"""The preloading fork server: one process that has imported jax forks each controller.

- ``client.py`` runs in jaxrun's own process (``ForkServerBackend``) and, on an
  SSH host, inside the host agent: it starts the server and asks it for children.
- ``server.py`` is the far end: the server itself, a process of its own.
"""
