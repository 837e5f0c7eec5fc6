"""The time account's record and the straggler rule, on sequences recorded
from real jobs (``tests/data/straggler_job.py``, 4 processes, each TIME line
as the launcher heard it) and on made ones; and the child's accountant on
a fake clock."""

from __future__ import annotations

import dis
import threading
import time
import weakref

import pytest

from jaxrun import cli, contract
from jaxrun.child.watch import accounting, place
from jaxrun.launcher.attempt import straggler
from jaxrun.launcher.attempt.straggler import StragglerRule
from jaxrun.launcher.setup import plan as planning

HOSTS = {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"}

# Recorded here (bench machine, loaded): process 2's input 60% longer.
HOST_SHAPED = [
    (0, "time 1796459760.505 2.012 0.790 0.454 0.536 0.232"), (1, "time 1796459760.506 2.011 0.773 0.441 0.590 0.208"),
    (2, "time 1796459760.505 2.024 1.206 0.488 0.073 0.256"), (3, "time 1796459760.513 2.016 0.721 0.567 0.497 0.231"),
    (0, "time 1796459760.505 6.031 2.717 1.421 1.662 0.232"), (1, "time 1796459760.506 6.026 2.905 1.311 1.602 0.208"),
    (2, "time 1796459760.505 6.053 4.398 1.254 0.145 0.256"), (3, "time 1796459760.513 6.030 2.789 1.437 1.573 0.231"),
    (0, "time 1796459760.505 7.659 3.526 1.758 2.143 0.232"), (1, "time 1796459760.506 7.659 3.783 1.653 2.015 0.208"),
    (2, "time 1796459760.505 7.659 5.576 1.658 0.169 0.256"), (3, "time 1796459760.513 7.652 3.647 1.744 2.030 0.231"),
]
# The same job clean: every input +-10% a step.
CLEAN = [
    (0, "time 1796459769.165 2.019 0.836 0.632 0.275 0.275"), (1, "time 1796459769.166 2.000 0.908 0.483 0.289 0.320"),
    (2, "time 1796459769.165 2.030 0.847 0.570 0.316 0.297"), (3, "time 1796459769.176 2.016 0.894 0.507 0.304 0.310"),
    (0, "time 1796459769.165 6.022 3.161 1.781 0.804 0.275"), (1, "time 1796459769.166 6.014 3.129 1.761 0.805 0.320"),
    (2, "time 1796459769.165 6.051 3.165 1.787 0.802 0.297"), (3, "time 1796459769.176 6.044 3.088 1.792 0.853 0.310"),
    (0, "time 1796459769.165 6.554 3.465 1.894 0.919 0.275"), (1, "time 1796459769.166 6.558 3.458 1.862 0.918 0.320"),
    (2, "time 1796459769.165 6.560 3.350 1.942 0.970 0.297"), (3, "time 1796459769.176 6.550 3.419 1.867 0.953 0.310"),
]


def replay(heard, hosts=HOSTS) -> tuple[StragglerRule, list[str]]:
    notes: list[str] = []
    rule = StragglerRule(hosts, notes.append)
    for rank, line in heard:
        rule.heard(rank, contract.TimeSplit.of(line))
    return rule, notes


def made(windows: list[dict[int, tuple[float, float, float]]], seconds: float = 5.0) -> list[tuple[int, str]]:
    """Cumulative TIME lines from per-window (work, programs, waiting) seconds."""
    totals = {rank: [0.0, 0.0, 0.0] for rank in windows[0]}
    heard = []
    for k, window in enumerate(windows, 1):
        for rank, parts in window.items():
            totals[rank] = [a + b for a, b in zip(totals[rank], parts)]
            heard.append((rank, contract.TimeSplit(100.0, seconds * k, *totals[rank]).line()))
    return heard


def test_the_recorded_host_shaped_straggler_is_named_once_while_it_runs_and_at_the_end():
    rule, notes = replay(HOST_SHAPED)
    assert len(notes) == 1 and notes[0].startswith("jaxrun: process 2 on hostB is the straggler: the others spent")
    found = rule.straggler()
    assert (found.rank, found.host, found.windows, found.judged) == (2, "hostB", 3, 3)
    assert 0.25 < found.lost < 0.30  # the others' waiting shares: 28-29% of their time less compiles
    assert found.work_ratio == pytest.approx(5.576 / 3.647, rel=1e-3) and 0.9 < found.programs_ratio < 1.0
    assert "its own work (input, Python) 1.5x the others', its programs 1.0x" in found.line()


def test_the_recorded_clean_job_names_nobody():
    rule, notes = replay(CLEAN)
    assert notes == [] and rule.straggler() is None
    assert len(rule.windows) == 2  # the last window (0.5 s, the job's end) is too short to judge
    assert all(gap < straggler.GAP / 2 for _, gap in rule.windows), rule.windows


def test_the_one_named_is_the_one_the_others_wait_for_never_the_one_that_waits():
    """Process 1 waits far more than the rest (a host of its own waits for
    its input from elsewhere, say): nobody waits for it, and for nobody else
    in particular, so nobody is named; process 3, waited for by every other
    process, is."""
    waits_most = [{0: (3, 1, 1.0), 1: (1, 1, 3.0), 2: (3, 1, 1.0), 3: (3, 1, 1.0)}] * 4
    assert replay(made(waits_most))[0].straggler() is None
    waited_for = [{0: (3, 1, 1.0), 1: (3, 1, 1.0), 2: (3, 1, 1.0), 3: (4.8, 0.2, 0.0)}] * 4
    assert replay(made(waited_for))[0].straggler().rank == 3


def test_lateness_that_moves_between_processes_is_not_consistent():
    """Process 1 is late in one window, process 3 in the next: each window
    accuses someone, no two in a row the same one, and the whole account
    accuses nobody."""
    late_1 = {0: (3, 1, 1.0), 1: (4.8, 0.2, 0.0), 2: (3, 1, 1.0), 3: (3, 1, 1.0)}
    late_3 = {0: (3, 1, 1.0), 1: (3, 1, 1.0), 2: (3, 1, 1.0), 3: (4.8, 0.2, 0.0)}
    rule, notes = replay(made([late_1, late_3] * 3))
    assert rule.verdicts == [1, 3] * 3
    assert notes == [] and rule.straggler() is None


def test_the_console_says_the_straggler_as_soon_as_top_shows_it_also_between_two_windows():
    """The last two windows accuse process 2 while the whole account does not
    yet (eight even windows before them); then process 2's next split comes,
    a long one with no wait, and the whole account accuses it: top shows it
    from then on (``now``), and the console must say it then, not at the
    next window's close (a job released on top's word had no line)."""
    notes: list[str] = []
    rule = StragglerRule(HOSTS, notes.append)
    totals, covered = {r: [0.0, 0.0, 0.0] for r in HOSTS}, dict.fromkeys(HOSTS, 0.0)

    def heard(rank, seconds, parts):
        covered[rank] += seconds
        totals[rank] = [a + b for a, b in zip(totals[rank], parts)]
        rule.heard(rank, contract.TimeSplit(100.0, covered[rank], *totals[rank]))

    for _ in range(8):
        for rank in HOSTS:
            heard(rank, 5.0, (2.0, 2.0, 1.0))
    for _ in range(2):
        for rank in HOSTS:
            heard(rank, 5.0, (3.5, 1.0, 0.5) if rank == 2 else (2.5, 1.0, 1.5))
    assert rule.verdicts[-2:] == [2, 2] and rule.now[1] is None and notes == []
    heard(2, 30.0, (29.0, 1.0, 0.0))
    assert rule.now[1] is not None and rule.now[1].rank == 2
    assert notes == [f"jaxrun: {rule.now[1].line()}"]
    for rank in (0, 1, 3):  # the window closes: said once, not again
        heard(rank, 30.0, (10.0, 1.0, 19.0))
    assert len(notes) == 1


def test_a_straggler_named_while_the_job_ran_is_in_its_summary_while_the_whole_account_accuses_it():
    """A loaded machine: the first two windows (start-up, compiles slowed
    for everyone) accuse nobody, three accuse process 2 (named live after
    the second), and the last (the job told to stop) nobody: 3 of 6, under
    the majority.  The whole account still accuses process 2, so the summary
    says what the job printed; before, it said nothing (four suite workers
    on two cores, a test's job)."""
    even = {0: (2, 2, 1.0), 1: (2, 2, 1.0), 2: (2, 2, 1.0), 3: (2, 2, 1.0)}
    late_2 = {0: (2.5, 1, 1.5), 1: (2.5, 1, 1.5), 2: (3.5, 1, 0.5), 3: (2.5, 1, 1.5)}
    rule, notes = replay(made([even, even, late_2, late_2, late_2, even]))
    assert rule.verdicts == [None, None, 2, 2, 2, None]
    assert len(notes) == 1 and notes[0].startswith("jaxrun: process 2 on hostB is the straggler: ")
    found = rule.straggler()
    assert found is not None and (found.rank, found.windows, found.judged) == (2, 3, 6)
    # Never named while it ran (never two windows in a row): the majority decides, as before.
    unnamed = StragglerRule(HOSTS)
    for rank, line in made([even, even, late_2, even, late_2, even]):
        unnamed.heard(rank, contract.TimeSplit.of(line))
    assert unnamed.said is None and unnamed.straggler() is None


def test_a_window_closes_only_when_every_running_process_has_reported():
    rule, _ = replay(HOST_SHAPED[:7])  # the second round lacks process 3's
    assert len(rule.windows) == 1
    rule.ended(3)  # gone: the window closes without it
    assert len(rule.windows) == 2


def test_a_window_closed_by_a_process_that_ended_says_the_straggler_it_names():
    rule, notes = replay(HOST_SHAPED[:7])  # process 2 lags; process 3's second split never comes
    assert notes == [] and rule.straggler(final=False) is None
    rule.ended(3)  # its window closes without it, the second that accuses process 2
    found = rule.straggler(final=False)
    assert found is not None and found.rank == 2 and notes == [f"jaxrun: {found.line()}"]


def test_a_process_whose_account_began_again_is_judged_from_its_new_start():
    """A process started again alone (a recoverable job) begins a new
    account: its window is the new account itself, never a negative one."""
    rule, _ = replay(made([{0: (3, 1, 1.0), 1: (3, 1, 1.0), 2: (4.8, 0.2, 0.0)}] * 2), hosts={0: "a", 1: "a", 2: "b"})
    for rank in (0, 1):
        rule.heard(rank, contract.TimeSplit(100.0, 15.0, 9, 3, 3.0))
    rule.heard(2, contract.TimeSplit(200.0, 5.0, 4.8, 0.2, 0.0))  # its new account
    assert rule.verdicts == [2, 2, 2] and rule.straggler().rank == 2


def test_a_time_line_says_its_split_and_nothing_else_is_one():
    split = contract.TimeSplit(1796459760.505, 6.031, 2.717, 1.421, 1.662, 0.232, 0.5)
    assert split.line() == "time 1796459760.505 6.031 2.717 1.421 1.662 0.232 0.500"
    assert contract.TimeSplit.of(split.line()) == split and len(split.line()) <= contract.TIME_LINE_MAX
    # A far end of the last version says six numbers: its idle reads as 0.
    assert contract.TimeSplit.of("time 1796459760.505 6.031 2.717 1.421 1.662 0.232").idle == 0.0
    longest = contract.TimeSplit(1796459760.505, *[999999.999] * 6)  # a run of 11 days
    assert contract.TimeSplit.of(longest.line()) == longest
    for bad in ("time 1 2 3", "time 1 2 3 4 5 x", "time 1 2 3 4 -5 6", "time 1 2 3 4 nan 6", "busy", "spin 2 1.0",
                "time " + " ".join(["1" * 30] * 6)):
        assert contract.TimeSplit.of(bad) is None, bad
    window = split.minus(contract.TimeSplit(1796459760.505, 2.012, 0.79, 0.454, 0.536, 0.232))
    assert window.values() == pytest.approx((1796459762.517, 4.019, 1.927, 0.967, 1.126, 0.0, 0.5))


def test_the_activity_file_gives_its_state_then_its_time_line(tmp_path):
    path = tmp_path / "process-0.activity"
    path.write_text("time 1.000 2.000 1.000 0.500 0.500 0.000\nidle\n")
    assert contract.read_activity_file(str(path)) == ["idle", "time 1.000 2.000 1.000 0.500 0.500 0.000"]
    path.write_text("spin 2 1.97\n")
    assert contract.read_activity_file(str(path)) == ["spin 2 1.97"]
    path.write_text("x" * 400)
    assert contract.read_activity_file(str(path)) == []


class Frames:
    """The main thread's innermost frame, as the accountant's walk sees it."""

    def __init__(self, filename: str):
        self.code = compile("pass", filename, "exec")

    def __call__(self):
        frame = type("Frame", (), {"f_code": self.code, "f_back": None, "f_lasti": 0, "f_lineno": 1})()
        return {1: frame}


@pytest.mark.parametrize("filename, cpu, part", [
    ("/home/u/train.py", 0.02, "work"),  # its own Python, its main thread on a CPU: work (the goodput's input)
    ("/home/u/train.py", 0.0, "idle"),  # its own code, parked: a sleep, a queue's get
    ("/site-packages/jax/_src/pjit.py", 0.02, "programs"),  # inside JAX, a core's worth of CPU
    ("/site-packages/jax/_src/pjit.py", 0.0, "waiting"),  # inside JAX, no CPU: waiting for the others
    ("/site-packages/jax/_src/compiler.py", 0.0, "compile"),
])
def test_each_tick_goes_to_the_part_the_main_thread_is_in(filename, cpu, part):
    clock, used = [0.0], [0.0]
    account = accounting.Accountant(lambda line: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                    cpu=lambda: used[0], delay=lambda: 0.0, frames=Frames(filename),
                                    host=lambda: used[0], running=lambda: False)
    for _ in range(10):
        clock[0] += 0.02
        used[0] += cpu
        account.look()
    split = account.split()
    assert getattr(split, part) == pytest.approx(0.2) and split.covered == pytest.approx(0.2)
    assert split.work + split.programs + split.waiting + split.compile + split.idle == pytest.approx(0.2)


def test_cpu_the_process_wanted_but_did_not_get_counts_as_its_programs():
    """A throttled or starved process inside JAX used no CPU, but waited for
    one: that is its programs' time, not a wait for the others."""
    clock, delay = [0.0], [0.0]
    account = accounting.Accountant(lambda line: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                    cpu=lambda: 0.0, delay=lambda: delay[0], frames=Frames("/x/jax/_src/api.py"))
    clock[0], delay[0] = 0.1, 0.075
    account.look()
    assert (account.split().programs, account.split().waiting) == pytest.approx((0.075, 0.025))


SITES = '''
def g(x, y):
    z = step(x)
    w = trainer.step(x, y)
    v = local_fn(x)
    u = x.block_until_ready()
    q = step(x, key=y)
    r = outer(inner(x), y)
'''


def test_a_call_site_says_what_it_calls_from_its_bytecode():
    namespace: dict = {}
    exec(SITES, namespace)
    code = namespace["g"].__code__
    calls = [i.offset for i in dis.get_instructions(code) if i.opname == "CALL"]
    found = [place.callee_recipe(code, offset) for offset in calls]
    assert found == [(False, "step"), (False, "trainer", "step"), (False, "local_fn"),
                     (True, "x", "block_until_ready"), (False, "step"), (False, "inner"), (False, "outer")]


# A call into JAX's Python, from a file JAX's own would be taken for.
FAKE_JAX = compile("def traced(arg):\n    time.sleep(arg)\n", "/site-packages/jax/_src/fake_pjit.py", "exec")


def site(fn, arg):  # the script's call site: the callable in its own variables
    return fn(arg)


def other_site(fn, arg):
    return fn(arg)


def parked_in(account, target, *args) -> int:
    """Where the accountant places a real thread parked in ``target(*args)``."""
    ready = threading.Event()

    def run():
        ready.set()
        target(*args)

    thread = threading.Thread(target=run)
    thread.start()
    ready.wait()
    time.sleep(0.1)
    account.main = thread.ident
    try:
        return account.place()
    finally:
        thread.join()


def test_a_call_site_seen_going_into_jax_is_inside_jax_from_then_on_whatever_it_calls():
    """A jitted call's first run is JAX's Python (the trace): the site is
    learned there, and its later calls, C++ alone, are still inside JAX."""
    namespace = {"time": time}
    exec(FAKE_JAX, namespace)
    account = accounting.Accountant(lambda line: None, cpu=lambda: 0.0, delay=lambda: 0.0)
    assert parked_in(account, site, time.sleep, 0.3) == accounting._OUTSIDE  # not seen yet
    assert parked_in(account, site, namespace["traced"], 0.3) == accounting._INSIDE
    assert parked_in(account, site, time.sleep, 0.3) == accounting._INSIDE  # learned
    assert parked_in(account, other_site, time.sleep, 0.3) == accounting._OUTSIDE


class Held:
    pass


def test_the_account_never_keeps_a_local_of_the_script_alive():
    """``f_locals`` of a running frame would copy its locals into a dict that
    outlives their ``del``: a state or a batch kept on the device."""
    account = accounting.Accountant(lambda line: None, cpu=lambda: 0.0, delay=lambda: 0.0)
    looked, freed = threading.Lock(), []
    looked.acquire()

    def script():
        held = Held()
        ref = weakref.ref(held)
        wait = looked.acquire  # a callable of C in the frame's own variables: this frame is the innermost
        wait(timeout=5)
        del held
        freed.append(ref() is None)

    thread = threading.Thread(target=script)
    thread.start()
    time.sleep(0.1)
    account.main = thread.ident
    for _ in range(3):
        account.look()
    looked.release()
    thread.join()
    assert freed == [True]


@pytest.mark.parametrize("account, environ", [(True, None), (False, contract.ACCOUNT_OFF)])
def test_no_account_reaches_every_process_and_the_child_then_keeps_none(account, environ):
    opts = planning.LaunchOptions(target=planning.Target("t.py"), num_processes=2, coordinator="h:1", run_id="r",
                                  account=account)
    assert [spec.env.get(contract.ACCOUNT) for spec in planning.plan(opts)] == [environ, environ]
    assert accounting.wanted({contract.ACTIVITY_FILE: "/nowhere",
                              **({contract.ACCOUNT: environ} if environ else {})}) is account
    assert accounting.wanted({}) is False  # no activity file: nowhere to tell


def test_no_account_is_an_option_and_the_account_is_on_without_it():
    assert cli.main.make_context("jaxrun", ["--no-account", "t.py"]).params["no_account"] is True
    assert cli.main.make_context("jaxrun", ["t.py", "--no-account"]).params["no_account"] is False  # the script's
