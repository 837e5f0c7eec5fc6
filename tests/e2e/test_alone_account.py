"""A job of one process waits for nobody (issue 71): the time its main
thread spends inside JAX without CPU (on an accelerator, the chip running
the step while the host blocks) is its programs', never "waiting"."""

from __future__ import annotations

import json

from fixtures.jobs import DATA


def test_a_process_alone_that_blocks_inside_jax_is_running_its_programs_not_waiting(jaxrun, tmp_path):
    report = tmp_path / "report.json"
    code, out, err = jaxrun("-n", 1, "--cpu-devices", 1, "--report", report, DATA / "alone_waits.py")
    assert code == 0, err
    assert "done" in out
    time = json.loads(report.read_text())["processes"][0]["time"]
    assert time is not None, report.read_text()
    assert time["programs"] >= 1.5, time  # four 0.5 s waits in block_until_ready, no CPU used
    assert time["waiting"] <= 0.1, time
