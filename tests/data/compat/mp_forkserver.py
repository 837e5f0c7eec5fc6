"""A multiprocessing pool with the forkserver start method inside each controller."""
import multiprocessing
import sys


def square(x):
    return x * x


if __name__ == "__main__":
    import jax

    coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    jax.distributed.initialize(coord, n, pid)
    with multiprocessing.get_context("forkserver").Pool(2) as pool:
        print("forkserver pool", pool.map(square, range(5)))
    print("process", jax.process_index(), "of", jax.process_count())
