"""Issue 68, the pure parts: summaries that earn their lines (a repeated
text capped with a pointer to its file, the failure first, the goodput line
where it tells something, -q), the console's folded tracebacks, the stall's
culprit never named for the line a process reached its collective from, and
the subcommands in --help and --help-all."""

from __future__ import annotations

import io
import signal

import click
import pytest
from click.testing import CliRunner
from fixtures.records import process_records

from jaxrun import cli, contract
from jaxrun.cli import helptext
from jaxrun.contract import ErrorRecord
from jaxrun.core.events import Stream
from jaxrun.core.outcome import Outcome, Place, ProcessRecord, StopReason, Verdict
from jaxrun.launcher.attempt import activity as stall
from jaxrun.launcher.output.printer import ConsolePrinter
from jaxrun.reporting import goodput, stacks, summary

JAX_FILE = "/venv/lib/python3.11/site-packages/jax/_src/array.py"


# -- the stall's culprit -----------------------------------------------------------------

def dump(*frames: str) -> str:
    """A faulthandler dump of the main thread, innermost frame first."""
    return "Current thread 0x00007f (most recent call first):\n" + "".join(
        f'  File "{file}", line {line} in {func}\n' for file, line, func in (f.split(":") for f in frames))


def test_a_dump_says_whether_the_main_thread_waits_inside_jax():
    assert stacks.waits_inside_jax(dump(f"{JAX_FILE}:623:_value", "/w/train.py:13:<module>"))
    assert not stacks.waits_inside_jax(dump("/w/train.py:10:<module>"))
    assert not stacks.waits_inside_jax("no dump here\n")


def inside(line: int, source: str) -> Place:
    return Place("/w/train.py", line, "<module>", source, contract.IN_SCRIPT, inside_jax=True)


def test_processes_waiting_inside_jax_never_stand_out_for_the_line_that_reached_it():
    """Rank 3 sleeps in its own code; 0 waits in the collective through
    print(float(y)), 1 and 2 through jax.device_get(y): only 3 stands out."""
    asleep = Place("/w/train.py", 10, "<module>", "time.sleep(45)", contract.IN_SCRIPT)
    places = {0: inside(13, "print(float(y))"), 1: inside(15, "jax.device_get(y)"),
              2: inside(15, "jax.device_get(y)"), 3: asleep}
    found = stall.classify(places, 5)
    assert [g.ranks for g in found.odd] == [(3,)]
    assert found.waiting.ranks == (0, 1, 2)
    assert "print(float(y))" in found.waiting.place.text() and "/w/train.py:15" in found.waiting.place.text()


def test_without_a_process_outside_jax_their_lines_still_tell_them_apart():
    """Every process in a collective, one of them in another (the parted
    programs): the one at the odd line still stands out."""
    found = stall.classify({0: inside(16, "eval_step(w, x)"), 1: inside(12, "float(loss)"),
                            2: inside(12, "float(loss)")}, 5)
    assert [g.ranks for g in found.odd] == [(0,)] and found.waiting.ranks == (1, 2)


# -- the summary -------------------------------------------------------------------------

def records(folder, n: int = 2) -> list[ProcessRecord]:
    return process_records(folder, n)


BIG = "\n".join(f" [{i}.000e+00 {i + 1}.000e+00 ... " + "9" * 300 + "]" for i in range(40))


def device_put_mistake(folder) -> Outcome:
    """Process 0 raised JAX's assertion that holds the whole array."""
    recs = records(folder)
    message = "passed to device_put is not the same on each process. Expected: [[0.0 " + "1.0 " * 80 + "\n" + BIG
    traceback = ('Traceback (most recent call last):\n  File "/w/train.py", line 9, in <module>\n'
                 f'  File "{JAX_FILE}", line 5, in device_put\nAssertionError: {message}\n')
    ErrorRecord("AssertionError", message, traceback, 5.0).dump(recs[0].error_file)
    with open(recs[0].stderr_log, "w") as f:
        f.write(traceback)
    recs[0].verdict = Verdict.ROOT_CAUSE
    return Outcome(recs, 1, StopReason.FAILURE, root_cause=0)


def test_an_exception_is_quoted_capped_with_its_line_and_its_file(tmp_path):
    outcome = device_put_mistake(tmp_path)
    lines = summary.summary_lines(outcome, str(tmp_path))
    assert lines[0] == "jaxrun: process 0 failed first: exit code 1 (pid 100)"
    said = lines[1:lines.index("jaxrun: process 1 failed after the root cause")]
    assert len(said) == summary.EXCEPTION_LINES + 1, said
    assert all(len(line) < summary.QUOTED_WIDTH + 20 for line in said), said
    assert said[-1] == (f"jaxrun:   raised at /w/train.py:9; 37 more lines of it, and its traceback, in "
                        f"{outcome.records[0].stderr_log}")
    assert not any("last lines of" in line for line in lines)  # the traceback is not quoted again
    assert len(lines) <= 10


def test_a_log_quoted_is_capped_and_names_its_file(tmp_path):
    outcome = device_put_mistake(tmp_path)
    outcome.records[0].error_file = str(tmp_path / "none.json")  # no record: the end of the log says what happened
    with open(outcome.records[0].stderr_log, "a") as f:
        f.write(BIG + "\n")
    lines = summary.summary_lines(outcome, str(tmp_path))
    head = lines.index(f"jaxrun:   last lines of {outcome.records[0].stderr_log}:")
    quoted = lines[head + 1:lines.index("jaxrun: process 1 failed after the root cause")]
    assert len(quoted) == summary.QUOTED_LINES + 1 and quoted[0].startswith("    (")
    assert outcome.records[0].stderr_log in quoted[0]
    assert all(len(line) <= summary.QUOTED_WIDTH + 10 for line in quoted)


def test_the_failure_comes_first_and_quiet_keeps_it_and_the_folder_alone(tmp_path):
    outcome = device_put_mistake(tmp_path)
    outcome.records[0].resources = contract.Resources(100 << 20, 1.5)
    run = ["jaxrun: goodput 3% of 70.0 s; lost to stall 60.0 s"]
    lines = summary.summary_lines(outcome, "/logs", run)
    assert lines[0].startswith("jaxrun: process 0 failed first")
    assert lines.index(run[0]) > lines.index("jaxrun: process 1 failed after the root cause")
    assert lines[-2].startswith("jaxrun: peak memory") and lines[-1] == "jaxrun: logs in /logs"
    quiet = summary.summary_lines(outcome, "/logs", run, quiet=True)
    assert quiet == [line for line in lines if line not in run and not line.startswith("jaxrun: peak memory")]


def test_a_healthy_quiet_run_ends_with_the_folder_alone(tmp_path):
    recs = records(tmp_path)
    for rec in recs:
        rec.returncode, rec.verdict, rec.resources = 0, Verdict.OK, contract.Resources(100 << 20, 1.0)
    outcome = Outcome(recs, 0, None)
    assert summary.summary_lines(outcome, "/logs", quiet=True) == ["jaxrun: logs in /logs"]
    assert summary.summary_lines(outcome, "/logs")[-1] == "jaxrun: logs in /logs"


# -- when the goodput line is said ---------------------------------------------------------

def account(wall: float, **lost: float) -> goodput.Account:
    parts = dict.fromkeys(goodput.PARTS, 0.0) | {"startup": min(1.5, wall)} | lost
    parts["work"] = wall - sum(parts.values())
    return goodput.Account(0.0, wall, parts, ())


def test_the_goodput_line_is_said_for_a_long_run_or_one_that_lost_time():
    assert not goodput.worth_a_line(account(2.0))  # the toy: start-up is most of any short run
    assert not goodput.worth_a_line(account(30.0, compile=5.0, teardown=1.0))
    assert goodput.worth_a_line(account(goodput.WORTH_A_LINE_AFTER))
    for part in goodput.TROUBLE:
        assert goodput.worth_a_line(account(8.0, **{part: 3.0})), part


# -- the console's tracebacks ------------------------------------------------------------

TRACEBACK = (b'Traceback (most recent call last):\n'
             b'  File "/w/train.py", line 9, in <module>\n'
             b'    x = jax.device_put(local, sharding)\n'
             b'        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n'
             + b"".join(f'  File "{JAX_FILE}", line {n}, in f{n}\n    y = g()\n'.encode() for n in range(5))
             + b"AssertionError: not the same on each process. Expected: [[0.0\n"
             + b"".join(b" [%d.0 %d.0]\n" % (i, i) for i in range(30)))


def console(**kw) -> tuple[ConsolePrinter, io.BytesIO]:
    err = io.BytesIO()
    return ConsolePrinter(stdout=io.BytesIO(), stderr=err, log_dir="/logs", **kw), err


def test_a_traceback_folds_library_frames_caps_its_message_and_is_said_once():
    printer, err = console()
    for rank in range(4):
        printer.write(rank, Stream.STDERR, TRACEBACK)
    printer.write(1, Stream.STDERR, b"after\n")
    printer.flush()
    shown = err.getvalue().decode().splitlines()
    assert shown[:5] == ['[0] Traceback (most recent call last):', '[0]   File "/w/train.py", line 9, in <module>',
                         '[0]     x = jax.device_put(local, sharding)', '[0]         ' + "^" * 31,
                         '[0]   ... 5 frames of jax']
    assert shown[5:10] == ["[0] AssertionError: not the same on each process. Expected: [[0.0", "[0]  [0.0 0.0]",
                           "[0]  [1.0 1.0]", "[0]  [2.0 2.0]",
                           "[0]   ... (the rest of the message is in /logs/process-0.stderr)"]
    assert shown[10:] == [f"[{r}] AssertionError at /w/train.py:9, as process 0's above (its traceback: "
                          f"/logs/process-{r}.stderr)" for r in (1, 2, 3)] + ["[1] after"]


def test_verbose_shows_a_traceback_whole():
    printer, err = console(show_noise=True)
    printer.write(0, Stream.STDERR, TRACEBACK)
    printer.flush()
    assert err.getvalue() == b"".join(b"[0] " + line for line in TRACEBACK.splitlines(keepends=True))


# -- findable: the subcommands ---------------------------------------------------------

def test_help_names_every_subcommand_and_help_all_says_what_each_is_for():
    short = cli.main.get_help(click.Context(cli.main, info_name="jaxrun"))
    assert short.startswith("Usage: jaxrun [OPTIONS] SCRIPT [ARGS]...\n")
    assert ", ".join(helptext.COMMANDS) in short
    every = CliRunner().invoke(cli.main, ["--help-all"], prog_name="jaxrun").output
    assert every.startswith("Usage: jaxrun [OPTIONS] SCRIPT [ARGS]...\n")
    assert set(SUBCOMMANDS) == set(helptext.COMMANDS)
    for name, purpose in helptext.COMMANDS.items():
        assert f"  {name}  " in every and purpose in every, name


SUBCOMMANDS = ("logs", "top", "stacks", "profile", "probe", "k8s", "kernel")


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_listed_is_one(name, capsys):
    cli.entry_point([name, "--help"])  # exit status 0: nothing raised
    assert capsys.readouterr().out.startswith(f"Usage: jaxrun {name} ")
    assert name in helptext.COMMANDS


def test_quiet_keeps_a_stop_on_a_signal(tmp_path):
    recs = records(tmp_path)
    for rec in recs:
        rec.returncode, rec.verdict = -signal.SIGTERM, Verdict.STOPPED
    outcome = Outcome(recs, 143, StopReason.SIGNAL, signum=signal.SIGTERM)
    lines = summary.summary_lines(outcome, "/logs", quiet=True)
    assert lines[0].startswith("jaxrun: received SIGTERM") and lines[-1] == "jaxrun: logs in /logs"


def test_jaxrun_logs_shows_a_traceback_whole(tmp_path, capfd):
    """A log read back is for reading: `jaxrun logs` folds nothing."""
    from jaxrun.launcher.output import logs

    (tmp_path / "process-0.stdout").write_bytes(b"")
    (tmp_path / "process-0.stderr").write_bytes(TRACEBACK)
    logs.show(str(tmp_path), [0], "stream")
    assert capfd.readouterr().err.encode() == b"".join(b"[0] " + x for x in TRACEBACK.splitlines(keepends=True))
