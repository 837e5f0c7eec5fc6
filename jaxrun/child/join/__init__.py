"""Before the script: the environment, the addresses, the join, the preflight, the mesh."""
