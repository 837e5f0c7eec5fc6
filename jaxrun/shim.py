"""``python -m jaxrun.shim -- SCRIPT ARGS...``: the stable name of the child entry.

Users put this command in their own Slurm scripts and manifests, so it keeps
its name; the work is done in :mod:`jaxrun.child.shim`.
"""

if __name__ == "__main__":
    import sys

    from jaxrun.child.shim import main

    main(sys.argv[1:])
