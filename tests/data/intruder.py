"""Another user's moves against a job, with nothing but the standard library
(run as ``nobody`` by tests/e2e/test_security.py).  Each prints one JSON line
when its stdin closes (the test's "stop"):

    python intruder.py race PID...        bind every preloading server's name
                                          seen on a command line of PID's
                                          descendants, and take what comes
    python intruder.py standin NAME       listen on the abstract name NAME
                                          first, and take what comes
    python intruder.py idle HOST PORT N   hold N connections that never speak
    python intruder.py gloo HOST:PORT...  16 connections to each listener, the
                                          i-th saying Gloo's sequence number i
"""

import array
import json
import os
import re
import select
import socket
import struct
import sys
import threading
import time

NAME = re.compile(rb"jaxrun-\d+-[0-9a-f]{32}(?:-\d+)?")


class Taken:
    """What the connections to our listeners brought: bytes, descriptors."""

    def __init__(self):
        self.connections, self.bytes, self.fds, self.data = 0, 0, 0, b""

    def serve(self, listener: socket.socket) -> None:
        listener.setblocking(False)
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                select.select([listener], [], [], 0.5)
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.drain, args=(conn,), daemon=True).start()

    def drain(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        conn.settimeout(2.0)  # then hang up: the agent moves on
        try:
            while True:
                data, anc, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
                for level, kind, payload in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds = array.array("i")
                        fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
                        self.fds += len(fds)
                        for fd in fds:
                            os.close(fd)
                if not data:
                    break
                self.bytes += len(data)
                self.data += data
        except OSError:
            pass
        conn.close()


def descendants(roots: set[int]) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parents[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, grew = set(roots), True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found and pid not in found}
        found |= more
        grew = bool(more)
    return found


def race(roots: set[int]) -> dict:
    taken, seen, bound = Taken(), set(), []
    print("ready", flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        for pid in descendants(roots):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    words = f.read()
            except OSError:
                continue
            for name in NAME.findall(words):
                if name in seen:
                    continue
                seen.add(name)
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    listener.bind(b"\0" + name)
                    listener.listen(64)
                except OSError:
                    continue
                bound.append(name.decode())
                threading.Thread(target=taken.serve, args=(listener,), daemon=True).start()
        time.sleep(0.001)
    time.sleep(0.5)
    return {"seen": sorted(n.decode() for n in seen), "bound": bound, **report(taken)}


def standin(name: str) -> dict:
    taken = Taken()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    threading.Thread(target=taken.serve, args=(listener,), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()
    time.sleep(0.5)
    return report(taken)


def report(taken: Taken) -> dict:
    return {"connections": taken.connections, "bytes": taken.bytes, "fds": taken.fds,
            "data": taken.data.decode(errors="replace")[:100000]}


def idle(host: str, port: int, count: int) -> dict:
    held = []

    def one() -> None:
        try:  # past a full backlog, the kernel tries again as the listener takes one
            held.append(socket.create_connection((host, port), timeout=120))
        except OSError:
            pass

    tries = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for thread in tries:
        thread.start()
    deadline = time.monotonic() + 5  # those past a full backlog may wait: not for them
    for thread in tries:
        thread.join(max(0.0, deadline - time.monotonic()))
    print("connected", len(held), flush=True)
    sys.stdin.read()
    return {"held": len(held)}


def gloo(addresses: list[str]) -> dict:
    held, answered = [], 0
    for address in addresses:
        host, port = address.rsplit(":", 1)
        for seq in range(16):
            try:
                conn = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
                conn.sendall(struct.pack("<Q", seq))
            except OSError:
                continue
            held.append(conn)
    print("connected", len(held), flush=True)
    sys.stdin.read()
    for conn in held:
        conn.setblocking(False)
        try:
            answered += len(conn.recv(1 << 16))
        except OSError:
            pass
    return {"connected": len(held), "answered": answered}


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "race":
        result = race({int(p) for p in sys.argv[2:]})
    elif what == "standin":
        result = standin(sys.argv[2])
    elif what == "gloo":
        result = gloo(sys.argv[2:])
    else:
        result = idle(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    print(json.dumps(result), flush=True)
