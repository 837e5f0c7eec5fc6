"""What a script sees of itself as __main__, and pickling what it defines."""
import os
import pickle
import sys

import jax


def double(x):
    return 2 * x


class Point:
    def __init__(self, x):
        self.x = x


coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid)
print("__name__", __name__)
print("__file__ absolute", os.path.isabs(__file__), os.path.basename(__file__))
print("argv[0]", sys.argv[0])
print("sys.path[0] is the script folder", sys.path[0] == os.path.dirname(os.path.realpath(__file__)))
print("__builtins__ type", type(__builtins__).__name__)
print("__loader__ type", type(__loader__).__name__)
print("__spec__", __spec__)
print("dunder globals", sorted(k for k in globals() if k.startswith("__")))
print("sys.modules['__main__'] is this module", sys.modules["__main__"].__dict__ is globals())
print("pickled function", pickle.loads(pickle.dumps(double))(21))
print("pickled class", pickle.loads(pickle.dumps(Point(5))).x)
print("code filename absolute", os.path.isabs(double.__code__.co_filename))
