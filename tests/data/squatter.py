"""Another user's plants where a job of root's makes or reads its files, with
nothing but the standard library (run as ``nobody`` by
tests/e2e/test_security_files.py).  Each prints one JSON line when its stdin
closes (the test's "stop"), after saying "ready" once its plant is there:

    python squatter.py lock PATH TEXT      PATH (0666) says TEXT, and is held
                                           with flock, as a running job's lock
    python squatter.py listen PATH         listen on a Unix socket at PATH and
                                           count what comes
    python squatter.py links FOLDER TARGET SECONDS
                                           a link to TARGET in FOLDER for each
                                           of the last SECONDS seconds, named as
                                           a profile session of that second,
                                           until stdin closes
"""

import fcntl
import json
import os
import socket
import sys
import threading
import time


def lock(path: str, text: str) -> dict:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    os.fchmod(fd, 0o666)
    os.write(fd, text.encode())
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready()
    sys.stdin.read()
    return {"held": True}


def listen(path: str) -> dict:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    taken = {"connections": 0, "bytes": 0}

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            taken["connections"] += 1
            conn.settimeout(2.0)
            try:
                while data := conn.recv(1 << 16):
                    taken["bytes"] += len(data)
            except OSError:
                pass
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    ready()
    sys.stdin.read()
    return taken


def links(folder: str, target: str, seconds: str) -> dict:
    """Until stdin closes: a link for each of the last SECONDS seconds, made
    as soon as that second has passed (a name chosen for a session of that
    second, and made later, meets the link)."""
    os.makedirs(folder, exist_ok=True)
    made = 0
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    ready()
    while not closed.wait(0.05):
        now = int(time.time())
        for second in range(now - int(seconds), now):
            name = time.strftime("%Y_%m_%d_%H_%M_%S", time.localtime(second))
            for count in ("", "-2", "-3"):
                try:
                    os.symlink(target, os.path.join(folder, name + count))
                    made += 1
                except FileExistsError:
                    pass
    return {"links": made}


def ready() -> None:
    print("ready", flush=True)


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    said = {"lock": lock, "listen": listen, "links": links}[kind](*args)
    print(json.dumps(said), flush=True)
