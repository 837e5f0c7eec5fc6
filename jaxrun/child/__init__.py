"""The child side: what runs inside every controller before and around the user's script.

The shim joins the job (``jax.distributed.initialize`` before any device is
touched), installs the mesh, and runs the script as the real ``__main__``.
It reads the contract only, and imports jax only when the script would.
"""
