"""Every example in examples/ runs under jaxrun and shows what the guide says it shows.

The expectations live in examples_expectations.py, one check per example.
Each example runs in the README's layout (4 processes x 2 CPU devices), and
a few also in a second layout where it teaches something (the guide's own 2x4
layout for replicas within a process, a single 8-device process for the toy).
They run with the preloading fork server (the default) only: what they test
is the example, not the launch path, which tests/e2e/test_local.py and the
other ``both_modes`` tests cover in both modes.
"""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
import yaml
from examples_expectations import CHECKS, FAILS, Layout, per_rank
from fixtures.jobs import EXAMPLES, ROOT

from jaxrun import contract
from jaxrun.child.join import bootstrap

README = EXAMPLES / "README.md"
DEPLOY = EXAMPLES / "deploy"
MAIN = Layout(4, 2)

# (example, layout) pairs beyond MAIN; each one is cheap (about 2 s preloaded).
SECOND_LAYOUTS = [
    ("toy", Layout(1, 8)),  # the guide: same blocks and result on one 8-device process
    ("devices", Layout(2, 4)),
    ("subset", Layout(2, 4)),  # the second half is all of process 1
    ("process_local", Layout(2, 4)),
    ("single_device", Layout(2, 4)),  # part 2 then covers every process
    ("replica_in_process", Layout(2, 4)),  # the guide's own layout for this example
    ("replica_across", Layout(2, 4)),  # every replica spans processes 0 and 1
]

CASES = [pytest.param(name, MAIN, id=f"{name}-{MAIN}") for name in sorted(CHECKS)] + [
    pytest.param(name, layout, id=f"{name}-{layout}") for name, layout in SECOND_LAYOUTS
]


def run_example(jaxrun, name: str, layout: Layout, *extra: str, timeout: float = 90):
    # The README's command, run from the repository root with a relative path.
    return jaxrun("-n", layout.processes, "--cpu-devices", layout.devices, *extra, f"examples/{name}.py",
                  cwd=ROOT, timeout=timeout)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, layout", CASES)
def test_example(jaxrun, name, layout):
    code, out, err = run_example(jaxrun, name, layout)
    assert code == (1 if name in FAILS else 0), err[-3000:]
    lines = per_rank(out)
    assert sorted(lines) == list(range(layout.processes)), out
    CHECKS[name](layout, lines)
    if name in FAILS:  # an example that shows a mistake jaxrun stops
        FAILS[name](layout, err)


def line_of(path, text: str) -> int:
    (number,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip() == text]
    return number


@pytest.mark.timeout(90)
# Where each process was: the summary's pointers do not depend on how the
# processes were started (test_matrix's hang cells dump the stacks in every
# mode and backend), so this runs in one mode, as every test does by default.
def test_hang_times_out_and_points_at_the_diverging_lines(jaxrun):
    # The deadline counts from the launch, start-up included: under a loaded run, 8 s once
    # ended the job while all four processes were still at the example's first device_put.
    code, out, err = run_example(jaxrun, "hang", MAIN, "--timeout", "15", timeout=60)
    assert code == 124, err[-3000:]
    assert "--timeout expired" in err
    script = EXAMPLES / "hang.py"
    barrier = line_of(script, 'jaxrun.assert_same_across_processes(config, what="config")')
    allreduce = line_of(script, "return float(jnp.sum(x * x))")
    # The script's path as python reports it: absolute, whatever the command line said.
    assert (f"process 2 was at {script}:{barrier} in check_config: "
            'jaxrun.assert_same_across_processes(config, what="config")') in err, err
    # The processes at one place share one line (issue 74).
    assert f"processes 0, 1, 3 were at {script}:{allreduce} in train_step: " in err, err
    assert "loss" not in out


# --- the README's table -----------------------------------------------------


def readme_rows() -> dict[str, list[str]]:
    rows = {}
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"\[`(\w+)\.py`\]\((\w+)\.py\)", cells[0]) if line.startswith("|") else None
        if m:
            rows[m[1]] = cells
    return rows


def test_readme_lists_every_example_with_its_command():
    rows = readme_rows()
    scripts = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    assert sorted(rows) == scripts
    for name, cells in rows.items():
        (command,) = re.findall(r"`(jaxrun [^`]*)`", cells[2])
        words = shlex.split(command)
        assert words[-1] == f"examples/{name}.py"
        assert words[1:5] == ["-n", "4", "--cpu-devices", "2"]
        if name == "hang":
            assert "--timeout" in words


# --- deployment recipes -----------------------------------------------------


def jobset_documents():
    return [d for d in yaml.safe_load_all((DEPLOY / "jobset.yaml").read_text()) if d]


def test_jobset_manifest_parses_and_feeds_the_shim():
    (jobset,) = [d for d in jobset_documents() if d["kind"] == "JobSet"]
    assert jobset["apiVersion"].startswith("jobset.x-k8s.io/")
    name = jobset["metadata"]["name"]
    spec = jobset["spec"]
    network = spec["network"]
    assert network["enableDNSHostnames"] is True
    service = network["subdomain"]
    (replicated,) = spec["replicatedJobs"]
    assert replicated["replicas"] == 1
    job = replicated["template"]["spec"]
    n = job["completions"]
    assert job["parallelism"] == n and n >= 2
    assert job["completionMode"] == "Indexed"
    pod = job["template"]["spec"]
    assert "serviceAccountName" not in pod  # no RBAC: the coordinator is a DNS name
    (container,) = pod["containers"]
    assert container["command"][:4] == ["python", "-m", "jaxrun.shim", "--"]
    env = {e["name"]: e for e in container["env"]}
    index = env[contract.PROCESS_ID]["valueFrom"]["fieldRef"]["fieldPath"]
    assert index == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    coordinator = env[contract.COORDINATOR_ADDRESS]["value"]
    host, port = coordinator.rsplit(":", 1)
    assert host == f"{name}-{replicated['name']}-0-0.{service}" and port.isdigit()
    # The shim's own reader accepts this environment, with pod 3's index filled in.
    values = {k: e["value"] for k, e in env.items() if "value" in e}
    values[contract.PROCESS_ID] = "3"
    assert contract.RANK_SOURCE not in values  # the default: jaxrun's own variables
    assert bootstrap.identity_from_env(values) == (3, n, 0)
    # One controller per pod: the pods are on different hosts, as far as --mesh knows.
    assert values[contract.LOCAL_PROCESS_COUNT] == "1"


def test_deploy_scripts_are_valid_bash():
    for script in ("slurm.sbatch", "cloud_tpu.sh"):
        subprocess.run(["bash", "-n", str(DEPLOY / script)], check=True)
    tpu = (DEPLOY / "cloud_tpu.sh").read_text()
    assert "jaxrun --hosts" in tpu and "--coordinator" in tpu
    slurm = (DEPLOY / "slurm.sbatch").read_text()
    assert "export JAXRUN_RANK_SOURCE=slurm" in slurm
    assert "python -m jaxrun.shim --" in slurm
    # The variables the shim reads for a Slurm rank are the ones srun sets.
    assert contract.RANK_SOURCES["slurm"] == ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
