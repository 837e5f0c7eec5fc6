"""``jaxrun k8s``: print a Kubernetes JobSet manifest that runs a script under the shim.

One indexed Job with N pods, one controller per pod.  JobSet's
``network.enableDNSHostnames`` gives the pods a headless service, so pod 0
has a stable DNS name, ``NAME-workers-0-0.NAME``, which is the coordinator.
Each pod's process id is its completion index, read through the downward API
(annotation ``batch.kubernetes.io/job-completion-index``), so peers never need
to list pods: no ServiceAccount, no RBAC.  ``backoffLimit: 0`` makes one
failed pod fail the Job, and JobSet then stops every other pod.

``render`` is pure: options in, a manifest (plain dicts) out.  ``to_yaml``
writes it without a YAML library, so the launcher gains no dependency.

Two layers rewrite what the user typed, and both are undone here:

- the kubelet expands ``$(VAR)`` in a container's command and env values,
  and turns ``$$`` into ``$``: every ``$`` of the user's words is doubled,
  and only jaxrun's own references (the process id) stay single;
- YAML: every string is a double-quoted scalar in plain ASCII, with JSON's
  escapes (``\\uXXXX``; ``\\UXXXXXXXX`` beyond the BMP), so that no control
  character, no non-ASCII text and no word like ``yes`` changes the manifest.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import click

from jaxrun import contract

JOB = "workers"
CONTAINER = "jax"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
# Pod hostnames are NAME-workers-J-P; all of it must stay a DNS label.
MAX_NAME = 63 - len(f"-{JOB}-0-99999")


@dataclasses.dataclass(frozen=True)
class K8sOptions:
    name: str
    image: str
    script: str
    args: tuple[str, ...] = ()
    is_module: bool = False
    num_processes: int = 1
    port: int = 8476
    python: str = "python"
    cpu: str | None = None
    memory: str | None = None
    gpus: int | None = None
    gpu_resource: str = "nvidia.com/gpu"
    cpu_devices: int | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    timeout: int | None = None


def coordinator_address(opts: K8sOptions) -> str:
    return f"{opts.name}-{JOB}-0-0.{opts.name}:{opts.port}"


def kubelet_literal(text: str) -> str:
    """``text`` as the kubelet must read it to pass it on unchanged: it
    expands ``$(VAR)`` and reads ``$$`` as one ``$``."""
    return text.replace("$", "$$")


def container_args(opts: K8sOptions) -> list[str]:
    """The shim's command line.  Placeholders become Kubernetes' own $(VAR)
    references, which the kubelet expands per pod; every other "$" the user
    wrote stays literal."""
    values = contract.placeholder_values(f"$({contract.PROCESS_ID})", opts.num_processes, 0, coordinator_address(opts))
    args = [contract.substitute(kubelet_literal(a), values) for a in opts.args]
    target = contract.target_args(kubelet_literal(opts.script), args, opts.is_module)
    return list(contract.shim_argv(kubelet_literal(opts.python), target))


def _field(path: str) -> dict:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def container_env(opts: K8sOptions) -> list[dict]:
    values = contract.process_env(
        coordinator=coordinator_address(opts), num_processes=opts.num_processes, process_id="",
        local_process_id=0, local_process_count=1, run_id=opts.name,
    )
    if opts.cpu_devices is not None:
        values.update(contract.cpu_env(opts.cpu_devices))
    # Pod 0's service listens on the pod's own address, never every interface
    # (JAX's default): the kubelet expands $(JAXRUN_POD_ADDRESS), defined
    # first, and the shim brackets an IPv6 one.
    values.update(contract.bind_env(f"$({contract.POD_ADDRESS}):{opts.port}"))
    # Per pod, from the downward API: its address, the rank is the completion
    # index, and the restart count is JobSet's attempt label.
    fields = {
        contract.POD_ADDRESS: "status.podIP",
        contract.PROCESS_ID: f"metadata.annotations['{INDEX_ANNOTATION}']",
        contract.RESTART_COUNT: f"metadata.labels['{RESTART_LABEL}']",
    }
    references = set(contract.bind_env(""))  # their $(...) is the kubelet's to expand
    env = [{"name": contract.POD_ADDRESS, **_field(fields[contract.POD_ADDRESS])}]
    env += [{"name": k, **_field(fields[k])} if k in fields
            else {"name": k, "value": v if k in references else kubelet_literal(v)} for k, v in values.items()]
    ours = {e["name"] for e in env}  # jaxrun's values win over --env
    return [{"name": k, "value": kubelet_literal(v)} for k, v in opts.env.items() if k not in ours] + env


def resources(opts: K8sOptions) -> dict:
    amounts = {}
    if opts.cpu:
        amounts["cpu"] = opts.cpu
    if opts.memory:
        amounts["memory"] = opts.memory
    if opts.gpus:
        amounts[opts.gpu_resource] = str(opts.gpus)
    # Requests equal to limits: each controller gets what it asked for, and
    # extended resources such as GPUs only allow limits == requests anyway.
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def render(opts: K8sOptions) -> dict:
    container = {
        "name": CONTAINER,
        "image": opts.image,
        "command": container_args(opts),
        "env": container_env(opts),
        "ports": [{"name": "coordinator", "containerPort": opts.port}],
    }
    if resources(opts):
        container["resources"] = resources(opts)
    job_spec = {
        "parallelism": opts.num_processes,
        "completions": opts.num_processes,
        "completionMode": "Indexed",
        "backoffLimit": 0,  # one failed controller fails the job; JobSet stops the rest
        "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
    }
    if opts.timeout:
        job_spec["activeDeadlineSeconds"] = opts.timeout
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": opts.name, "labels": {"app.kubernetes.io/managed-by": "jaxrun"}},
        "spec": {
            # JobSet creates the headless service NAME: pods resolve as HOST.NAME.
            "network": {"enableDNSHostnames": True, "subdomain": opts.name},
            "replicatedJobs": [{"name": JOB, "replicas": 1, "template": {"spec": job_spec}}],
        },
    }


_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")


def to_yaml(value, indent: int = 0) -> str:
    """Block-style YAML in plain ASCII.  Every string is double-quoted (see
    ``quoted``), so "yes", "1" or "a: b" can never change type or meaning."""
    return "\n".join(_lines(value, indent)) + "\n"


_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def quoted(text: str) -> str:
    """A YAML double-quoted scalar that is also a JSON string, but for
    characters beyond the BMP: JSON writes those as a surrogate pair, which
    YAML decoders read as two lone surrogates (go-yaml, in kubectl, rejects
    them), so they get YAML's ``\\UXXXXXXXX``.  Everything else that is not
    printable ASCII is ``\\uXXXX``.  Lone surrogates (bytes that were not
    UTF-8) cannot be written at all: ValueError."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif 0xD800 <= code < 0xE000:
            raise ValueError(f"{text!r} is not valid text (bytes that are not UTF-8?)")
        elif code > 0xFFFF:
            out.append(f"\\U{code:08x}")
        else:
            out.append(f"\\u{code:04x}")
    out.append('"')
    return "".join(out)


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    return quoted(str(value))


def _key(key: str) -> str:
    plain = _PLAIN_KEY.match(key) and key not in ("true", "false", "null", "yes", "no", "on", "off")
    return key if plain else quoted(key)


def _lines(value, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        out = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{_key(k)}:")
                out.extend(_lines(v, indent + (2 if isinstance(v, dict) else 0)))
            else:
                out.append(f"{pad}{_key(k)}: {_collapsed(v)}")
        return out
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        out = []
        for item in value:
            inner = _lines(item, indent + 2)
            out.append(f"{pad}- {inner[0].lstrip()}")
            out.extend(inner[1:])
        return out
    return [pad + _scalar(value)]


def _collapsed(value) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


# -- the command ---------------------------------------------------------------

class DnsLabel(click.ParamType):
    name = "NAME"

    def convert(self, value, param, ctx):
        if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", value) or len(value) > MAX_NAME:
            self.fail(f"{value!r} must be lowercase letters, digits and '-', start with a letter, "
                      f"and be at most {MAX_NAME} characters", param, ctx)
        return value


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.option("--image", required=True, help="Container image with Python, jax and jaxrun installed.")
@click.option("-n", "--num-processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of controllers (one pod each).")
@click.option("--name", type=DnsLabel(), default="jaxrun", show_default=True,
              help="JobSet name; also the headless service's name.")
@click.option("--cpu", metavar="QUANTITY", help="CPU per pod, e.g. 4 or 500m.")
@click.option("--memory", metavar="QUANTITY", help="Memory per pod, e.g. 16Gi.")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs per pod.")
@click.option("--gpu-resource", default="nvidia.com/gpu", show_default=True, help="Extended resource name for --gpus.")
@click.option("--cpu-devices", type=click.IntRange(min=1), metavar="D", help="Simulate D CPU devices per process.")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE", help="Set KEY=VALUE in every pod (repeatable).")
@click.option("--port", type=click.IntRange(1, 65535), default=8476, show_default=True,
              help="Coordinator port on pod 0.")
@click.option("--python", default="python", show_default=True, help="Python executable inside the image.")
@click.option("--timeout", type=click.IntRange(min=1), metavar="SECONDS", help="Job deadline (activeDeadlineSeconds).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(image, num_processes, name, cpu, memory, gpus, gpu_resource, cpu_devices, env_pairs, port, python, timeout,
            args):
    """Print a Kubernetes JobSet manifest that runs SCRIPT (or -m MODULE) in N pods.

    \b
      jaxrun k8s --image ghcr.io/me/train:1 -n 4 --gpus 8 train.py --lr 3e-4 | kubectl apply -f -

    SCRIPT is a path inside the image.  Pod 0 hosts the coordinator; the
    coordination service has no authentication, so keep the namespace private.
    """
    if not args or (args[0] == "-m" and len(args) < 2):
        raise click.UsageError("missing SCRIPT (or -m MODULE)")
    is_module = args[0] == "-m"
    script, rest = (args[1], args[2:]) if is_module else (args[0], args[1:])
    env = {}
    for pair in env_pairs:
        try:
            key, val = contract.parse_env_pair(pair)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--env") from None
        env[key] = val
    for word in (image, python, script, *rest, *env.values()):
        try:
            quoted(word)
        except ValueError:
            raise click.UsageError(f"{word!r} is not valid UTF-8; a manifest holds text only") from None
    opts = K8sOptions(
        name=name, image=image, script=script, args=tuple(rest), is_module=is_module,
        num_processes=num_processes, port=port, python=python, cpu=cpu, memory=memory,
        gpus=gpus, gpu_resource=gpu_resource, cpu_devices=cpu_devices, env=env, timeout=timeout,
    )
    click.echo(to_yaml(render(opts)), nl=False)
