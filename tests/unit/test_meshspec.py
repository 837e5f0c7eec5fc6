"""The --mesh mini-language: pure parsing, resolution and CLI validation (no jax)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from jaxrun import cli
from jaxrun.child.join.versions import check_versions
from jaxrun.meshspec import (
    MeshSpec,
    MeshSpecError,
    parse,
    resolve,
    split_across_processes,
)


@pytest.mark.parametrize("text, names, sizes", [
    ("i=4,j=2", ("i", "j"), (4, 2)),
    ("data=-1", ("data",), (-1,)),
    (" data = 2 , model=-1 ", ("data", "model"), (2, -1)),
    ("x=1", ("x",), (1,)),
])
def test_parse_accepts(text, names, sizes):
    assert parse(text) == MeshSpec(names, sizes)


@pytest.mark.parametrize("text, fragment", [
    ("", "empty mesh spec"),
    ("i", "is not NAME=SIZE"),
    ("i=", "is not NAME=SIZE"),
    ("=4", "is not NAME=SIZE"),
    ("i=4,,j=2", "is not NAME=SIZE"),
    ("i=four", "not an integer"),
    ("i=0", "must be positive"),
    ("i=-2", "must be positive"),
    ("2i=4", "not an identifier"),
    ("i=2,i=4", "appears twice"),
    ("i=-1,j=-1", "more than one -1"),
])
def test_parse_rejects(text, fragment):
    with pytest.raises(MeshSpecError, match=fragment):
        parse(text)


def test_str_round_trips():
    assert str(parse(" i = 4 ,j=-1")) == "i=4,j=-1"


@pytest.mark.parametrize("text, devices, sizes", [
    ("i=4,j=2", 8, (4, 2)),
    ("data=-1", 8, (8,)),
    ("data=-1,model=2", 8, (4, 2)),
    ("a=2,b=-1,c=2", 16, (2, 4, 2)),
])
def test_resolve(text, devices, sizes):
    assert resolve(parse(text), devices) == sizes


def test_resolve_names_both_counts():
    with pytest.raises(MeshSpecError, match=r"mesh i=3,j=2 needs 6 devices, but the job has 8 devices"):
        resolve(parse("i=3,j=2"), 8)
    with pytest.raises(MeshSpecError, match=r"8 devices.*not a multiple.*3"):
        resolve(parse("a=-1,b=3"), 8)


@pytest.mark.parametrize("sizes, granules, inner, outer", [
    ((4, 2), 4, (1, 2), (4, 1)),
    ((8,), 4, (2,), (4,)),
    ((2, 4), 4, (1, 2), (2, 2)),
    ((4, 2), 1, (4, 2), (1, 1)),
])
def test_split_across_processes(sizes, granules, inner, outer):
    assert split_across_processes(sizes, granules) == (inner, outer)


def test_split_across_processes_rejects():
    with pytest.raises(MeshSpecError, match="cannot be laid out over 3 processes"):
        split_across_processes((4, 2), 3)


def _parse_cli(*args):
    return cli.main.make_context("jaxrun", list(args))


def test_cli_normalizes_mesh(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    ctx = _parse_cli("--mesh", " i = 4, j=2", "--mesh-axis-types", "explicit", str(script))
    assert ctx.params["mesh"] == "i=4,j=2"
    assert ctx.params["mesh_axis_types"] == "explicit"


@pytest.mark.parametrize("args", [["--mesh", "i=4,i=2"], ["--mesh-axis-types", "manual"]])
def test_cli_rejects_bad_mesh_options(tmp_path, args):
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(click.BadParameter):
        _parse_cli(*args, str(script))


def _row(process, jax="0.10.2", jaxlib="0.10.2"):
    return {"process": process, "jax": jax, "jaxlib": jaxlib}


def test_versions_agree():
    check_versions([_row(0), _row(1)])


def test_version_mismatch_names_processes():
    from jaxrun.child.join.bootstrap import BootstrapError

    rows = [_row(0), _row(1, jaxlib="0.9.0"), _row(2), _row(3, jaxlib="0.9.0")]
    with pytest.raises(BootstrapError, match=r"jaxlib versions differ across processes: "
                                             r"0.10.2 on processes 0, 2; 0.9.0 on processes 1, 3"):
        check_versions(rows)


def test_the_preflight_table_reaches_the_launcher_in_one_write():
    """As process 0's stderr is: line-buffered over a pipe.  Each raw write is
    what the launcher may read apart, with its own lines in between."""
    import io

    from jaxrun.child.join.versions import show_preflight

    class Pipe(io.RawIOBase):
        def __init__(self):
            self.writes = []

        def writable(self):
            return True

        def write(self, b):
            self.writes.append(bytes(b))
            return len(b)

    pipe = Pipe()
    stderr = io.TextIOWrapper(io.BufferedWriter(pipe), line_buffering=True)
    rows = [dict(process=p, host="h", pid=100 + p, jax="0.10.2", jaxlib="0.10.2", python="3.11.7") for p in range(4)]
    show_preflight(rows, stderr)
    assert len(pipe.writes) == 1
    lines = pipe.writes[0].decode().splitlines(keepends=True)
    assert len(lines) == 6 and all(line.endswith("\n") for line in lines)
    assert lines[0] == "jaxrun: preflight\n" and lines[-1].split()[0] == "3"


def test_meshspec_has_no_jax():
    code = "import sys, jaxrun.meshspec; print('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_every_cli_axis_type_builds_a_mesh_of_that_type():
    # The CLI offers the choices; the child maps each one to a jax AxisType.
    # A choice added on one side only would pass the CLI and fail in every process.
    (option,) = [p for p in cli.main.params if p.name == "mesh_axis_types"]
    choices = list(option.type.choices)
    assert choices
    code = (
        "import json, sys\n"
        "from jaxrun import meshspec\n"
        "from jaxrun.child.join import mesh\n"
        "spec = meshspec.parse('i=2,j=-1')\n"
        "print(json.dumps({str(t): [str(a) for a in mesh.build_mesh(spec, t, multi_host=False).axis_types]\n"
        "                  for t in json.loads(sys.argv[1])}))\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}
    run = subprocess.run([sys.executable, "-c", code, json.dumps(choices + [None])], capture_output=True,
                         text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    want = {c: [f"AxisType.{c.capitalize()}"] * 2 for c in choices}
    want["None"] = ["AxisType.Explicit"] * 2  # no --mesh-axis-types: jax.make_mesh's default
    assert json.loads(run.stdout) == want
