"""How long an interactive session makes you wait: the console and the kernel.

    python bench/interactive.py [--runs 5] [-n 4] [--cpu-devices 2]

- console: from starting ``jaxrun -n N --cpu-devices D -i`` in a pseudo-terminal
  to its first prompt (every process joined, process 0 connected), and from
  typing the first statement (``import jax; jax.device_count()``) to its result;
- kernel: from ``start_new_kernel`` on a kernelspec that ``jaxrun kernel
  install`` wrote to the result of its first cell (the same statement).

Each run starts afresh and ends the session with Ctrl-D (a shutdown for the
kernel); the medians are printed.  Needs pexpect, and the jupyter extra for
the kernel (``pip install 'jaxrun[jupyter]' jupyter_client``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import JAXRUN, ROOT

FIRST = "import jax; jax.device_count()"


def console_once(launch: list[str]) -> tuple[float, float]:
    import pexpect

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as state:
        child = pexpect.spawn(JAXRUN[0], [*JAXRUN[1:], *launch, "-i"], env={**os.environ, "XDG_STATE_HOME": state},
                              cwd=str(ROOT), encoding="utf-8", timeout=120)
        try:
            child.expect_exact(">>> ")
            prompt = time.perf_counter() - start
            typed = time.perf_counter()
            child.sendline(FIRST)
            child.expect_exact(">>> ")
            first = time.perf_counter() - typed
            child.sendeof()
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
    if child.exitstatus != 0:
        raise RuntimeError(f"jaxrun -i exited {child.exitstatus}")
    return prompt, first


def kernel_once(name: str) -> float:
    from jupyter_client.manager import start_new_kernel

    start = time.perf_counter()
    manager, client = start_new_kernel(kernel_name=name, startup_timeout=120)
    try:
        reply = client.execute_interactive(FIRST, timeout=120, output_hook=lambda msg: None)
        took = time.perf_counter() - start
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the first cell failed: {reply['content']}")
    finally:
        manager.shutdown_kernel(now=False)
        client.stop_channels()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("-n", type=int, default=4)
    parser.add_argument("--cpu-devices", type=int, default=2)
    args = parser.parse_args()
    launch = ["-n", str(args.n), "--cpu-devices", str(args.cpu_devices)]
    prompts, firsts, kernels = [], [], []
    with tempfile.TemporaryDirectory() as prefix:
        subprocess.run([*JAXRUN, "kernel", "install", "--name", "bench", "--prefix", prefix, "--", *launch],
                       check=True, capture_output=True)
        os.environ["JUPYTER_PATH"] = os.path.join(prefix, "share", "jupyter")
        for run in range(args.runs):  # alternately, so that the machine's load hits both alike
            prompt, first = console_once(launch)
            prompts.append(prompt)
            firsts.append(first)
            kernels.append(kernel_once("bench"))
            print(f"  run {run + 1}/{args.runs}: first prompt {prompt:.2f} s, first result {first:.2f} s; "
                  f"kernel to its first cell's result {kernels[-1]:.2f} s", file=sys.stderr)
    print(f"jaxrun {' '.join(launch)} -i: first prompt after {statistics.median(prompts):.2f} s, "
          f"the first statement's result {statistics.median(firsts):.2f} s later (medians of {args.runs})")
    print(f"kernel ({' '.join(launch)}): start to the first cell's result {statistics.median(kernels):.2f} s "
          f"(median of {args.runs})")


if __name__ == "__main__":
    main()
