"""The README's two commands are the ones CI and users run, and they work; the
README stays an entrance, the options page names every option --help-all lists, and
the documentation's relative links lead somewhere."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest


def repository_root() -> Path:
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    raise RuntimeError("no pyproject.toml above this test")


ROOT = repository_root()
README_MAX_LINES = 250
LINKED_PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "examples" / "README.md", *(ROOT / "docs").glob("*.md")]
)


def fenced_after(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(heading, 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_install_command_runs_the_toy(jaxrun):
    (line,) = fenced_after("## Install and run the example")
    install, run = line.split(" && ")
    # ml_dtypes where docs/performance.md says (0.7 doubles every import of jax), as the tests have it.
    assert install == "pip install -e . 'ml_dtypes<0.7'"
    assert "`pip install 'ml_dtypes<0.7'`" in (ROOT / "docs" / "performance.md").read_text()
    assert '"ml_dtypes<0.7"' in (ROOT / "pyproject.toml").read_text()
    words = shlex.split(run)
    assert words[0] == "jaxrun"
    code, out, err = jaxrun(*words[1:], cwd=ROOT)
    assert code == 0, err
    assert all(f"process={r} got result: -0.12398731708526611" in out for r in range(4))
    # The sample after the command is what the run printed: its process lines are
    # the output's, and its jaxrun lines are the run's, one for one, but for the figures.
    sample = fenced_after("Each of the 4 processes prints")
    assert not {x for x in sample if x.startswith("[")} - set(out.splitlines()), (sample, out)
    said = [x for x in err.splitlines() if x.startswith("jaxrun:")]
    shapes = [shape_of(x) for x in sample if x.startswith("jaxrun:")]
    assert len(said) == len(shapes) and all(re.fullmatch(p, x) for p, x in zip(shapes, said)), (sample, err)


def shape_of(line: str) -> str:
    """A sample line as a pattern: its figures and its log folder stand for any."""
    parts = re.split(r"(/tmp/jaxrun-logs-\S+|\d+(?:\.\d+)?)", line)
    return "".join(re.escape(part) if i % 2 == 0 else (r"\S+" if part.startswith("/") else r"\d+(?:\.\d+)?")
                   for i, part in enumerate(parts))


def test_the_readme_names_every_subcommand_help_lists():
    from jaxrun.cli.helptext import COMMANDS

    text = (ROOT / "README.md").read_text()
    assert [name for name in COMMANDS if f"jaxrun {name}" not in text] == []


def test_the_coordinator_is_where_the_readme_says():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "starts the job's coordinator on a private Unix socket" in text and "bound to loopback" not in text
    done = subprocess.run([sys.executable, "-m", "jaxrun", "--dry-run", "-n", "2", "examples/toy.py"],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    address = re.search(r"JAXRUN_COORDINATOR_ADDRESS=(\S+)", done.stdout + done.stderr).group(1)
    assert address.startswith("unix:") and address.endswith(".sock"), address


def test_an_exception_shows_as_the_readme_says(jaxrun, tmp_path):
    """The README: the shim prints the traceback; the console folds JAX's
    frames into one line, and a traceback another process showed; the log
    keeps them whole."""
    text = " ".join((ROOT / "README.md").read_text().split())
    assert ("The shim prints its traceback (on the console JAX's frames fold into one line, and so does one "
            "another process showed; the log keeps them whole)") in text
    script = ROOT / "tests" / "data" / "device_put_mistake.py"
    code, out, err = jaxrun("-n", 2, "--cpu-devices", 1, "--log-dir", tmp_path, script)
    assert code == 1, err
    assert err.count("Traceback (most recent call last):") == 1 and re.search(r"^\[\d\]   \.\.\. \d+ frames of jax$",
                                                                           err, re.M), err
    assert re.search(rf"^\[\d\] AssertionError at {script}:\d+, as process \d's above", err, re.M), err
    assert "jax/_src/" not in err
    assert all("jax/_src/dispatch.py" in (tmp_path / f"process-{r}.stderr").read_text() for r in range(2))


def test_the_runtime_snippet_runs_as_its_comment_says(jaxrun, tmp_path):
    section = (ROOT / "README.md").read_text().split("## Runtime helpers", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1).splitlines()
    command = block[0].removeprefix("# ")
    words = shlex.split(command)
    assert words[0] == "jaxrun" and words[-1] == "train.py", command
    script = tmp_path / "train.py"
    script.write_text("\n".join(block) + "\n")
    code, out, err = jaxrun(*words[1:-1], script)
    assert code == 0, err
    assert out.splitlines() == ["[0] global batch (16, 4)"], out


def test_ci_runs_exactly_the_readme_test_command():
    (line,) = fenced_after("## Run the tests")
    install, test = line.split(" && ")
    ci = (ROOT / ".ci" / "run").read_text()
    # CI may add flags (-q; an eager upgrade, as a fresh venv gets the newest), never another target.
    assert re.search(r"^python -m pip install -q (--upgrade --upgrade-strategy eager )?-e '\.\[test\]'$", ci, re.M), ci
    assert install == "pip install -e '.[test]'"
    assert ci.rstrip().splitlines()[-1] == test


def test_readme_is_an_entrance_not_the_reference():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"


# Inline links and images, [text](target) or [text](target "title"); code is
# stripped first, so a `[i](j)` inside code is not taken for a link.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def relative_links(page: Path) -> list[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", page.read_text()))
    targets = [m.group(1) for m in _LINK.finditer(text)]
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def test_the_link_finder_sees_links_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "[a](a.md) ![b](img/b.png \"B\") [c](https://example.org) [d](#here) [e](e.md#part)\n"
        "`[f](f.md)`\n```\n[g](g.md)\n```\n- item\n\n  ```\n  [h](h.md)\n  ```\n"
    )
    assert relative_links(page) == ["a.md", "img/b.png", "e.md#part"]


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_that_exists(page):
    assert page.is_file(), f"{page.relative_to(ROOT)} is missing"
    broken = [
        target for target in relative_links(page)
        if not (page.parent / target.split("#", 1)[0]).exists()
    ]
    assert not broken, f"{page.relative_to(ROOT)} links to files that do not exist: {broken}"


# Option names as --help prints them at the start of an entry: "-n, --num-processes",
# "--preload / --no-preload".
_HELP_OPTION = re.compile(r"^  (-[\w-]+(?:(?:, | / )-[\w-]+)*)", re.M)


@pytest.mark.parametrize("command", [["--help-all"], ["k8s", "--help"]], ids=["jaxrun", "jaxrun k8s"])
def test_options_page_names_every_option_of_help(command):
    help_text = subprocess.run(
        [sys.executable, "-m", "jaxrun", *command], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    names = {name for entry in _HELP_OPTION.findall(help_text) for name in re.split(r", | / ", entry)}
    assert "--help" in names
    jaxrun_part, k8s_part = (ROOT / "docs" / "options.md").read_text().split("## `jaxrun k8s`", 1)
    page = k8s_part if command[0] == "k8s" else jaxrun_part
    documented = set(re.findall(r"`(-[\w-]+)", page)) | set(re.findall(r"[`,/] ?(-[\w-]+)", page))
    assert not names - documented, f"docs/options.md lacks {sorted(names - documented)}"
