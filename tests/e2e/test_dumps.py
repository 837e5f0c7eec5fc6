"""A stack dump asked of a job (``kill -USR1`` on jaxrun, the stall watch's
probe, the survivors of a failure) reaches each controller alone, on every
backend: what the script started (a data loader's workers, a tool it runs)
lives on.  SIGUSR1's default action ends a process that has no handler for
it, and a probe of a healthy job used to end its tools with it."""

from __future__ import annotations

import re
import shutil
import signal
import time

import pytest
from fixtures.jobs import ROOT, TOKEN

SCRIPT = """
import multiprocessing, os, subprocess, sys, time
from pathlib import Path

def worker(release):
    while not os.path.exists(release):
        time.sleep(0.05)

if __name__ == "__main__":
    folder, rank = Path(sys.argv[1]), os.environ["JAXRUN_PROCESS_ID"]
    tool = subprocess.Popen(["sleep", "60"])  # a tool the script runs
    loader = multiprocessing.get_context("spawn").Process(target=worker, args=(str(folder / "release"),))
    loader.start()  # a data loader's worker
    (folder / f"ready-{rank}").write_text("")
    while not (folder / "release").exists():
        time.sleep(0.05)
    loader.join()
    print(f"tool {'alive' if tool.poll() is None else tool.returncode}, loader {loader.exitcode}", flush=True)
    tool.kill()
    tool.wait()
"""

BACKENDS = ["preload", "no-preload", "ssh", "slurm", "mpirun"]


def backend_flags(request, backend: str, monkeypatch) -> list:
    if backend == "no-preload":
        monkeypatch.setenv("JAXRUN_NO_PRELOAD", "1")
    elif backend == "ssh":
        hosts = request.getfixturevalue("sshd_hosts")
        return ["-H", "hostA:1,hostB:1", "--ssh-config", hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN]
    elif backend == "slurm":
        request.getfixturevalue("slurm_cluster")
        return ["--launcher", "slurm"]
    elif backend == "mpirun":
        if not shutil.which("mpirun"):
            pytest.skip("Open MPI is not installed (apt-get install openmpi-bin)")
        return ["--launcher", "mpirun"]
    else:
        monkeypatch.delenv("JAXRUN_NO_PRELOAD", raising=False)
    return []


def wait_for(check, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dump_asked_of_the_job_reaches_its_controllers_alone(request, monkeypatch, start_job, shared_dir, backend):
    flags = backend_flags(request, backend, monkeypatch)
    script, logs = shared_dir / "job.py", shared_dir / "logs"
    script.write_text(SCRIPT)
    job = start_job(*flags, "-n", 2, "--log-dir", logs, script, shared_dir, env={TOKEN: shared_dir.name})
    wait_for(lambda: all((shared_dir / f"ready-{r}").exists() for r in range(2)) or job.proc.poll() is not None,
             90, "the processes did not start their tools")
    assert job.proc.poll() is None, job.wait()
    job.proc.send_signal(signal.SIGUSR1)  # as `kill -USR1 <jaxrun>`: a dump of every process
    dumped = [logs / f"process-{r}.stderr" for r in range(2)]
    wait_for(lambda: all(p.exists() and "Current thread 0x" in p.read_text() for p in dumped), 30,
             "no dump came")
    (shared_dir / "release").write_text("")
    assert job.wait(timeout=60) == 0, job.stderr
    for rank in range(2):
        assert f"[{rank}] tool alive, loader 0" in job.stdout, job.stdout + job.stderr
        text = (logs / f"process-{rank}.stderr").read_text()
        # Its wait loop, or the write of its ready file just before: the file exists from the
        # write's open on, and a loaded machine once dumped a process still in it (line 14).
        assert re.search(rf'File "{re.escape(str(script))}", line 1[4-7] in <module>', text), text
