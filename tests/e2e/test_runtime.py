"""Runtime helpers and the global mesh, in real multi-process runs through the CLI.

Each launch costs a few seconds of jax start-up per process, so one child
script (runtime_checks.py) runs many checks per launch and reports each as a
``CHECK {json}`` line that these tests parse.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest
from fixtures.jobs import DATA, JAXRUN, TOKEN, wait_gone

CHECKS = DATA / "runtime_checks.py"


def parse_checks(stdout: str) -> dict[str, dict[int, dict]]:
    """{check name: {process: record}} from the rank-prefixed console output."""
    found: dict[str, dict[int, dict]] = {}
    for line in stdout.splitlines():
        _, marker, payload = line.partition("CHECK ")
        if marker:
            record = json.loads(payload)
            found.setdefault(record["check"], {})[record["process"]] = record
    return found


def assert_all_ok(checks, names, num_processes):
    for name in names:
        per_process = checks.get(name, {})
        assert sorted(per_process) == list(range(num_processes)), f"{name}: reports from {sorted(per_process)}"
        failed = {p: r.get("tb") or r.get("error") for p, r in per_process.items() if not r["ok"]}
        assert not failed, f"{name} failed: {failed}"


@pytest.fixture(scope="module")
def general_4x2(tmp_path_factory):
    """One 4x2 run, no --mesh: every general check (shared by several tests).
    ``--checks off``: replicas_identical_catches_mismatch builds differing
    replicas on purpose, for assert_replicas_identical to find, which the
    default replica check would stop first."""
    # Module scope runs outside the function-scoped leak guard, so guard here.
    token = uuid.uuid4().hex
    logs = tmp_path_factory.mktemp("logs")  # not the shared $TMPDIR/jaxrun-logs
    proc = subprocess.run(
        JAXRUN + ["--timeout", "90", "--log-dir", str(logs), "-n", "4", "--cpu-devices", "2", "--checks", "off",
                  str(CHECKS), "general"],
        capture_output=True, text=True, timeout=120, env={**os.environ, TOKEN: token}, start_new_session=True,
    )
    leftover = wait_gone(token, within=5.0)
    for p in leftover:
        p.kill()
    assert not leftover, f"processes outlived the run: {leftover}"
    return proc.returncode, parse_checks(proc.stdout), proc.stdout, proc.stderr


GENERAL = [
    "local_slices_match_oracle",
    "make_global_array_loads_each_slice_once",
    "make_global_array_rejects_wrong_shape",
    "replica_input_index_follows_replicas",
    "replica_input_index_pure_data_parallel",
    "replicas_identical_passes",
    "replicas_identical_catches_mismatch",
    "same_across_processes",
    "allgather_keeps_the_store_small",
    "guide_cross_process_transfer",
]
MESH = ["global_mesh_installed", "hybrid_mesh_leading_axis_spans_processes"]
# Their meshes name processes 0 to 3 one by one: runtime_checks.py runs them in 4-process runs only.
FOUR_PROCESSES = ["replica_input_index_rejects_overlapping_streams", "guide_pipeline_transfer"]


def assert_own_shape_error(checks):
    # jaxrun's message, naming the loader's slice; JAX would raise a ValueError
    # of its own without jaxrun's check, so the type alone proves nothing.
    for record in checks["make_global_array_rejects_wrong_shape"].values():
        m = re.fullmatch(r"load\((\[\d+:\d+\])\) returned shape \(3,\), expected \(2,\)", record["message"])
        assert m and m[1] in record["slices"], record


@pytest.mark.timeout(150)
def test_general_checks_4x2(general_4x2):
    code, checks, out, err = general_4x2
    assert code == 0, err[-3000:]
    assert sorted(checks) == sorted(GENERAL + FOUR_PROCESSES)
    assert_all_ok(checks, checks, 4)
    assert checks["local_slices_match_oracle"][0]["cases"] == 16
    assert_own_shape_error(checks)


@pytest.mark.timeout(150)
def test_replica_streams_follow_the_guide_layout(general_4x2):
    _, checks, _, _ = general_4x2
    streams = {p: (r["index"], r["count"], r["blocks"])
               for p, r in checks["replica_input_index_follows_replicas"].items()}
    # Processes 0 and 2 share replicas 0-1, processes 1 and 3 share replicas 2-3.
    assert streams == {0: (0, 2, [0, 1]), 2: (0, 2, [0, 1]), 1: (1, 2, [2, 3]), 3: (1, 2, [2, 3])}
    overlap = checks["replica_input_index_rejects_overlapping_streams"][0]["message"]
    assert "overlap without being equal" in overlap
    pure = {p: (r["index"], r["count"]) for p, r in checks["replica_input_index_pure_data_parallel"].items()}
    assert pure == {p: (p, 4) for p in range(4)}


@pytest.mark.timeout(150)
def test_mismatch_messages_name_processes(general_4x2):
    _, checks, _, _ = general_4x2
    message = checks["replicas_identical_catches_mismatch"][0]["message"]
    assert "slice [0:1, 0:2]" in message
    assert "cpu:0 (process 0)" in message and "cpu:4096 (process 2)" in message
    assert "(process 1)" in message and "(process 3)" in message
    seed = checks["same_across_processes"][3]["message"]
    assert seed == "seed differs across processes: 0 on processes 0, 2; 1 on processes 1, 3"


@pytest.mark.timeout(150)
def test_guide_cross_process_transfer_needs_no_flags(general_4x2):
    _, checks, _, _ = general_4x2
    assert_all_ok(checks, ["guide_cross_process_transfer", "guide_pipeline_transfer"], 4)
    # The second half of the devices (processes 2 and 3) received the data.
    assert {p: r["shards"] for p, r in checks["guide_cross_process_transfer"].items()} == {0: 0, 1: 0, 2: 2, 3: 2}


@pytest.mark.timeout(90)
@pytest.mark.both_modes
def test_mesh_flag_installs_global_mesh(jaxrun):
    code, out, err = jaxrun("-v", "-n", "4", "--cpu-devices", "2", "--mesh", "i=4,j=2", CHECKS, "mesh", timeout=80)
    assert code == 0, err[-3000:]
    checks = parse_checks(out)
    assert sorted(checks) == MESH
    assert_all_ok(checks, MESH, 4)
    for p, record in checks["global_mesh_installed"].items():
        assert record["shape"] == {"i": 4, "j": 2}
        assert record["axis_types"] == ["AxisType.Explicit"] * 2  # the default, as jax.make_mesh's
        assert record["sum"] == pytest.approx(-0.12398731708526611)  # the guide's printed result
        assert record["shards"] == [[list(range(8 * p, 8 * p + 4))], [list(range(8 * p + 4, 8 * p + 8))]]
    # -v: process 0 prints the preflight table, one row per process (devices
    # are not listed: that would create jax's backend before the script could
    # configure it).
    assert "jaxrun: preflight" in err
    rows = [line.split()[1:] for line in err[err.index("jaxrun: preflight"):].splitlines()[1:6]]
    assert rows[0] == ["process", "host", "pid", "jax", "jaxlib", "python"]
    assert [row[0] for row in rows[1:]] == ["0", "1", "2", "3"]
    assert len({int(row[2]) for row in rows[1:]}) == 4  # four processes, four pids


@pytest.mark.timeout(90)
def test_inferred_mesh_and_layouts_2x4(jaxrun):
    code, out, err = jaxrun("-n", "2", "--cpu-devices", "4", "--mesh", "data=-1", "--mesh-axis-types", "auto",
                            "--checks", "off", CHECKS, "mesh", "general", timeout=80)  # as general_4x2's
    assert code == 0, err[-3000:]
    checks = parse_checks(out)
    assert sorted(checks) == sorted(MESH + GENERAL)
    assert_all_ok(checks, checks, 2)
    assert checks["global_mesh_installed"][1]["shape"] == {"data": 8}
    assert checks["global_mesh_installed"][1]["axis_types"] == ["AxisType.Auto"]
    assert_own_shape_error(checks)


@pytest.mark.timeout(60)
def test_mesh_that_does_not_fit_fails_clearly(jaxrun, tmp_path):
    script = tmp_path / "never.py"
    script.write_text("print('user code ran')\n")
    code, out, err = jaxrun("-n", "2", "--cpu-devices", "2", "--mesh", "i=3,j=2", script, timeout=50)
    assert code == 1
    assert "user code ran" not in out
    assert "mesh i=3,j=2 needs 6 devices, but the job has 4 devices" in err


@pytest.mark.timeout(30)
def test_bad_mesh_syntax_is_a_usage_error(jaxrun, tmp_path):
    script = tmp_path / "never.py"
    script.write_text("print('user code ran')\n")
    code, out, err = jaxrun("--mesh", "i=-1,j=-1", script, timeout=20)
    assert code == 2
    assert "more than one -1" in err and "user code ran" not in out


def test_help_does_not_import_jax():
    code = "import sys; from jaxrun import cli, meshspec; import jaxrun; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
