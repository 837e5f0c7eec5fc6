"""A new engine is one StepProcess: the shared Step runs it, names it in the
engine's note and its log, and asks nothing of it by name.  Here the engine
is ``sh -c``, which starts the task agent once per rank with jaxrun's own
numbering, as an engine that knows no ranks of its own would.  (srun,
mpirun and the Ray driver run in tests/e2e.)"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Mapping

import pytest

from jaxrun import contract
from jaxrun.backends.scheduler.backend import task_argv
from jaxrun.backends.scheduler.step import Command, Notices, Step
from jaxrun.core.backend import NO_NEWS
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec

pytestmark = pytest.mark.timeout(60)


class Shell(Command):
    """An engine that is one shell line."""

    program = "sh"

    def __init__(self, script: str):
        self.script = script
        self.stopped: list[bool] = []

    def argv(self, env: Mapping[str, str]) -> list[str]:
        return ["/bin/sh", "-c", self.script]

    def stop(self, reached, hooks) -> None:
        self.stopped.append(reached)
        super().stop(reached, hooks)


def tasks(count: int, program: str) -> str:
    """A shell line that starts ``count`` task agents, each running ``program``."""
    agent = " ".join(task_argv(sys.executable, ())[:4])
    starts = [f"{contract.PROCESS_ID}={rank} {contract.NUM_PROCESSES}={count} {contract.LOCAL_PROCESS_ID}={rank} "
              f"{contract.LOCAL_PROCESS_COUNT}={count} {agent} {sys.executable} -c '{program}' &"
              for rank in range(count)]
    return " ".join(starts) + " wait"


def specs(count: int) -> list[ProcessSpec]:
    return [ProcessSpec(rank, rank, LOCAL_HOST, sys.executable, (), {}) for rank in range(count)]


def started(process: Command, count: int, tmp_path, console: io.StringIO) -> tuple[Step, list]:
    env = {k: v for k, v in os.environ.items() if k != contract.RANK_SOURCE}
    step = Step(process, specs(count), env, str(tmp_path), console, channel_host="127.0.0.1")
    children = [step.spawn(spec, {}, NO_NEWS) for spec in specs(count)]
    return step, children


def test_a_new_engine_runs_its_ranks_through_the_shared_step(tmp_path):
    program = 'import os; print("rank", os.environ["JAXRUN_PROCESS_ID"], flush=True); raise SystemExit(3)'
    console = io.StringIO()
    step, children = started(Shell(f"echo engine says hi; {tasks(2, program)}"), 2, tmp_path, console)
    try:
        ends = [child.wait() for child in children]
        outputs = [child.stdout.read() for child in children]
    finally:
        step.close()
    assert [end.returncode for end in ends] == [3, 3] and not any(end.lost for end in ends)
    assert outputs == [b"rank 0\n", b"rank 1\n"]
    assert "[sh] engine says hi\n" in console.getvalue()
    assert (tmp_path / "engine.log").read_bytes().startswith(b"engine says hi\n")


def test_an_engine_that_ends_first_is_named_in_every_ranks_log(tmp_path):
    step, children = started(Shell("echo no room; exit 4"), 2, tmp_path, io.StringIO())
    try:
        ends = [child.wait() for child in children]
        errs = [child.stderr.read().decode() for child in children]
    finally:
        step.close()
    assert [end.returncode for end in ends] == [4, 4]
    note = contract.EngineNote.of("sh", 4, False, str(tmp_path / "engine.log"))
    assert [contract.parse_engine_note(err) for err in errs] == [note, note]


def test_stopping_a_step_is_its_engines_own_rule(tmp_path):
    process = Shell("exec sleep 60")
    step, children = started(process, 1, tmp_path, io.StringIO())
    step.kill()
    assert children[0].wait().returncode == -9
    step.close()
    assert process.stopped == [False]  # no task had reached the step


def test_an_engine_notice_that_repeats_the_jobs_end_stays_off_the_console_and_others_pass():
    ruler = b"-" * 74 + b"\n"
    notices = Notices((b"exited with non-zero status",))
    shown = []
    for line in [b"before\n", ruler, b"mpirun detected that one or more processes exited with non-zero status\n",
                 ruler, ruler, b"There are not enough slots available\n", ruler, b"after\n", ruler, b"cut short\n"]:
        shown += notices.passing(line)
    shown += notices.held()
    assert shown == [b"before\n", ruler, b"There are not enough slots available\n", ruler, b"after\n",
                     ruler, b"cut short\n"]
    # An engine without such words shows everything at once, boxes too.
    assert Notices(()).passing(ruler) == [ruler]
