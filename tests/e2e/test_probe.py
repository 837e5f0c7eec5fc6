"""``jaxrun probe`` and ``--probe``: four SSH hosts on separate networks, one
link slowed (tc tbf on both ends of hostC's veth) and one host held to a
fraction of a core (a CPU quota on hostD's sshd): the probe names exactly
those two, with what is slow, and a launch with spares starts on the rest
(one probe for both, to keep the suite's time; ``bench/probe.py`` runs
``jaxrun probe --json`` on the same hosts ten times).  The slowed hosts are
a module fixture (``fixtures.slowed``).  The same probe under Open MPI and Slurm, with
one task held to a fraction of a core; and a local one's table.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from fixtures.jobs import ROOT, TOKEN
from fixtures.slowed import CPU_SHARE, HAVE_CPU_QUOTA, cpu_quota


def ssh_flags(slowed) -> list:
    return ["--ssh-config", slowed.hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN, "--cpu-devices", 1]


def check_slowed_verdict(verdict: dict) -> None:
    """Exactly hostC (its links) and hostD (its compute) named, with what is slow."""
    rows = {row["host"]: row for row in verdict["hosts"]}
    assert sorted(rows) == ["hostA", "hostB", "hostC", "hostD"], verdict
    assert [rows[h]["verdict"] for h in sorted(rows)] == ["ok", "ok", "slow", "slow"], verdict
    assert rows["hostC"]["why"][0].startswith("every link slow") and not any(
        w.startswith("compute") for w in rows["hostC"]["why"]), verdict
    assert rows["hostD"]["why"][0].startswith("compute"), verdict
    assert list(verdict["named"]) == ["hostC", "hostD"] and verdict["exit"] == 1, verdict
    assert verdict["slow_links"] == [], verdict  # the link's slowness is hostC's: every pair through it is slow


@pytest.mark.timeout(180)
def test_the_probe_names_the_slow_two_and_a_launch_with_spares_starts_on_the_rest(slowed_hosts, jaxrun, tmp_path,
                                                                                   shared_dir):
    """One probe for both promises (the suite's budget): its verdict, and the
    launch it places.  bench/probe.py runs `jaxrun probe --json` on these
    hosts ten times."""
    script = shared_dir / "where.py"
    script.write_text("import socket, jax\n"
                      "print(f'process {jax.process_index()} of {jax.process_count()} on {socket.gethostname()}')\n")
    logs, report = tmp_path / "logs", tmp_path / "report.json"
    code, out, err = jaxrun("--probe", "--min-hosts", 2, "--hosts", slowed_hosts.hosts_file(tmp_path),
                            *ssh_flags(slowed_hosts), "--log-dir", logs, "--report", report, script,
                            cwd=shared_dir, timeout=150)
    assert code == 0, err[-3000:]
    verdict = json.loads((logs / "probe.json").read_text())  # as `jaxrun probe --json` prints it
    check_slowed_verdict(verdict)
    table = [line.removeprefix("jaxrun: probe: ") for line in err.splitlines() if line.startswith("jaxrun: probe: ")]
    rows = {line.split()[0]: line for line in table if line.startswith("host")}
    assert rows["hostA"].endswith("  ok") and rows["hostB"].endswith("  ok"), err[-3000:]
    assert "SLOW: every link slow" in rows["hostC"] and "SLOW: compute" in rows["hostD"], err[-3000:]
    assert "named: hostC, hostD" in table, err[-3000:]
    left = [line for line in table if line.startswith("leaving out")]
    assert len(left) == 1 and left[0].startswith("leaving out hostC, hostD ("), err[-3000:]
    assert "hostC: every link slow" in left[0] and "hostD: compute" in left[0], left
    assert left[0].endswith("starting 2 processes on hostA, hostB"), left
    assert sorted(line.split("] ", 1)[1] for line in out.splitlines() if " of 2 on " in line) == \
        ["process 0 of 2 on node-a", "process 1 of 2 on node-b"], out
    data = json.loads(report.read_text())
    assert data["probe"] == verdict, data["probe"]
    assert [d["host"] for d in data["attempts"][0]["dropped"]] == ["hostC", "hostD"], data["attempts"]
    code, shown, _ = jaxrun("logs", "--log-dir", tmp_path, "logs", timeout=30)
    assert code == 0 and "jaxrun: the probe's table" in shown and "named: hostC, hostD" in shown, shown


@pytest.mark.timeout(120)
def test_a_local_probe_prints_its_verdict_as_json_and_exits_as_it_says(jaxrun, tmp_path):
    code, out, err = jaxrun("probe", "-n", 2, "--cpu-devices", 1, "--json", "--log-dir", tmp_path / "logs")
    verdict = json.loads(out)
    assert [row["rank"] for row in verdict["hosts"]] == [0, 1], out
    assert all(row["compute_ms"] > 0 and len(row["links"]) == 1 for row in verdict["hosts"]), out
    assert code == verdict["exit"] == (1 if verdict["named"] else 0), (code, out, err[-2000:])
    table = (tmp_path / "logs" / "probe.txt").read_text().splitlines()  # what `jaxrun probe` prints without --json
    assert table[0].split()[:2] == ["HOST", "COMPUTE"] and table[3].startswith("all-reduce of 8 MiB over 2"), table
    assert [line.split()[0].rsplit("/", 1)[1] for line in table[1:3]] == ["0", "1"], table  # HOST/rank: one machine


# What --python names under the engine (``python -m MODULE ARGS``, for the task
# agent and for the process it starts).  The process of rank {rank} imports jax
# at the core's full speed, then joins the CPU group {group} (held to a
# fraction of a core) and runs as ``python -m`` would: the probe's step, what
# the probe times, runs slowed.  Importing jax at a twentieth of a core took
# 30-40 s of the test's time, and is not what the probe measures.  Everything
# else, the task agents included, runs as it would.
SLOWED_TASK = """#!{python}
import os, runpy, sys
if sys.argv[1:3] != ["-m", "jaxrun.shim"] or os.environ.get("{rank_variable}") != "{rank}":
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
import jax  # noqa: F401,E402
with open("{group}/cgroup.procs", "w") as procs:
    procs.write(str(os.getpid()))
sys.argv, sys.path[0] = sys.argv[2:], os.getcwd()  # as python -m sets them
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
RANK_VARIABLE = {"mpirun": "OMPI_COMM_WORLD_RANK", "slurm": "SLURM_PROCID"}


@pytest.mark.skipif(not HAVE_CPU_QUOTA, reason="needs root and the cgroup v1 cpu controller")
@pytest.mark.timeout(150)
@pytest.mark.parametrize("engine", ["mpirun", "slurm"])
def test_under_a_scheduler_the_probe_names_the_slowed_task_and_strict_starts_no_job(engine, request, run_jaxrun,
                                                                                     tmp_path, monkeypatch):
    if engine == "mpirun":
        if not shutil.which("mpirun"):
            pytest.skip("Open MPI is not installed (apt-get install openmpi-bin)")
        monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")  # as test_mpirun.py: more tasks than cores
    else:
        request.getfixturevalue("slurm_cluster")
    script = tmp_path / "job.py"
    script.write_text("print('the job ran')\n")
    # Half the SSH hosts' share: the healthy task shares a loaded machine (the suite's other
    # worker), and read 2.9x faster than one held to a tenth of a core once, under the 3x the probe names.
    with cpu_quota(None, CPU_SHARE / 2) as group:
        python = tmp_path / "python"
        python.write_text(SLOWED_TASK.format(rank_variable=RANK_VARIABLE[engine], rank=1, group=group,
                                             python=sys.executable))
        python.chmod(0o755)
        code, out, err, _ = run_jaxrun("--probe=strict", "--launcher", engine, "-n", 2, "--cpu-devices", 1,
                                       "--python", python, "--log-dir", tmp_path / "logs", script, timeout=120)
    assert code == 1, err[-3000:]
    assert "the job ran" not in out + err, out  # neither the probe's step nor a job ran the script
    verdict = json.loads((tmp_path / "logs" / "probe.json").read_text())
    rows = verdict["hosts"]
    assert [row["rank"] for row in rows] == [0, 1], verdict
    assert list(verdict["named"]) == [rows[1]["host"]] and rows[1]["why"][0].startswith("compute"), verdict
    assert rows[0]["verdict"] == "ok", verdict
    assert f"jaxrun: probe: {rows[1]['host']}" in err and "jaxrun: --probe=strict: not starting (" in err, err[-3000:]
