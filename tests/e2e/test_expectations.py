"""What users of torchrun, mpirun and Slurm expect from a launcher: process
titles that say which process is which, resource figures in the report,
console timestamps, and the logs of a past run on demand."""

from __future__ import annotations

import json
import os
import re
import time

import psutil
import pytest
from fixtures.jobs import TOKEN, processes_with_token

pytestmark = pytest.mark.timeout(120)

SLEEPS = "import sys, time\nprint('up', flush=True)\ntime.sleep(float(sys.argv[1]))\n"


def test_each_controller_is_titled_with_its_rank_and_script(launch, tmp_path):
    script = tmp_path / "train_step.py"
    script.write_text(SLEEPS)
    job = launch("-n", 3, "--log-dir", tmp_path / "logs", script, "30")
    deadline = time.monotonic() + 60
    titles: list[str] = []
    while time.monotonic() < deadline:
        titles = []
        for proc in processes_with_token(os.environ[TOKEN]):
            try:
                words = [w for w in proc.cmdline() if w]
            except psutil.Error:
                continue
            if words and words[0].startswith("jaxrun: process "):
                titles.append(" ".join(words))
        if len(titles) == 3:
            break
        time.sleep(0.2)
    assert sorted(titles) == [f"jaxrun: process {r}/3 train_step.py 30" for r in range(3)], titles
    # The title costs the environment nothing: the leak guard still finds every controller by it.
    job.kill()
