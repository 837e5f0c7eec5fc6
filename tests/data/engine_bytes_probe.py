"""Writes a known byte stream to stdout and stderr: ``engine_bytes_probe.py RANK SIZE``.

The tests import ``payload`` to know what each log file must hold.  Every byte
value occurs (so newlines fall at random places and most lines are not
UTF-8), and each stream ends with an unfinished line that arrives in a write
of its own, the case a line-based log writer would drop.
"""

import random
import sys
import time

STEP = 1 << 17  # bytes per write: a few MB cross the pipe in many reads


def payload(rank: int, size: int) -> tuple[bytes, bytes]:
    rng = random.Random(rank)
    out = rng.randbytes(size) + b"\n"
    err = b"stderr \xc3\x28 is not UTF-8\n" + rng.randbytes(size // 16) + b"\n"
    return (out + b"unfinished stdout line %d \xff\xfe" % rank,
            err + b"unfinished stderr line %d \x80" % rank)


def main() -> None:
    rank, size = int(sys.argv[1]), int(sys.argv[2])
    out, err = payload(rank, size)
    last_out, last_err = out.rindex(b"\n") + 1, err.rindex(b"\n") + 1
    for stream, data, cut in ((sys.stdout.buffer, out, last_out), (sys.stderr.buffer, err, last_err)):
        for i in range(0, cut, STEP):
            stream.write(data[i:min(i + STEP, cut)])
            stream.flush()
    # Let the reader drain the complete lines first, so the unfinished ones
    # come in reads that hold no newline at all.
    time.sleep(0.2)
    for stream, data, cut in ((sys.stdout.buffer, out, last_out), (sys.stderr.buffer, err, last_err)):
        stream.write(data[cut:])
        stream.flush()


if __name__ == "__main__":
    main()
