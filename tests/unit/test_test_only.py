"""No code in jaxrun/ lives for the tests alone.

A public function or method of the package whose name nothing in jaxrun/
refers to, while a test does, is code that only the tests reach: a test of
it pins no behaviour a user can meet.  The test goes through the path a user
reaches instead, and the function goes.  The public API is the exception:
what ``jaxrun/__init__.py`` serves, the runtime helpers, pytest's hooks (the
plugin's, a controller's pytest run's), the click commands, the ``Backend`` and ``Child`` interfaces, and what
``pyproject.toml`` names as an entry point.

Names are matched as words, not resolved: a use of the same name anywhere in
jaxrun/ (an attribute, a string such as ``getattr``'s) counts as a use.  That
can only let test-only code through, never accuse code that is used.  The
check is tried on a snippet, so that it cannot quietly stop finding it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jaxrun

PACKAGE = Path(jaxrun.__file__).parent
ROOT = PACKAGE.parent
# Shipped programs that use jaxrun as its users do: a name they use is used.
USERS = ("bench", "examples")
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Modules whose every public function is the API a user calls.
API_MODULES = {"jaxrun/runtime.py", "jaxrun/__init__.py"}
# Classes whose public methods are an interface that jaxrun's own callers
# reach through the base type, so a subclass's method is used through it.
INTERFACES = {("jaxrun/core/backend.py", "Backend"), ("jaxrun/core/backend.py", "Child")}
# Known test-only code in modules that other work owns now: each with what
# should happen to it.  The test fails when one goes, so that this list never
# outlives its entries.
# (By the function's name in its class, wherever its module is.)
KNOWN: dict[str, str] = {}  # name -> why it is still here (none is)


DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def referenced(tree: ast.AST) -> set[str]:
    """Every name ``tree`` uses: names, attributes, imported names, and the
    words of its strings (docstrings aside); definitions are no use.

    One walk of the tree (the suite's every file is walked, so it counts):
    a node is seen before its children, so a docstring is known as one by
    the time its string is reached."""
    found: set[str] = set()
    docstrings: set[int] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str) and id(node) not in docstrings:
                found.update(WORD.findall(node.value))
        elif isinstance(node, DOCUMENTED):
            if node.body and isinstance(node.body[0], ast.Expr):
                docstrings.add(id(node.body[0].value))
        elif isinstance(node, ast.alias):
            found.update(node.name.split("."))
            if node.asname:
                found.add(node.asname)
        if isinstance(node, ast.ImportFrom) and node.module:
            found.update(node.module.split("."))
    return found


def is_api(node: ast.FunctionDef | ast.AsyncFunctionDef, module: str, cls: str | None) -> bool:
    if module in API_MODULES or (module, cls) in INTERFACES:
        return True
    if node.name.startswith("pytest_"):  # a hook: pytest calls it, in the plugin or a controller's run
        return True
    for decorator in node.decorator_list:  # @main.command(...), @click.group(...), @kernel.command("install")
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("command", "group"):
            return True
    return False


def public_functions(tree: ast.AST, module: str) -> dict[str, str]:
    """{"module:Class.name" or "module:name": name} for each public function
    and method defined at a module's top or in its classes (not nested in a
    function: a closure is its function's business), the API left out."""
    found = {}

    def visit(body: list[ast.stmt], cls: str | None) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and cls is None:
                visit(node.body, node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                if not is_api(node, module, cls):
                    found[f"{module}:{cls + '.' if cls else ''}{node.name}"] = node.name

    visit(tree.body, None)
    return found


def used_only_by_tests(package: dict[str, ast.AST], tests: set[str], used: set[str]) -> list[str]:
    """The public functions of ``package`` ({module path: tree}) that
    ``tests`` use and nothing else does: ``used`` is what other places
    (entry points, shipped programs) use."""
    elsewhere = set(used)
    for tree in package.values():
        elsewhere |= referenced(tree)
    defined = {}
    for module, tree in package.items():
        defined.update(public_functions(tree, module))
    return sorted(where for where, name in defined.items() if name in tests and name not in elsewhere)


def parsed(folder: Path) -> dict[str, ast.AST]:
    return {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text(), str(p)) for p in sorted(folder.rglob("*.py"))}


def test_no_public_function_is_used_by_the_tests_alone():
    tests = set().union(*map(referenced, parsed(ROOT / "tests").values()))
    used = set(WORD.findall((ROOT / "pyproject.toml").read_text()))  # entry points
    for folder in USERS:
        used = used.union(*map(referenced, parsed(ROOT / folder).values()))
    found = used_only_by_tests(parsed(PACKAGE), tests, used)
    assert [f for f in found if f.split(":")[1] not in KNOWN] == [], \
        "used only by tests: test the path a user reaches, and remove it"
    assert sorted(set(KNOWN) - {f.split(":")[1] for f in found}) == [], \
        "KNOWN lists code that is used now, or gone: remove it"


# -- the check, tried on what it must find ----------------------------------------------
PACKAGE_SNIPPET = {
    "jaxrun/reader.py": '''
"""Reads logs; innermost_frame is only named here, in a docstring."""

def innermost_frame(path):
    return frame_of(open(path).read())

def frame_of(text):
    return text

def _private(text):
    return text

class Log:
    def lines(self):
        return []

    def given(self):
        return getattr(self, "lines")()

    def __len__(self):
        return 0

def shown_by_getattr():
    pass

SHOWN = "shown_by_getattr"
''',
    "jaxrun/runtime.py": "def process_id():\n    return 0\n",
    "jaxrun/cli.py": "@main.command('logs')\ndef logs():\n    pass\n\ndef entry_point():\n    pass\n",
    "jaxrun/pytest_plugin.py": "def pytest_configure(config):\n    pass\n",
}
TESTS_SNIPPET = '''
from jaxrun.reader import innermost_frame, frame_of, Log, _private
from jaxrun import runtime, cli, pytest_plugin

def test_it(tmp_path):
    assert innermost_frame(tmp_path) == frame_of("")
    assert Log().given() == [] and len(Log()) == 0 and _private("") == ""
    runtime.process_id(), cli.logs(), cli.entry_point(), pytest_plugin.pytest_configure(None)
'''


def test_the_check_finds_what_only_a_test_calls():
    package = {module: ast.parse(text) for module, text in PACKAGE_SNIPPET.items()}
    tests = referenced(ast.parse(TESTS_SNIPPET))
    assert used_only_by_tests(package, tests, set()) == ["jaxrun/cli.py:entry_point", "jaxrun/reader.py:Log.given",
                                                "jaxrun/reader.py:innermost_frame"]
    # An entry point that pyproject.toml names is used.
    assert used_only_by_tests(package, tests, {"entry_point"}) == ["jaxrun/reader.py:Log.given",
                                                          "jaxrun/reader.py:innermost_frame"]
