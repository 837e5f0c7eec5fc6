"""`jaxrun k8s`: the rendered JobSet manifest, checked structurally.

The manifest is parsed back with a YAML parser where one is installed
(PyYAML, a test dependency); the escaping tests fall back to reading each
double-quoted scalar as JSON without one.
"""

import json
import re
import subprocess
import sys

import pytest

from jaxrun import contract, k8s

try:
    import yaml
except ImportError:  # the escaping tests still run; the structural ones skip
    yaml = None

pytestmark = pytest.mark.timeout(30)


def parse(text: str):
    if yaml is None:
        pytest.skip("needs a YAML parser (pip install pyyaml)")
    return yaml.safe_load(text)


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_LONG_ESCAPE = re.compile(r"\\(U[0-9a-f]{8}|.)")


def scalars(text: str) -> list[str]:
    """Every double-quoted scalar in ``text``, decoded as JSON; YAML's
    \\UXXXXXXXX, which JSON lacks, is turned into JSON's surrogate pair first."""

    def to_json(match: re.Match) -> str:
        escape = match.group(1)
        if escape.startswith("U"):
            return json.dumps(chr(int(escape[1:], 16)))[1:-1]
        return match.group(0)

    return [json.loads(_LONG_ESCAPE.sub(to_json, q)) for q in _QUOTED.findall(text)]


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
    manifest = parse(k8s.to_yaml(k8s.render(options())))
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


def test_pod_0_binds_its_own_address_never_every_interface():
    """JAX's default binds [::]:PORT; each pod's bind address is its own
    (status.podIP), declared before the variables that refer to it, so the
    kubelet expands it; the shim brackets an IPv6 one."""
    container = container_of(k8s.render(options()))
    names = [e["name"] for e in container["env"]]
    env = env_of(container)
    assert env[contract.POD_ADDRESS] == {"fieldRef": {"fieldPath": "status.podIP"}}
    for name in (contract.COORDINATOR_BIND_ADDRESS, contract.JAX_COORDINATOR_BIND_ADDRESS):
        assert env[name] == f"$({contract.POD_ADDRESS}):8476"
        assert names.index(contract.POD_ADDRESS) < names.index(name)
    assert contract.bracketed("10.0.0.7:8476") == "10.0.0.7:8476"
    assert contract.bracketed("fd00::7:8476") == "[fd00::7]:8476"
    assert contract.bracketed("[fd00::7]:8476") == "[fd00::7]:8476"
    assert contract.bracketed("unix:/tmp/a:b/c.sock") == "unix:/tmp/a:b/c.sock"


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


STRINGS = ["yes", "no", "null", "1", "0x10", "a: b", "- x", "# c", "é ü", "tab\there", "line\nbreak", '"quoted"',
           "back\\slash", "", " lead", "{x}", "[y]", "*alias", "&a",
           # control characters, DEL, C1 controls and NEL, line separators, a BOM, non-characters, beyond the BMP
           "\x00\x01\x1b[31m\x7f", "\x80\x85\x9f\xa0", "\u2028\u2029", "\ufeffbom", "\ufffe\uffff",
           "\U0001F600 \U0010FFFF", "\\U0001f600 is text", "日本語 \u00e9", "\r\n\t\b\f\v"]


@pytest.mark.parametrize("text", STRINGS)
def test_yaml_keeps_every_string_a_string(text):
    value = {"k": text, "list": [text, {"inner": text}], text or "empty": 1}
    written = k8s.to_yaml(value)
    assert written.isascii() and all(c == "\n" or " " <= c < "\x7f" for c in written), written
    if yaml is not None:
        assert yaml.safe_load(written) == value
    assert scalars(written).count(text) >= 3  # the key is a scalar too, unless it is a plain word


def test_bytes_that_are_not_utf8_are_refused_not_written():
    with pytest.raises(ValueError, match="not valid text"):
        k8s.to_yaml({"k": b"caf\xe9".decode("utf-8", "surrogateescape")})
    proc = subprocess.run([sys.executable.encode(), b"-m", b"jaxrun", b"k8s", b"--image", b"img", b"t.py", b"caf\xe9"],
                          capture_output=True)
    assert proc.returncode == 2 and proc.stderr.startswith(b"jaxrun: error:"), proc.stderr
    assert b"not valid UTF-8" in proc.stderr and b"Traceback" not in proc.stderr


def kubelet_expand(text: str, env: dict) -> str:
    """What the kubelet does to a command word or an env value: $$ is one $,
    $(NAME) is NAME's value when the container defines it, and anything else
    stays as it is."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def test_dollars_reach_the_pod_as_typed():
    words = ("$HOME", "$$", "a$(HOME)b", "$(JAXRUN_PROCESS_ID)", "$", "{process_id}", "$${process_id}")
    env = {"X": "$(HOME)$$z$", "Y": "plain"}
    container = container_of(k8s.render(options(script="/app/$x.py", python="py$", args=words, env=env)))
    pod_env = {"HOME": "/root", contract.PROCESS_ID: "3"}
    for e in container["env"]:
        if "value" in e:
            pod_env[e["name"]] = kubelet_expand(e["value"], pod_env)
    command = [kubelet_expand(word, pod_env) for word in container["command"]]
    assert command == ["py$", "-m", "jaxrun.shim", "--", "/app/$x.py",
                       "$HOME", "$$", "a$(HOME)b", "$(JAXRUN_PROCESS_ID)", "$", "3", "$$3"]
    assert pod_env["X"] == "$(HOME)$$z$" and pod_env["Y"] == "plain"
    assert pod_env[contract.COORDINATOR_ADDRESS] == "toy-workers-0-0.toy:8476"


def test_command_line_prints_the_manifest_and_rejects_bad_input(tmp_path):
    cmd = [sys.executable, "-m", "jaxrun", "k8s"]
    out = subprocess.run(cmd + ["--image", "img", "-n", "2", "--gpus", "1", "--env", "X=1", "train.py", "--lr", "3e-4"],
                         capture_output=True, text=True, check=True).stdout
    container = container_of(parse(out))
    assert container["command"][-3:] == ["train.py", "--lr", "3e-4"]
    assert env_of(container)["X"] == "1"
    for bad in (["--image", "img", "--name", "Bad_Name", "t.py"], ["t.py"], ["--image", "img"],
                ["--image", "img", "--env", "nokey", "t.py"]):
        proc = subprocess.run(cmd + bad, capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("jaxrun: error:"), (bad, proc.stderr)
