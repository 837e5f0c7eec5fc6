"""Separate networks: hosts in their own network namespaces behind a bridge,
each hostname resolving to loopback on its own host (the hard case of many
Debian and Ubuntu machines), and a local run.  Whatever JAX opens to listen
(collectives, transfers, the coordination service) advertises an address the
peers can reach, and nothing listens on a wildcard address.
"""

from __future__ import annotations

import re
import time

import pytest
from fixtures.jobs import DATA, EXAMPLES, ROOT, TOKEN

PROBE = DATA / "listeners_probe.py"
WILDCARDS = {"0.0.0.0", "::", "::ffff:0.0.0.0"}


@pytest.fixture
def launch(start_job):
    return start_job


def listening(out: str) -> dict[int, set[str]]:
    found = {}
    for rank, addresses in re.findall(r"process (\d+) moved \d+ shards, allgather \[0, 1, 2, 3\], "
                                      r"listening on ([^\n]*)", out):
        found[int(rank)] = set(addresses.split())
    return found


@pytest.mark.timeout(120)
def test_a_local_run_listens_on_loopback_only(launch, tmp_path):
    job = launch("-n", 4, "--cpu-devices", 2, "--log-dir", tmp_path / "logs", PROBE)
    assert job.wait(90) == 0, job.stderr[-3000:]
    found = listening(job.stdout)
    assert sorted(found) == [0, 1, 2, 3], job.stdout[-3000:]
    for rank, addresses in found.items():
        assert addresses <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, (rank, addresses)


def netns_flags(hosts) -> list:
    return ["--ssh-config", hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN]


@pytest.mark.timeout(150)
def test_the_guides_toy_across_separate_networks(netns_hosts, launch, tmp_path, shared_dir):
    script = shared_dir / "toy.py"
    script.write_text((EXAMPLES / "toy.py").read_text())
    job = launch("-H", "hostA:2,hostB:2", *netns_flags(netns_hosts), "--cpu-devices", 2,
                 "--log-dir", tmp_path / "logs", script, "{process_id}", "{num_processes}", cwd=shared_dir)
    assert job.wait(120) == 0, job.stderr[-3000:]
    results = [line for line in job.stdout.splitlines() if "got result" in line]
    assert len(results) == 4 and {line.split("got result: ")[1] for line in results} == {"-0.12398731708526611"}, \
        job.stdout[-2000:]


@pytest.mark.timeout(150)
def test_collectives_and_transfers_across_separate_networks(netns_hosts, launch, tmp_path, shared_dir):
    script = shared_dir / "probe.py"
    script.write_text(PROBE.read_text())
    job = launch("-H", "hostA:2,hostB:2", *netns_flags(netns_hosts), "--cpu-devices", 2,
                 "--log-dir", tmp_path / "logs", script, cwd=shared_dir)
    assert job.wait(120) == 0, job.stderr[-3000:]
    found = listening(job.stdout)
    assert sorted(found) == [0, 1, 2, 3], job.stdout[-3000:]
    own = {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"}
    for rank, addresses in found.items():
        assert not addresses & WILDCARDS, (rank, addresses)
        assert addresses <= {netns_hosts.addresses[own[rank]], f"::ffff:{netns_hosts.addresses[own[rank]]}"}, \
            (rank, addresses)


@pytest.mark.timeout(120)
def test_a_host_that_cannot_reach_the_coordinator_is_named(netns_hosts, launch, tmp_path, shared_dir):
    script = shared_dir / "hello.py"
    script.write_text("print('hello')\n")
    a = netns_hosts.addresses["hostA"]
    with netns_hosts.block_tcp("hostB", to=a, how="drop"):
        t0 = time.monotonic()
        job = launch("-H", "hostA,hostB", *netns_flags(netns_hosts), "--connect-timeout", 3,
                     "--log-dir", tmp_path / "logs", script, cwd=shared_dir)
        code = job.wait(90)
        took = time.monotonic() - t0
    assert code == 2, job.stderr[-3000:]
    lines = job.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"jaxrun: error: hostB: cannot reach the coordinator at {a}:")
    assert "on hostA" in lines[0]
    # --connect-timeout 3 bounds the look: 4-5 s here, start-up included,
    # where a dropped SYN left to TCP would take minutes.  30 s holds a loaded
    # 2-core machine.
    assert took < 30, took
    assert not (tmp_path / "logs").exists()
