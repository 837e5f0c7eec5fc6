"""The parting check's rules (jaxrun/child/checks/parting.py): which waits
are a parting and how it is said, and the account's word of a long wait at
one line (jaxrun/child/watch/accounting.py)."""

from __future__ import annotations

import pytest

from jaxrun.child.checks.parting import APART, describe, parted, ripe
from jaxrun.child.watch import accounting, waiting

ALL = [0, 1, 2, 3]


def wait(at: str, *groups, fn: str = "", spans: str = "", opened=()) -> dict:
    return {"at": at, "groups": [list(g) for g in groups], "fn": fn, "spans": spans, "text": "x",
            "open": list(opened)}


@pytest.mark.parametrize("waits, finished, found", [
    ({0: wait("t.py:66", ALL)}, {1, 2, 3}, ALL),  # rank 0 evaluates, the others finished
    ({0: wait("t.py:66", ALL), 1: wait("t.py:61", ALL), 2: wait("t.py:61", ALL), 3: wait("t.py:61", ALL)},
     set(), ALL),  # ... the others wait in their next step
    ({0: wait("t.py:61", ALL), 1: wait("t.py:61", ALL), 3: wait("t.py:61", ALL)}, {2}, ALL),  # rank 2 skipped
    ({r: wait("t.py:61", ALL) for r in ALL}, set(), None),  # one line: a long program on an accelerator
    ({0: wait("t.py:66", ALL), 1: wait("t.py:61", ALL)}, set(), None),  # 2 and 3 still work
    ({0: wait("t.py:70", [0, 1]), 1: wait("t.py:70", [0, 1]), 2: wait("t.py:72", [2, 3]),
      3: wait("t.py:72", [2, 3])}, set(), None),  # two sub-meshes, each at its own line
    ({0: wait("t.py:80")}, {1, 2, 3}, None),  # a process-local program spans no one
    ({0: wait("t.py:70", [0, 1]), 1: wait("t.py:70", [0, 1])}, {2, 3}, None),  # a sub-mesh, the rest done
    ({0: wait("t.py:66", ALL), 1: wait("t.py:66", ALL)}, {0, 2, 3}, [0, 1, 2, 3]),  # a finished rank's stale wait
    ({0: dict(wait("t.py:66", [0, 1]), program="p1"), 1: dict(wait("t.py:70", [0, 1]), program="p1")}, {2, 3},
     None),  # one meeting, come to from two lines: together
    ({0: dict(wait("t.py:66", [0, 1]), program="p1"), 1: dict(wait("t.py:66", [0, 1]), program="p2")}, {2, 3},
     [0, 1]),  # two meetings at one line (inputs of other shapes): they never meet
])
def test_a_parting_is_a_group_whose_members_all_wait_or_finished_not_at_one_line(waits, finished, found):
    assert parted(waits, finished) == found


def test_a_parting_names_the_program_the_others_never_made_and_where_each_waits():
    ran = {"fn": "eval_step", "at": "/w/train.py:66", "spans": "0-3", "among": ALL}
    waits = {0: wait("/w/train.py:68", ALL, fn="_reduce_sum", spans="0-3", opened=[ran])}
    headline, lines = describe(ALL, waits, {1, 2, 3})
    assert headline == ("processes 0-3 parted: process 0 ran eval_step (spanning 0-3) at train.py:66 and "
                        "processes 1, 2, 3 never made it; now process 0 waits in _reduce_sum (spanning 0-3) at "
                        "train.py:68; processes 1, 2, 3 finished their script (a program that spans processes "
                        "runs on every one of them, or on none)")
    assert lines[1:] == ["process 0 ran eval_step at /w/train.py:66, which processes 1, 2, 3 never made",
                         "process 0 waits at /w/train.py:68: x"]


def test_a_parting_at_a_meeting_names_the_program_some_came_to_run_before_it_ran():
    """Issue 74: process 0 waits before evaluate's first run; 1 and 2 in their
    next step; 3 finished.  Two meetings on different programs name both."""
    met = dict(wait("/w/train.py:66", ALL, fn="evaluate", spans="0-3"), meets=True)
    waits = {0: met, 1: wait("/w/train.py:61", ALL, fn="train_step", spans="0-3"),
             2: wait("/w/train.py:61", ALL, fn="train_step", spans="0-3")}
    assert parted(waits, {3}) == ALL
    headline, lines = describe(ALL, waits, {3})
    assert headline == ("processes 0-3 parted: process 0 came to run evaluate (spanning 0-3) at train.py:66, which "
                        "processes 1, 2, 3 never reached (stopped before it ran: none of its collectives ran); "
                        "process 3 finished its script; processes 1, 2 wait in train_step (spanning 0-3) at "
                        "train.py:61 (a program that spans processes runs on every one of them, or on none)")
    assert lines[1:] == ["process 0 waits to run evaluate at /w/train.py:66: x",
                         "processes 1, 2 wait at /w/train.py:61: x"]
    other = dict(wait("/w/train.py:70", ALL, fn="gather", spans="0-3"), meets=True)
    headline, _ = describe(ALL, {0: met, 1: other, 2: other, 3: other}, set())
    assert headline.startswith("processes 0-3 parted: process 0 came to run evaluate (spanning 0-3) at train.py:66; "
                               "processes 1, 2, 3 came to run gather (spanning 0-3) at train.py:70 (stopped before "
                               "any of them ran)"), headline


class Heard:
    seconds = 3.0

    def __init__(self):
        self.said = []

    def changed(self, waiting: bool) -> None:
        self.said.append(waiting)


class Frames:
    """The main thread inside JAX (innermost), called from the script at ``line[0]``."""

    def __init__(self, line):
        self.line, self.script = line, compile("step = 1", "/home/u/train.py", "exec")  # not equal to the other
        self.jax = compile("pass", "/site-packages/jax/_src/pjit.py", "exec")

    def __call__(self):
        script = type("Frame", (), {"f_code": self.script, "f_back": None, "f_lasti": 0, "f_lineno": self.line[0]})()
        inner = type("Frame", (), {"f_code": self.jax, "f_back": script, "f_lasti": 0, "f_lineno": 1})()
        return {1: inner}


def test_the_account_says_a_wait_at_one_line_once_it_lasted_and_when_it_ends(monkeypatch):
    heard, clock, used, line = Heard(), [0.0], [0.0], [61]
    monkeypatch.setattr(accounting, "waits", heard)
    account = accounting.Accountant(lambda text: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                    cpu=lambda: used[0], delay=lambda: 0.0, frames=Frames(line))

    def ticks(seconds: float, cpu: float = 0.0) -> None:
        for _ in range(round(seconds / 0.02)):
            clock[0] += 0.02
            used[0] += cpu
            account.look()

    ticks(2.9)
    assert heard.said == []  # not yet 3 s
    ticks(0.2)
    assert heard.said == [True]
    ticks(5.0)
    assert heard.said == [True]  # said once
    line[0] = 66  # moved to another line, waiting still: a new wait, said after its own 3 s
    ticks(0.1)
    assert heard.said == [True, False]
    ticks(2.5)
    assert heard.said == [True, False]
    ticks(1.0, cpu=0.02)  # it computes: no wait at all
    ticks(2.0)
    assert heard.said == [True, False]


def test_a_host_callback_on_any_thread_is_the_process_in_its_own_code():
    from jaxrun.child.checks.parting import in_callback

    def frame(filename, back=None):
        return type("Frame", (), {"f_code": compile("q = 2", filename, "exec"), "f_back": back})()

    parked = frame("/site-packages/jax/_src/array.py", frame("/home/u/train.py"))
    callback = frame("/home/u/train.py", frame("/site-packages/jax/_src/callback.py"))
    assert not in_callback(lambda: {1: parked, 2: frame("/usr/lib/python3.11/threading.py")})
    assert in_callback(lambda: {1: parked, 2: callback})
    assert in_callback(lambda: {1: callback})  # the main thread runs it


FATAL = '''terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at pair.cc:459] Received data size doesn't match expected size.
Fatal Python error: Aborted

Thread 0x00007f60b3e456c0 (most recent call first):
  File "/work/jaxrun/child/watch/dumps.py", line 95 in _serve
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f60cd45bb80 (most recent call first):
  File "/usr/lib/python3.11/site-packages/jax/_src/numpy/reductions.py", line 310 in sum
  File "/home/u/train.py", line 61 in <module>
  File "<frozen runpy>", line 198 in _run_module_as_main

Extension modules: jaxlib.cpu_feature_guard (total: 1)
'''


def test_a_fatal_errors_dump_names_the_main_threads_line_though_another_thread_aborted():
    """Gloo's thread aborts (no Python frame, so no "Current thread" block):
    the main thread is the block that reaches the interpreter's entry."""
    from jaxrun.reporting import stacks

    assert stacks.user_frame(FATAL)[:3] == ("/home/u/train.py", 61, "<module>")
    assert stacks.user_frame(FATAL.replace("Fatal Python error: Aborted", "")) is None  # not a fatal error's


def aborted_job(tmp_path, finished=()):
    """Process 2 aborted in Gloo (no Python stack); process 0 dumped its stack
    at line 66, process 1 at line 61 or, where it is in ``finished``, its
    script had returned (no line of the script in its dump)."""
    from jaxrun.core.outcome import Outcome, ProcessRecord, StopReason, Verdict
    from jaxrun.core.spec import LOCAL_HOST, ProcessSpec

    script = tmp_path / "train.py"
    script.write_text("w = step(w)\n" * 60 + "loss = float(jnp.sum(w))\n" + "x = 1\n" * 4 + "print(eval_step(w))\n")
    recs = []
    for rank, code in ((0, None), (1, None), (2, -6)):
        spec = ProcessSpec(rank, rank, LOCAL_HOST, "python", (), {})
        rec = ProcessRecord(spec, str(tmp_path / f"p{rank}.out"), str(tmp_path / f"p{rank}.err"),
                            str(tmp_path / f"p{rank}.json"), pid=100 + rank, started_at=1.0, ended_at=2.0,
                            returncode=code, verdict=Verdict.ROOT_CAUSE if rank == 2 else Verdict.STOPPED,
                            finished_at=1.5 if rank in finished else None)
        open(rec.stdout_log, "w").close()
        line = 66 if rank == 0 else 61
        with open(rec.stderr_log, "w") as f:
            f.write(FATAL.split("Fatal")[0] if rank == 2 else "" if rank in finished else
                    f'Current thread 0x01 (most recent call first):\n  File "{script}", line {line} in <module>\n')
        recs.append(rec)
    return Outcome(recs, 134, StopReason.FAILURE, root_cause=2)


def test_an_abort_after_the_others_finished_names_the_line_and_who_finished(tmp_path):
    """Issue 74: process 1 finished its script on mixed data while process 0's
    collective met no one (Gloo aborts process 2): still the parting, first."""
    from jaxrun.reporting import summary

    lines = summary.summary_lines(aborted_job(tmp_path, finished=(1,)), str(tmp_path))
    assert lines[0] == ("jaxrun: the processes parted: process 0 at train.py:66: print(eval_step(w)); process 1 "
                        "finished its script (a program that spans processes runs on every one of them, or on "
                        "none); their collectives did not match (Received data size doesn't match expected size)")
    assert lines[1] == "jaxrun: process 2 failed first: killed by SIGABRT (pid 102)"


def test_an_abort_in_a_collective_that_did_not_match_is_said_first_as_the_parting(tmp_path):
    """Gloo's size mismatch kills process 2 (SIGABRT); processes 0 and 1
    dumped their stacks as the job stopped, at two lines: the summary's first
    line is the parting at those lines, then the abort."""
    from jaxrun.reporting import summary

    lines = summary.summary_lines(aborted_job(tmp_path), str(tmp_path))
    assert lines[0] == ("jaxrun: the processes parted: process 0 at train.py:66: print(eval_step(w)); process 1 at "
                        "train.py:61: loss = float(jnp.sum(w)) (a program that spans processes runs on every one of "
                        "them, or on none); their collectives did not match (Received data size doesn't match "
                        "expected size)")
    assert lines[1] == "jaxrun: process 2 failed first: killed by SIGABRT (pid 102)"


def test_a_wait_is_judged_over_its_span_so_the_processes_own_bursts_do_not_begin_it_again(monkeypatch):
    """Seen on a loaded machine: a process blocked in a collective used 14-15 ms of CPU in one
    20 ms look (its threads: the wait's post to the store, the coordination service, heartbeats),
    and each such look began the wait again, so the parting was said 3 s later each time."""
    heard, clock, used, line = Heard(), [0.0], [0.0], [61]
    monkeypatch.setattr(accounting, "waits", heard)
    account = accounting.Accountant(lambda text: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                    cpu=lambda: used[0], delay=lambda: 0.0, frames=Frames(line))

    def ticks(seconds: float, cpu: float = 0.0, burst_every: int = 0) -> None:
        for n in range(round(seconds / 0.02)):
            clock[0] += 0.02
            used[0] += 0.015 if burst_every and n % burst_every == burst_every - 1 else cpu
            account.look()

    ticks(3.1, burst_every=25)  # 15 ms in one look every 0.5 s: 3% of the time
    assert heard.said == [True]
    ticks(3.0, burst_every=25)
    assert heard.said == [True]  # still the same wait
    ticks(0.4, cpu=0.02)  # it computes at that line: the wait ends within WAIT_SLACK's worth
    assert heard.said == [True, False]
    line[0] = 66
    ticks(2.9, burst_every=25)
    ticks(1.0, cpu=0.02)  # computes from just before the wait's 3 s: never said
    assert heard.said == [True, False]
    ticks(2.0)
    assert heard.said == [True, False]  # a new wait, from the last look that computed
    ticks(1.2)
    assert heard.said == [True, False, True]


def test_a_program_that_computes_on_a_starved_machine_is_no_wait(monkeypatch):
    """Seen under three pytest workers on 2 cores: process 1's long program ran on XLA's
    threads, which the load left a small share of a core, so the process used hardly any
    CPU while its main thread waited for the result; the wait was said, and a healthy job
    was stopped as parted.  Threads that wait for a CPU are a program that computes."""
    heard, clock, used, line, starved = Heard(), [0.0], [0.0], [48], [0.0]
    monkeypatch.setattr(accounting, "waits", heard)
    account = accounting.Accountant(lambda text: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                    cpu=lambda: used[0], delay=lambda: 0.0, frames=Frames(line),
                                    starved=lambda: starved[0])

    def ticks(seconds: float, cpu: float = 0.0, ready: float = 0.0) -> None:
        for _ in range(round(seconds / 0.02)):
            clock[0] += 0.02
            used[0] += cpu
            starved[0] += ready
            account.look()

    ticks(12.0, cpu=0.001, ready=0.03)  # 5% of a core, and two threads ready to run for the rest
    assert heard.said == []
    ticks(3.1)  # the program ended; the main thread waits for a peer now, its threads parked
    assert heard.said == [True]
    ticks(1.0, ready=0.03)  # said once: a wait said is not taken back by its threads' readiness alone
    assert heard.said == [True]
    # A blocked process whose threads wake for moments on a loaded machine (a fifth of the
    # time waiting for a CPU, all of them together) waits; and where the system does not say,
    # a quiet wait is said as before.
    for ready, says in ((0.004, lambda: starved[0]), (0.0, lambda: None)):
        heard2 = Heard()
        monkeypatch.setattr(accounting, "waits", heard2)
        account = accounting.Accountant(lambda text: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                        cpu=lambda: used[0], delay=lambda: 0.0, frames=Frames([70]), starved=says)
        ticks(3.1, ready=ready)
        assert heard2.said == [True], ready


def test_the_threads_waits_for_a_cpu_are_read_from_the_system():
    """``waiting.threads_starved``: threads that compute beyond the machine's cores
    wait for a CPU, the calling thread's own waits left out."""
    import os
    import threading

    import numpy as np

    if waiting.threads_starved() is None:
        pytest.skip("this system does not say how long a thread waited for a CPU")
    stop = threading.Event()

    def compute():
        a = np.ones((200, 200))
        while not stop.is_set():
            a = np.tanh(a @ a / 200)  # numpy leaves the GIL: each thread wants a core

    before = waiting.threads_starved()
    workers = [threading.Thread(target=compute) for _ in range(2 * (os.cpu_count() or 1) + 2)]
    for worker in workers:
        worker.start()
    try:
        threading.Event().wait(0.5)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert waiting.threads_starved() - before > 0.05


def test_a_wait_at_a_meeting_is_said_sooner_and_posted_anew_once_the_meeting_ends():
    from jaxrun.child.checks import parting as parting_module

    parting = parting_module.Parting(board=None, locator=None)
    assert parting.seconds == parting_module.WAIT
    parting.meeting = {"fn": "evaluate", "spans": "0,1", "among": [0, 1], "at": "t.py:66", "name": "0,1/ab"}
    assert parting.seconds == parting_module.MEETING_WAIT < parting_module.WAIT
    parting.meeting = None
    parting.made("t.py:61", [0, 1], "step", [type("TPU", (), {"platform": "tpu"})()])
    assert parting.seconds == parting_module.ACCELERATOR_WAIT
    parting.meeting = {"fn": "evaluate", "spans": "0,1", "among": [0, 1], "at": "t.py:66", "name": "0,1/ab"}
    assert parting.seconds == parting_module.MEETING_WAIT  # a meeting is host-side: no long program to wait out
    parting.thread = object()  # no thread of its own here: what it would be told is read off
    parting.met()
    assert parting.turn == 0 and not parting.wake.is_set()  # no wait was said: nothing to post anew
    parting.changed(True)
    parting.wake.clear()
    parting.met()
    assert parting.turn == 2 and parting.wake.is_set()  # said at the meeting: posted again as it is now


def test_a_parting_where_every_process_waits_at_a_meeting_leaves_the_programs_check_its_time():
    """Programs that differ meet apart: every process waits at a meeting of its own, and the
    programs check names what differs, the odd side first, once its posts are out.  Seen in a
    suite run: with the meeting's wait said after half a second, the parting stopped such a job
    first and named no difference."""
    met = {r: dict(wait("t.py:88" if r < 2 else "t.py:90", [0, 1, 2]), meets=True, program=f"p{r // 2}")
           for r in (0, 1, 2)}
    assert parted(met, set()) == [0, 1, 2]
    assert not ripe([0, 1, 2], met, set(), 0.5) and ripe([0, 1, 2], met, set(), APART)
    others = {**met, **{r: wait("t.py:61", [0, 1, 2]) for r in (1, 2)}}  # the others in their step
    assert ripe([0, 1, 2], others, set(), 0.5)  # a side not at a meeting: at once
    assert ripe([0, 1, 2], {0: met[0]}, {1, 2}, 0.5)  # the others finished: no difference to name
