"""`jaxrun k8s`: the rendered JobSet manifest, checked structurally."""

import subprocess
import sys

import pytest
import yaml

from jaxrun import contract, k8s

pytestmark = pytest.mark.timeout(30)


def options(**kw) -> k8s.K8sOptions:
    base = dict(name="toy", image="ghcr.io/me/jax:1", script="/app/toy.py", num_processes=4)
    base.update(kw)
    return k8s.K8sOptions(**base)


def container_of(manifest: dict) -> dict:
    (job,) = manifest["spec"]["replicatedJobs"]
    return job["template"]["spec"]["template"]["spec"]["containers"][0]


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_jobset_is_one_indexed_job_with_a_pod_per_process():
    manifest = yaml.safe_load(k8s.to_yaml(k8s.render(options())))
    assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert manifest["kind"] == "JobSet"
    assert manifest["metadata"]["name"] == "toy"
    # The headless service JobSet creates is named by the subdomain.
    assert manifest["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "toy"}
    (job,) = manifest["spec"]["replicatedJobs"]
    assert job["replicas"] == 1
    spec = job["template"]["spec"]
    assert spec["parallelism"] == spec["completions"] == 4
    assert spec["completionMode"] == "Indexed"
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert "serviceAccountName" not in pod  # peers are found by DNS, not by listing pods
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/me/jax:1"
    assert container["command"] == ["python", "-m", "jaxrun.shim", "--", "/app/toy.py"]
    assert container["ports"] == [{"name": "coordinator", "containerPort": 8476}]
    assert "resources" not in container


def test_environment_gives_rank_from_completion_index_and_pod_0_as_coordinator():
    env = env_of(container_of(k8s.render(options(cpu_devices=2, env={"A": "1", contract.NUM_PROCESSES: "9"}))))
    assert env[contract.PROCESS_ID] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env[contract.NUM_PROCESSES] == "4"  # --env cannot override the contract
    assert env[contract.COORDINATOR_ADDRESS] == env[contract.JAX_COORDINATOR_ADDRESS] == "toy-workers-0-0.toy:8476"
    assert env[contract.LOCAL_PROCESS_ID] == "0" and env[contract.LOCAL_PROCESS_COUNT] == "1"
    assert env[contract.JAX_PLATFORMS] == "cpu" and env[contract.JAX_NUM_CPU_DEVICES] == "2"
    assert env["A"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    names = [e["name"] for e in container_of(k8s.render(options(env={contract.NUM_PROCESSES: "9"})))["env"]]
    assert len(names) == len(set(names))


def test_resources_module_target_placeholders_and_deadline():
    manifest = k8s.render(options(cpu="4", memory="16Gi", gpus=8, timeout=600, is_module=True,
                                  script="pkg.train", args=("--rank", "{process_id}", "{num_processes}", "$(HOME)")))
    container = container_of(manifest)
    expected = {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}
    assert container["resources"] == {"requests": expected, "limits": expected}
    # Kubernetes expands $(VAR) per pod; the user's own "$(" stays literal.
    assert container["command"] == ["python", "-m", "jaxrun.shim", "-m", "pkg.train",
                                    "--rank", "$(JAXRUN_PROCESS_ID)", "4", "$$(HOME)"]
    assert manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["activeDeadlineSeconds"] == 600


@pytest.mark.parametrize("text", ["yes", "no", "null", "1", "0x10", "a: b", "- x", "# c", "é ü", "tab\there",
                                  "line\nbreak", '"quoted"', "back\\slash", "", " lead", "{x}", "[y]", "*alias", "&a"])
def test_yaml_keeps_every_string_a_string(text):
    value = {"k": text, "list": [text, {"inner": text}], text or "empty": 1}
    assert yaml.safe_load(k8s.to_yaml(value)) == value


def test_command_line_prints_the_manifest_and_rejects_bad_input(tmp_path):
    cmd = [sys.executable, "-m", "jaxrun", "k8s"]
    out = subprocess.run(cmd + ["--image", "img", "-n", "2", "--gpus", "1", "--env", "X=1", "train.py", "--lr", "3e-4"],
                         capture_output=True, text=True, check=True).stdout
    container = container_of(yaml.safe_load(out))
    assert container["command"][-3:] == ["train.py", "--lr", "3e-4"]
    assert env_of(container)["X"] == "1"
    for bad in (["--image", "img", "--name", "Bad_Name", "t.py"], ["t.py"], ["--image", "img"],
                ["--image", "img", "--env", "nokey", "t.py"]):
        proc = subprocess.run(cmd + bad, capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("jaxrun: error:"), (bad, proc.stderr)
