"""The README's two commands are the ones CI and users run, and they work."""

import re
import shlex

from conftest import ROOT


def fenced_after(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(heading, 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_install_command_runs_the_toy(jaxrun):
    (line,) = fenced_after("## Install and run the example")
    install, run = line.split(" && ")
    assert install == "pip install -e ."
    words = shlex.split(run)
    assert words[0] == "jaxrun"
    code, out, err = jaxrun(*words[1:], cwd=ROOT)
    assert code == 0, err
    assert all(f"process={r} got result: -0.12398731708526611" in out for r in range(4))


def test_ci_runs_exactly_the_readme_test_command():
    (line,) = fenced_after("## Run the tests")
    install, test = line.split(" && ")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -e '.[test]'" in ci and install == "pip install -e '.[test]'"
    assert ci.rstrip().splitlines()[-1] == test
