"""Shared by the timeout patterns: end a process that waits far past its timeout.

A script whose timeout JAX ignored would otherwise wait out JAX's defaults
(100 s for heartbeats, 300 s for shutdown) and make the suite crawl.
"""
import os
import threading
import time


def start(seconds: float) -> None:
    def fire():
        time.sleep(seconds)
        print(f"still waiting after {seconds} s", flush=True)
        os._exit(3)

    threading.Thread(target=fire, daemon=True).start()
