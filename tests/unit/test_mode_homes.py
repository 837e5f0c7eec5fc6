"""Modes have homes: no branch on "recoverable", "interactive" or "elastic"
outside the room that owns the idea and the restart policy.

A branch is the test of an ``if``, ``elif``, ``while``, a conditional
expression or a comprehension's ``if``.  It branches on a mode when it reads
a name or an attribute that spells one (``config.interactive``,
``options.recoverable``, ``entry.elastic``, ``config.min_hosts``).  The
restart policy answers what follows an end, and the interactive room drives
a session; everywhere else asks them, or reads what the mode's type
supplies.  The places that carry an announcement or check an option stay,
each with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jaxrun

PACKAGE = Path(jaxrun.__file__).parent
MODE_WORDS = re.compile(r"^(interactive|recoverable|recoverability|elastic|elastic_\w+|min_hosts|kernel_pipe)$")
HOMES = (
    "launcher/restarts/",  # the policy, the elastic choice of hosts
    "launcher/interactive/",  # the session and its frontends
    "core/modes.py",  # what each mode supplies
)
# Not a mode's branch, each for its reason.
CARRIERS = {
    # The announcement itself, on its way from the child to the policy: each
    # far end passes on what its process said, in its own transport.
    "backends/ssh/session_agent.py": "writes the joined marker that carries the announcement",
    "launcher/attempt/joins.py": "reads the announcement from the joined file",
    "contract/helpers.py": "writes the joined file's announcement",
    "launcher/setup/plan.py": "tells each far end what --recoverable or --no-recoverable decided",
    # Checks of the options, where bad input is refused before anything starts.
    "launcher/setup/configure.py": "refuses --min-hosts where the engine cannot place a job anew",
}


def mode_branches(tree: ast.AST) -> list[int]:
    """Lines of branches whose test reads a name or attribute that spells a mode."""
    tests = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
    lines = []
    for test in tests:
        for part in ast.walk(test):
            word = part.attr if isinstance(part, ast.Attribute) else part.id if isinstance(part, ast.Name) else None
            if word is not None and MODE_WORDS.match(word):
                lines.append(test.lineno)
                break
    return sorted(set(lines))


def test_no_module_branches_on_a_mode_outside_its_home():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith(HOMES) or name in CARRIERS:
            continue
        found += [f"{name}:{line}" for line in mode_branches(ast.parse(path.read_text()))]
    assert found == []


def test_every_carrier_still_carries():
    """A carrier that no longer branches on a mode leaves the list."""
    for name in CARRIERS:
        assert mode_branches(ast.parse((PACKAGE / name).read_text())), name


def test_the_check_finds_each_kind_of_branch():
    tree = ast.parse("if config.interactive:\n    pass\n"
                     "x = 1 if options.recoverable else 2\n"
                     "while entry.elastic:\n    break\n"
                     "y = [h for h in hosts if min_hosts]\n"
                     "z = f(recoverable=True)\n"  # a keyword is no branch
                     "if decision.answer is Answer.RESTART_ELASTIC:\n    pass\n")  # the policy's answer is
    assert mode_branches(tree) == [1, 3, 4, 6]
