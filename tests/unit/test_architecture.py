"""The shape of the house, checked: imports point one way and close no
cycle, every room stays small, the backends are one table, every JAXRUN_*
name is spelled in the contract alone, and the Child contract is what it says.

Each rule reads the source with ``ast`` (function-level imports count) and
is itself tried on a snippet, so that a check that stops finding what it
looks for fails here instead of passing quietly.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import jaxrun
from jaxrun.core.backend import Backend

PACKAGE = Path(jaxrun.__file__).parent
ROOT = PACKAGE.parent
MAX_LINES = 450  # the cap: no module is longer
# A module within NEAR_CAP lines of the cap is full: it is split along a seam
# before it grows, not packed to stay under (over FULL lines fails) ...
NEAR_CAP = 10
FULL = MAX_LINES - NEAR_CAP
# ... unless it is named here, with the reason it may stay that long for now.
# At most three; an entry whose module is gone or no longer full fails too.
# {"jaxrun/path.py": "why"}
FULL_ALLOWED: dict[str, str] = {}
MAX_FULL_ALLOWED = 3
MAX_TOP_MODULES = 10

# Where each part may point.  A part is a sub-package, or a module directly
# under jaxrun/.  The arrows: cli -> launcher -> backends and reporting ->
# core -> contract (with wire, portable and meshspec beside it).  The child
# side stands apart: it reads the contract only.  A backend's far end may
# run the child side (the fork server preloads it).
BOTTOM = {"contract", "wire", "portable", "meshspec"}
ALLOWED = {
    "contract": set(),
    "meshspec": set(),
    "wire": {"contract"},
    "portable": {"contract"},
    "core": BOTTOM,
    "child": BOTTOM,
    "reporting": BOTTOM | {"core"},
    "backends": BOTTOM | {"core", "child"},
    "launcher": BOTTOM | {"core", "backends", "reporting"},
    "runtime": BOTTOM | {"child"},
    "shim": {"child"},
    "pytest_plugin": BOTTOM,
    "k8s": BOTTOM | {"core"},
    "cli": BOTTOM | {"core", "launcher", "backends", "reporting", "k8s"},
    "__main__": {"cli"},
    "__init__": {"runtime"},
}
# In launcher/, only the run loop picks a backend.
BACKEND_PICKER = "jaxrun.launcher.run"
# The launcher's rooms, in the order of a run's life, and where each may
# point: the run loop drives the others; an attempt prints and asks the
# restart policy; restarts read the hosts; the interactive front ends reach
# the run only through its control.  setup, output and control lean on no
# other room.
ROOMS = {
    "run": {"setup", "attempt", "restarts", "output", "interactive", "control", "channel", "probe"},
    "control": set(),
    "setup": set(),
    "attempt": {"output", "restarts"},
    "restarts": {"setup"},
    "output": set(),
    "interactive": {"control"},
    # The control channel's listening end reads the running attempt; the
    # commands that look into a running job reach it only through the channel.
    "channel": {"attempt"},
    "inspect": {"channel"},
    # The probe before a launch places the job as an elastic restart would.
    "probe": {"restarts"},
}
# The child side's rooms, in the order of a process's life: the shim (its
# entry) arranges the join, which may start the checks and the watches; the
# checks may read what the watches read (the flight record's dump); hooks
# (patching jax as it loads) and ending (leaving at once) are beneath all.
# The controllers other than a script's run through the shim and the join.
CHILD_ROOMS = {
    "controllers": {"shim", "join", "checks", "watch", "hooks", "ending"},
    "shim": {"join", "checks", "watch", "hooks", "ending"},
    "join": {"checks", "watch", "hooks", "ending"},
    "checks": {"watch", "hooks", "ending"},
    "watch": {"hooks", "ending"},
    "hooks": set(),
    "ending": set(),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every jaxrun module this source imports, at any depth of the code."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "jaxrun")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "jaxrun":
                continue
            # ``from jaxrun import contract`` points at jaxrun.contract, ``from
            # jaxrun import mesh`` at jaxrun itself (real_modules walks up to the
            # module that holds a name): never at both.
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


@functools.cache  # parsed once per session: a dozen rules read it (test_names.py's does the same)
def sources() -> dict[str, tuple[Path, ast.AST]]:
    return {module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))}


def real_modules(names: set[str], known: set[str]) -> set[str]:
    """Names that are modules (``jaxrun.core.spec``), not things in them."""
    out = set()
    for name in names:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in known:
            out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    found = sources()
    known = set(found)
    return {m: real_modules(imported_modules(tree, m, path.name == "__init__.py"), known) - {m}
            for m, (path, tree) in found.items()}


def wrong_arrows(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        here = part_of(module)
        for target in targets:
            there = part_of(target)
            if there == here or target == "jaxrun":
                continue
            if there not in ALLOWED.get(here, set()):
                bad.append(f"{module} imports {target} ({here} -> {there})")
            elif here == "launcher" and there == "backends" and module != BACKEND_PICKER:
                bad.append(f"{module} imports {target}: only {BACKEND_PICKER} picks a backend")
    return sorted(bad)


def room_of(module: str) -> str | None:
    """The launcher's room a module is in (``jaxrun.launcher.attempt.joins``: attempt), if any."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "launcher" else None


def wrong_room_arrows(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        here = room_of(module)
        if here is None:
            continue
        for target in targets:
            there = room_of(target)
            if there is None or there == here:
                continue
            if there not in ROOMS.get(here, set()):
                bad.append(f"{module} imports {target} ({here} -> {there})")
    return sorted(bad)


def child_room_of(module: str) -> str | None:
    """The child side's room a module is in (``jaxrun.child.join.mesh``: join;
    ``jaxrun.child.shim``: shim), if any."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "child" else None


def wrong_child_arrows(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        here = child_room_of(module)
        if here is None:
            continue
        for target in targets:
            there = child_room_of(target)
            if there is None or there == here:
                continue
            if there not in CHILD_ROOMS.get(here, set()):
                bad.append(f"{module} imports {target} ({here} -> {there})")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# -- the rules -----------------------------------------------------------------------
def test_imports_point_one_way():
    assert wrong_arrows(import_graph()) == []


def test_the_launcher_rooms_point_one_way():
    rooms = {room_of(m) for m in import_graph() if room_of(m)}
    assert rooms == set(ROOMS), "a new room of launcher/ needs its arrows in ROOMS"
    assert wrong_room_arrows(import_graph()) == []


def test_the_child_rooms_point_one_way():
    rooms = {child_room_of(m) for m in import_graph() if child_room_of(m)}
    assert rooms == set(CHILD_ROOMS), "a new room of child/ needs its arrows in CHILD_ROOMS"
    assert wrong_child_arrows(import_graph()) == []


def test_the_child_rule_catches_an_arrow_from_the_checks_into_the_join():
    """A planted arrow, in a copy of the real graph: a check that reads the join fails."""
    graph = import_graph()
    planted = {**graph, "jaxrun.child.checks.agreement": graph["jaxrun.child.checks.agreement"]
               | {"jaxrun.child.join.bootstrap"}}
    assert wrong_child_arrows(planted) == [
        "jaxrun.child.checks.agreement imports jaxrun.child.join.bootstrap (checks -> join)"]
    upward = {**graph, "jaxrun.child.watch.place": graph["jaxrun.child.watch.place"] | {"jaxrun.child.shim"}}
    assert wrong_child_arrows(upward) == ["jaxrun.child.watch.place imports jaxrun.child.shim (watch -> shim)"]


def test_no_import_cycle():
    """Between any two modules of the package, imports inside functions
    included: ``import jaxrun`` from inside is an arrow to jaxrun/__init__,
    which imports jaxrun.runtime (lazily), and a package's lazy import of its
    own modules is an arrow like any other."""
    assert cycles(import_graph()) == []


# Every JAXRUN_* environment name is spelled once, in the contract; elsewhere
# the constant names it.  Docstrings are prose for readers and may mention one.
ENV_NAME = re.compile(r"JAXRUN_[A-Z0-9_]*")
CONTRACT = "jaxrun.contract"


def docstring_nodes(tree: ast.AST) -> set[int]:
    """The ids of the docstrings' constants: a module's, a class's, a function's."""
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.body and isinstance(node.body[0], ast.Expr)}


def spelled_env_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each JAXRUN_* name in a string of the code (f-strings'
    parts included), docstrings aside."""
    docstrings = docstring_nodes(tree)
    return sorted((node.lineno, name) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  for name in ENV_NAME.findall(node.value))


def test_every_jaxrun_name_is_spelled_only_in_the_contract():
    found = [f"{module}:{line}: {name}" for module, (_, tree) in sources().items()
             if module != CONTRACT and not module.startswith(CONTRACT + ".")
             for line, name in spelled_env_names(tree)]
    assert found == [], "name it with its constant from jaxrun.contract"


def module_sizes() -> dict[str, int]:
    return {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}


def size_problems(sizes: dict[str, int], allowed: dict[str, str]) -> list[str]:
    """Modules over the cap, full modules the allowlist does not name, and
    what is wrong with the allowlist itself."""
    problems = []
    if len(allowed) > MAX_FULL_ALLOWED:
        problems.append(f"the allowlist names {len(allowed)} modules: at most {MAX_FULL_ALLOWED}")
    for path, reason in sorted(allowed.items()):
        if not reason.strip():
            problems.append(f"{path}: allowed without a reason")
        if path not in sizes:
            problems.append(f"{path}: allowed, but there is no such module")
        elif sizes[path] <= FULL:
            problems.append(f"{path}: allowed, but {sizes[path]} lines is not full: remove it from the allowlist")
    for path, n in sorted(sizes.items()):
        if n > MAX_LINES:
            problems.append(f"{path}: {n} lines, over the cap of {MAX_LINES}: split it along a seam")
        elif n > FULL and path not in allowed:
            problems.append(f"{path}: {n} lines, within {NEAR_CAP} of the cap: split it along a seam")
    return problems


def test_every_module_is_small():
    assert size_problems(module_sizes(), FULL_ALLOWED) == []


def test_few_modules_sit_directly_under_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_the_launcher_never_probes_a_child():
    probes = re.compile(r"\b(getattr|hasattr)\(\s*child\b")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in (PACKAGE / "launcher").rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if probes.search(line)]
    assert found == []


def calls_of(name: str) -> set[str]:
    out = set()
    for module, (_, tree) in sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if called == name:
                    out.add(module)
    return out


def test_one_join_watch_and_at_most_two_popen_waits():
    assert len(calls_of("JoinWatch")) <= 1, calls_of("JoinWatch")
    assert len(calls_of("wait_popen")) <= 2, calls_of("wait_popen")


def test_wire_words_are_spelled_only_in_wire():
    words = {"ctrl", "stdout", "stderr"}
    found = []
    for module, (_, tree) in sources().items():
        if module == "jaxrun.wire" or module.startswith("jaxrun.wire."):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(
                    isinstance(a, ast.Constant) and a.value in words
                    for a in [*node.args, *[k.value for k in node.keywords]]):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in {"connect", "TaskHello", "accept", "channel", "open_channel", "Channel"}:
                    found.append(f"{module}:{node.lineno}")
            if isinstance(node, ast.Constant) and node.value == "ctrl":
                found.append(f"{module}:{node.lineno}")
    assert sorted(set(found)) == []


def backend_name_comparisons(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines where a backend's name is compared or tested for membership."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                consts = [side] if isinstance(side, ast.Constant) else \
                    list(side.elts) if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else []
                if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in names:
            lines.append(node.lineno)
    return lines


ENGINE_WORDS = {"scheduler", "local", "ssh", "slurm", "mpirun", "srun", "ray", "mpi"}


def engine_home(module: str) -> str | None:
    """The engine package a module belongs to (``jaxrun.backends.ssh.children``: ssh), if any."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "backends" else None


def test_no_engine_name_is_compared_outside_its_package_and_the_registry():
    """Engines differ by type: shared code never asks which one it runs."""
    from jaxrun.backends import BACKENDS

    names = set(BACKENDS) | ENGINE_WORDS
    found = []
    for module, (_, tree) in sources().items():
        if module in ("jaxrun.backends", "jaxrun.contract.names") or engine_home(module):
            continue  # the registry, the contract's table of rank sources, and each engine about itself
        found += [f"{module}:{line}" for line in backend_name_comparisons(tree, names)]
    assert found == []


def test_an_engine_package_compares_only_its_own_names():
    own = {"scheduler": {"scheduler", "slurm", "mpirun", "srun", "mpi"}, "ray": {"ray"}, "ssh": {"ssh"}}
    found = []
    for module, (_, tree) in sources().items():
        home = engine_home(module)
        if home is None:
            continue
        others = ENGINE_WORDS - own.get(home, {home})
        found += [f"{module}:{line}" for line in backend_name_comparisons(tree, others)]
    assert found == []


def far_end_modules() -> dict[str, str]:
    """The contract's module names that a launcher puts on command lines: {constant: module}."""
    from jaxrun import contract

    return {name: value for name, value in vars(contract).items()
            if name.endswith("_MODULE") and isinstance(value, str) and value.startswith("jaxrun.")}


def test_every_module_put_on_a_command_line_exists_and_says_it_is_a_far_end():
    known = set(sources())
    modules = far_end_modules()
    assert len(modules) >= 4
    assert sorted(m for m in modules.values() if m not in known) == []
    far = re.compile(r"(agent|server|driver|actor|preflight|shim|controller)$")
    assert sorted(m for m in modules.values()
                  if not far.search(m.rsplit(".", 1)[1]) and not m.startswith("jaxrun.child.controllers.")) == []


def program_texts(tree: ast.AST) -> list[int]:
    """Lines of string constants (docstrings aside) that hold a Python program
    of more than a few lines: code belongs in a module that can be linted."""
    docstrings = docstring_nodes(tree)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
            if text.count("\n") < MAX_STUB_LINES or not re.search(r"^\s*(import|from|def|for|while|try)\b", text, re.M):
                continue
            try:
                ast.parse(text)
            except SyntaxError:
                continue
            lines.append(node.lineno)
    return lines


MAX_STUB_LINES = 16  # a stub that finds and starts a module; anything longer is a program


def test_no_program_lives_in_a_string():
    found = [f"{module}:{line}" for module, (_, tree) in sources().items() for line in program_texts(tree)]
    assert found == []


def test_every_package_says_what_it_is():
    bare = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("__init__.py")
            if ast.get_docstring(ast.parse(p.read_text())) is None]
    assert bare == []


def test_contributing_names_every_public_backend_method():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    public = [name for name, value in vars(Backend).items() if callable(value) and not name.startswith("_")]
    assert len(public) >= 9
    assert [name for name in public if f"`{name}`" not in text] == []


# -- the checks, tried on what they must find ------------------------------------------
def test_the_arrow_check_finds_an_upward_import():
    graph = {"jaxrun.backends.ssh.backend": {"jaxrun.launcher.config"},
             "jaxrun.launcher.attempt.supervisor": {"jaxrun.backends.base"},
             "jaxrun.launcher.run": {"jaxrun.backends"}, "jaxrun.launcher.output.pump": {"jaxrun.wire"},
             "jaxrun.core.spec": {"jaxrun.contract"}, "jaxrun.wire": {"jaxrun.core.spec"}}
    assert wrong_arrows(graph) == [
        "jaxrun.backends.ssh.backend imports jaxrun.launcher.config (backends -> launcher)",
        f"jaxrun.launcher.attempt.supervisor imports jaxrun.backends.base: only {BACKEND_PICKER} picks a backend",
        "jaxrun.wire imports jaxrun.core.spec (wire -> core)",
    ]


def test_the_room_check_finds_an_arrow_against_the_rooms():
    graph = {"jaxrun.launcher.output.pump": {"jaxrun.launcher.attempt.joins"},
             "jaxrun.launcher.interactive.frontend": {"jaxrun.launcher.control", "jaxrun.launcher.run"},
             "jaxrun.launcher.attempt.supervisor": {"jaxrun.launcher.restarts.policy", "jaxrun.core.outcome"}}
    assert wrong_room_arrows(graph) == [
        "jaxrun.launcher.interactive.frontend imports jaxrun.launcher.run (interactive -> run)",
        "jaxrun.launcher.output.pump imports jaxrun.launcher.attempt.joins (output -> attempt)",
    ]


def test_function_level_and_relative_imports_count():
    tree = ast.parse("def f():\n    from jaxrun.launcher import plan\n    from .. import wire\n")
    found = imported_modules(tree, "jaxrun.backends.local", False)
    assert {"jaxrun.launcher.plan", "jaxrun.wire"} <= found


def test_the_size_check_finds_full_modules_and_a_stale_allowlist():
    sizes = {"jaxrun/a.py": FULL, "jaxrun/b.py": FULL + 1, "jaxrun/c.py": MAX_LINES, "jaxrun/d.py": MAX_LINES + 1}
    assert size_problems(sizes, {}) == [
        f"jaxrun/b.py: {FULL + 1} lines, within {NEAR_CAP} of the cap: split it along a seam",
        f"jaxrun/c.py: {MAX_LINES} lines, within {NEAR_CAP} of the cap: split it along a seam",
        f"jaxrun/d.py: {MAX_LINES + 1} lines, over the cap of {MAX_LINES}: split it along a seam",
    ]
    allowed = {"jaxrun/b.py": "being split", "jaxrun/c.py": "being split", "jaxrun/d.py": "no cap is lifted"}
    assert size_problems(sizes, allowed) == [
        f"jaxrun/d.py: {MAX_LINES + 1} lines, over the cap of {MAX_LINES}: split it along a seam"]
    stale = {"jaxrun/a.py": "it was long once", "jaxrun/gone.py": "moved", "jaxrun/b.py": " "}
    assert size_problems(sizes, stale) == [
        f"jaxrun/a.py: allowed, but {FULL} lines is not full: remove it from the allowlist",
        "jaxrun/b.py: allowed without a reason",
        "jaxrun/gone.py: allowed, but there is no such module",
        f"jaxrun/c.py: {MAX_LINES} lines, within {NEAR_CAP} of the cap: split it along a seam",
        f"jaxrun/d.py: {MAX_LINES + 1} lines, over the cap of {MAX_LINES}: split it along a seam",
    ]
    four = {f"jaxrun/{name}.py": "why" for name in "bcdx"}
    assert size_problems(sizes, four)[0] == f"the allowlist names 4 modules: at most {MAX_FULL_ALLOWED}"


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_an_import_of_the_package_inside_a_function_is_an_arrow_to_its_init():
    """The cycle that came back unseen: a function's ``import jaxrun`` closed
    jaxrun -> runtime -> child.replicas -> child.replicas_prints -> jaxrun."""
    known = {"jaxrun", "jaxrun.runtime", "jaxrun.contract", "jaxrun.child", "jaxrun.child.checks.replicas_prints"}
    tree = ast.parse("def f():\n    import jaxrun\n")
    assert real_modules(imported_modules(tree, "jaxrun.child.checks.replicas_prints", False), known) == {"jaxrun"}
    tree = ast.parse("from jaxrun import contract\nfrom . import runtime\nfrom jaxrun import mesh\n")
    # From the package's __init__: a module it names, and a name in jaxrun itself.
    assert real_modules(imported_modules(tree, "jaxrun", True), known) == {"jaxrun.contract", "jaxrun.runtime",
                                                                          "jaxrun"}


def test_the_name_check_finds_a_spelled_name_and_spares_a_docstring():
    tree = ast.parse('"""Reads ``JAXRUN_VERBOSE``."""\nimport os\n'
                     'def f(rank):\n    """JAXRUN_RANK, in prose."""\n'
                     '    return os.environ.get("JAXRUN_VERBOSE"), f"JAXRUN_RANK={rank}", contract.VERBOSE\n')
    assert spelled_env_names(tree) == [(5, "JAXRUN_RANK"), (5, "JAXRUN_VERBOSE")]


def test_the_program_check_finds_a_program_and_spares_a_docstring():
    program = "import os\n" + "x = 1\n" * MAX_STUB_LINES
    tree = ast.parse(f'"""{program}"""\nPROGRAM = {program!r}\nSTUB = "import os; os.getcwd()"\n')
    assert program_texts(tree) == [MAX_STUB_LINES + 3]  # PROGRAM's line, after the docstring's


def test_the_name_check_finds_comparisons():
    tree = ast.parse("if kind == 'ssh': pass\nif x in ('local', 'slurm'): pass\ny = BUDGET['scheduler']\n")
    assert backend_name_comparisons(tree, {"ssh", "local", "slurm", "scheduler"}) == [1, 2, 3]


@pytest.mark.parametrize("snippet", ["getattr(child, 'resources', None)", "hasattr(child,'x')"])
def test_the_probe_check_matches(snippet):
    assert re.search(r"\b(getattr|hasattr)\(\s*child\b", snippet)


def test_every_folder_of_the_package_is_a_package():
    """A folder without __init__.py imports (as a namespace) in a checkout,
    but setuptools' find_packages leaves it out of an install."""
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists()) == []


def test_test_modules_of_one_name_are_collected_apart(tmp_path):
    """The suite's pytest settings import test modules by path
    (``--import-mode=importlib``): two folders may hold a test file of one
    name, and both are collected."""
    import os
    import subprocess
    import sys

    for folder in ("unit", "e2e"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test_same.py").write_text(f"def test_{folder}():\n    pass\n")
    # The plugins the settings name (--dist, timeout) and no other: the
    # venv's other entry points cost a pytest seconds, and none is under test.
    found = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                            str(tmp_path), "-p", "no:cacheprovider", "-p", "xdist.plugin", "-p", "pytest_timeout",
                            "--collect-only", "-q", str(tmp_path)],
                           cwd=tmp_path, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stdout + found.stderr
    assert "unit/test_same.py::test_unit" in found.stdout and "e2e/test_same.py::test_e2e" in found.stdout, found.stdout
