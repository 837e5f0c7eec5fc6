"""What users of torchrun, mpirun and Slurm expect from a launcher: process
titles that say which process is which, resource figures in the report,
console timestamps, and the logs of a past run on demand."""

from __future__ import annotations

import os
import re
import time

import psutil
import pytest
from fixtures.jobs import TOKEN, processes_with_token

# Its scripts are plain Python: one launch mode, without the preloading server.
pytestmark = [pytest.mark.timeout(120), pytest.mark.plain_python]

SLEEPS = "import sys, time\nprint('up', flush=True)\ntime.sleep(float(sys.argv[1]))\n"


@pytest.mark.both_modes
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


PRINTS = "import os, sys\nprint('out', os.environ['JAXRUN_PROCESS_ID'])\nprint('err', file=sys.stderr)\n"


def test_timestamps_prefix_console_lines_and_leave_logs_exact(jaxrun, tmp_path):
    script = tmp_path / "prints.py"
    script.write_text(PRINTS)
    code, out, err = jaxrun("-n", 2, "--timestamps", "--log-dir", tmp_path / "logs", script)
    assert code == 0, err
    stamped = re.findall(r"^\d\d:\d\d:\d\d\.\d\d\d \[(\d)\] out \1$", out, re.M)
    assert sorted(stamped) == ["0", "1"], out
    assert (tmp_path / "logs" / "process-1.stdout").read_text() == "out 1\n"


def test_logs_last_shows_the_grouped_view_of_the_last_run(jaxrun, tmp_path):
    import subprocess
    import sys

    script = tmp_path / "prints.py"
    script.write_text(PRINTS)
    code, out, err = jaxrun("-n", 3, "--output", "grouped", script)  # the default, private log folder
    assert code == 0, err
    run_id = os.path.basename(re.search(r"jaxrun: logs in (\S+)", err).group(1))
    shown = subprocess.run([sys.executable, "-m", "jaxrun", "logs", "--last"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == out
    listing = subprocess.run([sys.executable, "-m", "jaxrun", "logs"], capture_output=True, text=True).stdout
    assert listing.startswith(f"{run_id}  exit 0  ") and "--output grouped" in listing.splitlines()[0]
    one = subprocess.run([sys.executable, "-m", "jaxrun", "logs", run_id, "--ranks", "2", "--output", "stream"],
                         capture_output=True, text=True)
    assert (one.stdout, one.stderr) == ("[2] out 2\n", "[2] err\n")
