"""One name per thing, and no name of a thing that is gone.

- Every class name is defined once in jaxrun/: a reader who greps a class
  finds one idea (``Hello`` was the task channel's and the console's).
- Every module a docstring names exists: ``jaxrun.wire.ssh``, a path such as
  ``backends/ssh/stream.py``, or a dotted name relative to the package or to
  the module's own folders (``attempt.stop``, ``core.causes.clock_id``, whose
  last part may be a name the module defines).

Each check reads the source with ``ast`` and is tried on a snippet.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import jaxrun

PACKAGE = Path(jaxrun.__file__).parent
ROOT = PACKAGE.parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def sources() -> dict[str, tuple[Path, ast.Module]]:
    return {module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))}


# -- every class name once ----------------------------------------------------------
def class_definitions(trees: dict[str, ast.AST]) -> dict[str, list[str]]:
    """{class name: ["module:line", ...]} for every class, at any depth."""
    found: dict[str, list[str]] = {}
    for module, tree in sorted(trees.items()):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(f"{module}:{node.lineno}")
    return found


def defined_twice(trees: dict[str, ast.AST]) -> dict[str, list[str]]:
    return {name: places for name, places in class_definitions(trees).items() if len(places) > 1}


def test_every_class_name_is_defined_once():
    assert defined_twice({m: tree for m, (_, tree) in sources().items()}) == {}


def test_the_class_check_finds_a_name_defined_twice():
    trees = {"jaxrun.a": ast.parse("class Hello:\n    class Inner: pass\n"),
             "jaxrun.b": ast.parse("def f():\n    class Hello: pass\nclass Other: pass\n"),
             "jaxrun.c": ast.parse("class Inner: pass\n")}
    assert defined_twice(trees) == {"Hello": ["jaxrun.a:1", "jaxrun.b:2"], "Inner": ["jaxrun.a:2", "jaxrun.c:1"]}


# -- every module a docstring names -----------------------------------------------------
# ``name`` in double backticks, or a Sphinx role's target (:mod:`jaxrun.wire`).
REFERENCE = re.compile(r"``([A-Za-z_][\w.]*(?:/[\w.]+)*)``|:(?:mod|class|func|meth|data|attr|exc):`~?([\w.]+)`")
# A dotted name ending so is a file (run.json, engine.log), not a module's name.
FILE_SUFFIXES = {"json", "log", "md", "txt", "yaml", "yml", "toml", "ipynb", "sh", "html", "cfg", "ini"}


def docstrings(tree: ast.AST) -> list[str]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [text for node in ast.walk(tree) if isinstance(node, kinds) and (text := ast.get_docstring(node))]


def references(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in REFERENCE.finditer(text)]


def top_level_names(module: str, trees: dict[str, ast.AST]) -> set[str]:
    """What ``module`` defines or imports at its top level; a star import
    brings in what that module defines."""
    names: set[str] = set()
    body = list(trees[module].body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
                if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
                    # What it exports, loaded when first used (PEP 562: jaxrun.portable)
                    names.update(n.value for n in ast.walk(node.value)
                                 if isinstance(n, ast.Constant) and isinstance(n.value, str))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*" and isinstance(node, ast.ImportFrom) and node.module in trees:
                    names |= top_level_names(node.module, trees)
                else:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            body += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            body += [n for handler in getattr(node, "handlers", []) for n in handler.body]
    return names


def resolves(name: str, trees: dict[str, ast.AST]) -> bool:
    """Whether ``name`` is a module, or a module and a name it defines."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in trees:
            rest = parts[cut:]
            return not rest or rest[0] in top_level_names(module, trees)
    return False


def packages_around(module: str, is_package: bool) -> list[str]:
    """The module's own package and each one above it, nearest first."""
    parts = module.split(".")
    parts = parts if is_package else parts[:-1]
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def imported_as(tree: ast.AST) -> dict[str, str]:
    """{local name: what it names} for the module's imports of jaxrun
    (``from jaxrun.wire import ssh``: {"ssh": "jaxrun.wire.ssh"})."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("jaxrun"):
            names.update((a.asname or a.name, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname, a.name) for a in node.names if a.asname and a.name.startswith("jaxrun."))
    return names


def stale_reference(ref: str, module: str, path: Path, trees: dict[str, ast.AST]) -> bool:
    """Whether ``ref``, found in a docstring of ``module`` (at ``path``), names
    a module of jaxrun that does not exist.  A dotted name counts only if its
    first part is a name the module imports from jaxrun, or a module or
    package of jaxrun near ``module`` (other than ``module`` itself): anything
    else (``os.environ``, ``jax.jit``) is not ours."""
    if ref.endswith(".py"):
        return not any((folder / ref).is_file() for folder in [path.parent, *path.parent.parents]
                       if folder == ROOT or ROOT in folder.parents)
    if "/" in ref or "." not in ref or ref.rsplit(".", 1)[1] in FILE_SUFFIXES:
        return False
    first, _, rest = ref.partition(".")
    if first == "jaxrun":
        return not resolves(ref, trees)
    imported = imported_as(trees[module]).get(first)
    if not imported and "_" in first and any(m.endswith("." + first.replace("_", ".")) for m in trees):
        return True  # a module's flat name from before it moved into a package (ssh_children: ssh/children.py)
    candidates = [f"{imported}.{rest}"] if imported else []
    candidates += [f"{package}.{ref}" for package in packages_around(module, path.name == "__init__.py")
                   if f"{package}.{first}" in trees and f"{package}.{first}" != module]
    return bool(candidates) and not any(resolves(name, trees) for name in candidates)


def stale_references(found: dict[str, tuple[Path, ast.AST]]) -> list[str]:
    trees = {module: tree for module, (_, tree) in found.items()}
    return sorted({f"{path.relative_to(ROOT)}: {ref}" for module, (path, tree) in found.items()
                   for text in docstrings(tree) for ref in references(text)
                   if stale_reference(ref, module, path, trees)})


def test_every_module_a_docstring_names_exists():
    assert stale_references(sources()) == []


def test_the_reference_check_finds_a_module_that_is_gone():
    package = ROOT / "jaxrun"
    snippet = ast.parse('"""Run by ``backends/forkserver/server.py``, not ``backends/forkserver.py``;\n'
                        'see ``jaxrun.wire.ssh``, ``jaxrun.wire.sshd``, :mod:`jaxrun.scheduler_channel`,\n'
                        '``core.causes.clock_id``, ``core.causes.clockid``, ``wire.encoding.send_frame``,\n'
                        '``wire.send_frame``, ``ssh_children.SessionChild``, ``os.environ``, ``run.json``\n'
                        'and ``train.py``."""\n')
    found = dict(sources())
    found["jaxrun.backends.example"] = (package / "backends" / "example.py", snippet)
    stale = [line for line in stale_references(found) if line.startswith("jaxrun/backends/example.py")]
    assert stale == [f"jaxrun/backends/example.py: {ref}" for ref in sorted([
        "backends/forkserver.py", "jaxrun.wire.sshd", "jaxrun.scheduler_channel", "core.causes.clockid",
        "wire.send_frame", "ssh_children.SessionChild", "train.py"])]


def test_a_name_relative_to_the_module_s_folders_is_found_there():
    trees = {"jaxrun": ast.parse(""), "jaxrun.launcher": ast.parse(""), "jaxrun.launcher.attempt": ast.parse(""),
             "jaxrun.launcher.attempt.stop": ast.parse("def stop(): pass\n"),
             "jaxrun.launcher.attempt.start": ast.parse("from jaxrun.launcher.restarts import policy as rules\n"),
             "jaxrun.launcher.restarts": ast.parse(""),
             "jaxrun.launcher.restarts.policy": ast.parse("from jaxrun.x import *\nclass RestartPolicy: pass\n"),
             "jaxrun.x": ast.parse("if True:\n    DECIDE = 1\n")}
    here = ROOT / "jaxrun" / "launcher" / "attempt" / "start.py"
    assert not stale_reference("attempt.stop", "jaxrun.launcher.attempt.start", here, trees)
    assert not stale_reference("stop.stop", "jaxrun.launcher.attempt.start", here, trees)
    assert not stale_reference("restarts.policy.RestartPolicy", "jaxrun.launcher.attempt.start", here, trees)
    assert not stale_reference("restarts.policy.DECIDE", "jaxrun.launcher.attempt.start", here, trees)
    assert stale_reference("restarts.policy.decide", "jaxrun.launcher.attempt.start", here, trees)
    assert stale_reference("attempt.gone", "jaxrun.launcher.attempt.start", here, trees)
    # A name the module imports is read as it imports it.
    assert not stale_reference("rules.RestartPolicy", "jaxrun.launcher.attempt.start", here, trees)
    assert stale_reference("rules.Gone", "jaxrun.launcher.attempt.start", here, trees)
    # A module never anchors a name of its own: ``memory.max`` in memory.py is a cgroup file.
    assert not stale_reference("stop.max", "jaxrun.launcher.attempt.stop", here.with_name("stop.py"), trees)
