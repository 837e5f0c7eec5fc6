"""The stall watchdog's pure parts: the child's sampler deciding busy or
idle (``child.watch.activity``), and the launcher's watch deciding when the job
has stalled and who stands out (``launcher.attempt.activity``).  The real processes
are in tests/e2e/test_stall.py and the matrix's stuck row."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from jaxrun import contract
from jaxrun.child.watch import activity, place
from jaxrun.core.outcome import Place
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
from jaxrun.launcher.attempt import activity as stall


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def code(filename: str, name: str = "f"):
    return compile("pass", filename, "exec").replace(co_name=name)


MAIN, HELPER, OWN, NATIVE1, NATIVE2 = 100, 101, 102, 201, 202  # native thread ids


class Sampler:
    """A Sampler whose every input the test sets.  ``threads``: each
    thread's CPU seconds (None: a system that does not say); ``work`` and
    ``own``: the script's Python threads and jaxrun's."""

    def __init__(self, tmp_path):
        self.clock, self.cpu, self.io, self.kids = Clock(), 0.0, 0, {}
        self.threads: dict | None = None
        self.waits: dict | None = None  # each thread's seconds waiting for a CPU (None: not said)
        self.work, self.own = {HELPER}, {OWN}
        self.main_system = 0.0  # of MAIN's CPU, the share that was system time
        self.gil_free = True
        self.stack = ((code("/work/train.py", "<module>"), 12),)
        self.parked = False  # the main thread waits in a wait of Python's own (place.parked_in_python)
        self.preempts: int | None = 0  # the process's involuntary context switches so far (None: not said)
        self.switched: dict[int, tuple[int, int]] = {}  # each thread's (voluntary, involuntary) switches
        self.live = activity.Sampler(str(tmp_path / "progress"), 1.0, clock=self.clock, cpu=lambda: self.cpu,
                                      io=lambda: self.io, stack=lambda: self.stack, children=lambda: self.kids,
                                      threads=lambda: None if self.threads is None else dict(self.threads),
                                      python=lambda: (self.work, self.own), main_tid=MAIN,
                                      main_times=self.main_times, gil_free=lambda: self.gil_free,
                                      waits=lambda: None if self.waits is None else dict(self.waits),
                                      parked=lambda: self.parked, preempted=lambda: self.preempts,
                                      switches=lambda tids: {t: self.switched[t] for t in tids if t in self.switched})

    def main_times(self) -> tuple[float, float] | None:
        if self.threads is None:
            return None
        used = self.threads.get(MAIN, 0.0)
        return used * (1 - self.main_system), used * self.main_system

    def says(self, seconds: float, **changes) -> str:
        self.clock.now += seconds
        for name, value in changes.items():
            setattr(self, name, value)
        return self.live.judge()

    def after(self, seconds: float, **changes) -> bool:
        return self.says(seconds, **changes) == contract.BUSY

    def burn(self, seconds: float, **cores: float) -> str:
        """``seconds`` pass while each thread named (MAIN=1.0, ...) uses that many cores."""
        threads = None if self.threads is None else dict(self.threads)
        for name, share in cores.items():
            if threads is not None:
                threads[globals()[name]] = threads.get(globals()[name], 0.0) + share * seconds
        return self.says(seconds, cpu=self.cpu + sum(cores.values()) * seconds, threads=threads)


def test_a_process_that_only_waits_is_idle_and_each_sign_of_work_is_progress(tmp_path):
    s = Sampler(tmp_path)
    assert not s.after(1.0, cpu=0.004, io=160)  # JAX's background threads, a heartbeat
    assert s.after(1.0, cpu=0.1)  # 10% of a core
    assert not s.after(1.0)
    assert s.after(1.0, io=160 + 10 * activity.BUSY_IO)  # a checkpoint written
    assert not s.after(1.0)
    assert s.after(1.0, stack=((code("/work/train.py", "<module>"), 13),))  # a new line
    assert not s.after(1.0)
    assert s.after(1.0, kids={42: (0.5, False)})  # a tool it started works for it
    assert not s.after(1.0, kids={42: (0.501, False)})
    assert s.after(1.0, kids={42: (0.501, True)})  # starved: no CPU, but ready to run
    assert not s.after(1.0, kids={42: (0.501, False)})  # a parked tool neither works nor wants to
    activity.alive()
    assert s.after(1.0)  # the script said so
    assert not s.after(1.0, io=None)  # a system that counts no I/O


@pytest.mark.parametrize("frames, busy", [
    ((("/site-packages/jax/_src/compiler.py", "backend_compile"), ("/work/train.py", "<module>")), True),
    ((("/site-packages/jax/_src/distributed.py", "initialize"),), True),
    ((("/site-packages/jax/_src/distributed.py", "shutdown"),), False),
    ((("/work/train.py", "<module>"),), False),
], ids=["compiling", "joining", "shutdown", "user-code"])
def test_a_compile_and_a_join_are_work(tmp_path, frames, busy):
    s = Sampler(tmp_path)
    s.stack = tuple((code(f, n), 1) for f, n in frames)
    s.live.last = s.live._look()
    assert s.after(1.0) is busy


# -- a hang as GPU jobs show it: the process's own threads spin, its Python stands still --

def test_native_threads_that_spin_while_the_main_thread_is_parked_are_spin_not_work(tmp_path):
    """NCCL's hang: two threads with no Python frame loop on sched_yield at
    100% while the main thread waits at a line of the user's, outside JAX."""
    s = Sampler(tmp_path)
    s.threads = {MAIN: 1.0, HELPER: 0.0, OWN: 0.0}
    assert not s.after(1.0)  # parked, nothing spins yet
    # The first look that sees the CPU has no count of each thread's from the
    # look before: it is taken for work, once.
    assert s.burn(1.0, NATIVE1=1.0, NATIVE2=0.95) == contract.BUSY
    said = s.burn(1.0, NATIVE1=1.0, NATIVE2=0.95)
    assert contract.activity_word(said) == contract.SPIN
    assert contract.Spinning.of(said) == contract.Spinning(2, 1.95)
    assert s.burn(1.0, NATIVE1=0.99, NATIVE2=0.97, OWN=0.5) == "spin 2 1.96"  # jaxrun's threads left out
    assert s.burn(1.0, NATIVE1=0.02) == contract.IDLE  # JAX's background threads: no spin
    assert s.burn(1.0, MAIN=1.0) == contract.BUSY  # no count from the look before again
    assert s.burn(1.0, MAIN=1.0) == contract.BUSY  # user time, its stack unchanged: a hot loop on one line


def test_a_main_thread_that_yields_in_a_native_call_with_the_gil_free_spins(tmp_path):
    """A main thread inside a native call that loops on sched_yield (mostly
    system time) and has left the GIL free spins; user time, or the GIL
    held (Python running), is work."""
    s = Sampler(tmp_path)
    s.threads, s.main_system = {MAIN: 0.0}, 0.9
    s.burn(1.0, MAIN=1.0)
    assert s.burn(1.0, MAIN=1.0) == "spin 1 1.00"
    assert s.burn(1.0, MAIN=1.0, NATIVE1=1.0) == "spin 2 2.00"
    s.gil_free = False
    assert s.burn(1.0, MAIN=1.0) == contract.BUSY  # Python holds the GIL: a loop on one line
    s.gil_free, s.main_system = True, 0.1
    assert s.burn(1.0, MAIN=1.0) == contract.BUSY  # a numpy call: user time
    s.main_system = 0.9
    assert s.burn(1.0, MAIN=0.01) == contract.IDLE  # a parked thread's crumbs


def test_a_main_thread_that_ran_jaxruns_signal_handler_since_the_last_look_neither_spins_nor_works(tmp_path,
                                                                                                monkeypatch):
    """A stall's probe asks for dumps: the parked main thread runs jaxrun's
    handler, which waits 5 ms at a time for the dumping thread (system time,
    the GIL free): a spin's shape.  Dumped every 30 ms, a parked process
    read "spin 1 0.10" at one look in six (tests below)."""
    from jaxrun.child.watch import dumps

    monkeypatch.setattr(dumps, "_heard", {})
    s = Sampler(tmp_path)
    s.threads, s.main_system, s.parked = {MAIN: 0.0}, 0.9, True
    s.burn(1.0, MAIN=0.1)
    assert s.burn(1.0, MAIN=0.1) == "spin 1 0.10"  # no handler run: the spin rule as above
    dumps._heard[signal.SIGUSR1] = 3
    assert s.burn(1.0, MAIN=0.1) == contract.PARKED
    dumps._heard[signal.SIGUSR1] = 4
    assert s.burn(1.0, MAIN=0.1, NATIVE1=0.5) == "spin 1 0.50"  # its other threads are judged as ever
    assert s.burn(1.0, MAIN=0.1) == "spin 1 0.10"  # no run since the last look


def test_the_gil_probe_tells_a_python_loop_from_a_thread_that_left_it():
    import threading

    stop = threading.Event()

    def loop():
        while not stop.is_set():
            sum(range(1000))

    assert any(activity.gil_left_free() for _ in range(5))  # nothing else runs Python (a loaded machine may delay one)
    worker = threading.Thread(target=loop)
    worker.start()
    try:
        time.sleep(0.05)
        # The worker holds the GIL whenever it runs; a loaded machine may leave it
        # unscheduled during one probe, not during all of them.  The probes are
        # spread out, as the sampler's are (one a look): ten in a row, each taking
        # the GIL straight back, read free ten times of ten in 3 of 5 runs beside 4
        # busy loops on 2 cores; 20 ms apart, at most 5 of 10 (8 runs).
        said = []
        for _ in range(10):
            said.append(activity.gil_left_free())
            time.sleep(0.02)
        assert not all(said), said
    finally:
        stop.set()
        worker.join()


def test_a_python_thread_of_the_script_that_computes_is_work(tmp_path):
    s = Sampler(tmp_path)
    s.threads = {MAIN: 0.0}
    s.burn(1.0, HELPER=1.0)
    assert s.burn(1.0, HELPER=1.0) == contract.BUSY
    assert s.burn(1.0, HELPER=0.5, NATIVE1=1.0, NATIVE2=1.0) == contract.BUSY  # its work, whatever else spins
    assert s.burn(1.0, HELPER=0.01, NATIVE1=1.0) == "spin 1 1.00"


def test_while_the_main_thread_is_inside_jax_every_thread_works_for_it(tmp_path):
    """One long program: the main thread waits in block_until_ready while XLA's threads compute."""
    s = Sampler(tmp_path)
    s.threads = {MAIN: 0.0}
    s.stack = ((code("/site-packages/jax/_src/array.py", "block_until_ready"), 4),
               (code("/work/train.py", "<module>"), 12))
    s.live.last = s.live._look()
    for _ in range(3):
        assert s.burn(1.0, NATIVE1=1.0, NATIVE2=1.0) == contract.BUSY
    s.stack = ((code("/site-packages/jaxlib/xla_client.py", "execute"), 4),)
    assert s.burn(1.0, NATIVE1=1.0) == contract.BUSY
    s.stack = ((code("/work/train.py", "<module>"), 40),)
    assert s.burn(1.0, NATIVE1=1.0) == contract.BUSY  # it moved
    assert s.burn(1.0, NATIVE1=1.0) == "spin 1 1.00"  # and stays, outside JAX, while a thread spins


@pytest.mark.parametrize("source, waits", [
    ("long(y, n).block_until_ready()", True),  # a method of jaxlib's: no Python frame of JAX's
    ("threading.Event().wait()", False),
    ("lib.spin_forever()", False),
])
def test_a_call_from_the_script_that_awaits_a_program_is_inside_jax(source, waits):
    import dis

    code = compile(source, "/work/train.py", "exec")
    last_call = [i.offset for i in dis.get_instructions(code) if i.opname == "CALL"][-1]
    assert place.inside_jax(((code, last_call),)) is waits


def test_without_a_count_per_thread_any_cpu_is_work(tmp_path):
    s = Sampler(tmp_path)  # threads None: a system that does not say
    for _ in range(3):
        assert s.burn(1.0, NATIVE1=1.0) == contract.BUSY


@pytest.mark.parametrize("used, said", [
    ({MAIN: 0.001, NATIVE1: 0.01}, contract.IDLE),
    ({MAIN: 0.0, HELPER: 0.2}, contract.BUSY),
    ({HELPER: 0.03, NATIVE1: 0.03}, contract.IDLE),  # each under 5% of a core
    ({HELPER: 0.03, NATIVE1: 0.5, NATIVE2: 0.5, OWN: 3.0}, "spin 2 0.50"),
    ({MAIN: 2.0}, "spin 1 1.00"),
], ids=["quiet", "helper", "little", "spin", "main"])
def test_each_threads_cpu_is_judged_by_whose_it_is(used, said):
    before = {MAIN: 1.0, HELPER: 1.0, NATIVE1: 1.0, NATIVE2: 1.0, OWN: 1.0}
    now = {tid: before[tid] + used.get(tid, 0.0) for tid in before}
    assert activity.judge_threads(before, now, 2.0, {HELPER}, {OWN}) == said


@pytest.mark.parametrize("used, waited, said", [
    ({HELPER: 0.03}, {HELPER: 1.9}, contract.BUSY),  # a helper thread among thirty busy processes
    ({NATIVE1: 0.03, NATIVE2: 0.02}, {NATIVE1: 1.9, NATIVE2: 1.95}, contract.IDLE),  # spin: by CPU alone
    ({NATIVE1: 0.03, NATIVE2: 0.5}, {NATIVE1: 1.5, NATIVE2: 1.4}, "spin 1 0.25"),
    ({HELPER: 0.01, NATIVE1: 0.01}, {HELPER: 0.2, NATIVE1: 0.3}, contract.IDLE),  # woken now and then
    ({MAIN: 0.02}, {MAIN: 1.5}, contract.BUSY),  # a main thread that imports, starved
    ({MAIN: 0.02}, {}, contract.IDLE),  # no wait said: judged by its CPU
], ids=["starved-helper", "native-waits", "spin", "wakeups", "starved-main", "main"])
def test_on_a_loaded_machine_a_thread_that_waited_for_a_cpu_counts_as_using_it(used, waited, said):
    before = {MAIN: 1.0, HELPER: 1.0, NATIVE1: 1.0, NATIVE2: 1.0}
    now = {tid: before[tid] + used.get(tid, 0.0) for tid in before}
    assert activity.judge_threads(before, now, 2.0, {HELPER, MAIN}, set(), waited) == said


def test_a_starved_helper_thread_is_work_to_the_sampler(tmp_path):
    """The process used 1.5% of a core: little, but its threads are read,
    and its helper thread waited for a CPU most of the interval."""
    s = Sampler(tmp_path)
    s.threads, s.waits = {MAIN: 0.0, HELPER: 0.0}, {MAIN: 0.0, HELPER: 0.0}
    assert s.burn(1.0, HELPER=0.015) == contract.IDLE  # no count from the look before, and under 5%
    s.waits = {MAIN: 0.9, HELPER: 0.9}
    assert s.burn(1.0, HELPER=0.015) == contract.BUSY
    s.waits = {MAIN: 0.9, HELPER: 0.9}  # neither waited since: no work
    assert s.burn(1.0, HELPER=0.015) == contract.IDLE
    assert s.burn(1.0, HELPER=0.005) == contract.IDLE  # under 1% of a core: not even read


def test_threads_that_spin_starved_of_cpu_by_the_load_spin_and_none_that_sleeps_or_waits_once_does(tmp_path):
    """On a loaded machine a thread that loops on sched_yield gets almost no
    CPU (0-6 ms in 5 s beside 4 to 60 busy loops): under 1% of a core, the
    process's threads were not even read, and it read parked, its spin
    lost (CI: a job stopped for a stall named without its spinning
    threads).  The kernel still preempts such a thread again and again, and
    it never sleeps: that spins.  A thread woken once that waited the whole
    interval for a CPU was not preempted; one that wakes often to do a
    little switches voluntarily each time: neither spins."""
    s = Sampler(tmp_path)
    s.threads, s.parked = {MAIN: 0.0, NATIVE1: 0.0, NATIVE2: 0.0}, True
    s.waits = dict(s.threads)
    assert s.says(1.0) == contract.PARKED  # baseline: nothing used, nothing preempted, threads not read

    def look(preempts, spinner, other, **waits):
        s.preempts += preempts
        s.waits = {tid: s.waits[tid] + waits.get(name, 0.0) for name, tid in
                   (("MAIN", MAIN), ("NATIVE1", NATIVE1), ("NATIVE2", NATIVE2))}
        s.switched = {NATIVE1: spinner, NATIVE2: other}
        return s.burn(1.0, NATIVE1=0.001, NATIVE2=0.001)

    # Preempted twice an interval: the threads are read (0.2% of a core is under the 1% that reads them).
    # Two looks to learn: each thread's CPU and wait from the look before, then the starved threads' switches.
    assert look(12, (0, 4), (3, 0), NATIVE1=0.95, NATIVE2=0.9) == contract.PARKED
    assert look(12, (0, 10), (3, 0), NATIVE1=0.95, NATIVE2=0.9) == contract.PARKED
    said = look(12, (0, 16), (3, 0), NATIVE1=0.95, NATIVE2=0.9)  # NATIVE2 woke once, waited, never ran
    assert contract.Spinning.of(said) == contract.Spinning(1, 0.0), said
    said = look(12, (0, 22), (9, 6), NATIVE1=0.95, NATIVE2=0.9)  # NATIVE2 wakes often: voluntary switches
    assert contract.Spinning.of(said) == contract.Spinning(1, 0.0), said
    said = look(12, (0, 28), (9, 12), NATIVE1=0.95, NATIVE2=0.9)  # now both spin
    assert contract.Spinning.of(said) == contract.Spinning(2, 0.0), said
    assert look(1, (0, 28), (9, 12), NATIVE1=0.95, NATIVE2=0.9) == contract.PARKED  # preempted once: not read
    # Read but not starved (ready to run for under half the interval): not even asked.
    s.preempts += 12
    s.switched = {}
    assert look(12, (0, 40), (9, 24), NATIVE1=0.2, NATIVE2=0.2) == contract.PARKED
    # Where the system says nothing of preemption, as before: by CPU alone.
    s.preempts = None
    s.waits = {tid: w + 0.95 for tid, w in s.waits.items()}
    assert s.burn(1.0, NATIVE1=0.001, NATIVE2=0.001) == contract.PARKED
    assert activity.starved_spinners({NATIVE1: (3, 5)}, {NATIVE1: (3, 6), NATIVE2: (0, 50)}) == set()  # once; new
    assert activity.starved_spinners({NATIVE1: (3, 5)}, {NATIVE1: (3, 7)}) == {NATIVE1}


def test_each_threads_switches_and_the_processs_preemptions_are_read_from_the_system():
    import threading

    from jaxrun import portable

    me = threading.get_native_id()
    switches, preempted = portable.thread_switches([me, 10**9]), portable.preempted()
    if preempted is None:
        pytest.skip("this system counts no context switches per thread")
    assert set(switches) == {me} and all(n >= 0 for n in switches[me]), switches
    time.sleep(0.01)  # a sleep is a voluntary switch
    assert portable.thread_switches([me])[me][0] > switches[me][0]
    assert preempted >= 0


def test_each_threads_wait_for_a_cpu_is_read_from_the_system():
    import threading

    from jaxrun import portable

    waited = portable.thread_waits()
    if waited is None:
        pytest.skip("this kernel keeps no run-queue delay per thread (schedstat)")
    assert threading.get_native_id() in waited and all(w >= 0 for w in waited.values())


def test_a_thread_that_started_since_the_last_look_counts_all_it_used():
    assert activity.judge_threads({MAIN: 1.0}, {MAIN: 1.0, NATIVE1: 0.9}, 1.0, set(), set()) == "spin 1 0.90"


def test_the_stack_moves_with_a_loop_on_one_line_and_not_with_a_parked_call():
    import threading

    stop, parked = threading.Event(), threading.Event()
    looping = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
    waiting = threading.Thread(target=parked.wait)
    for t in (looping, waiting):
        t.start()
    try:
        time.sleep(0.05)
        loops = {place.main_stack(looping.ident) for _ in range(20) if not time.sleep(0.01)}
        waits = {place.main_stack(waiting.ident) for _ in range(5) if not time.sleep(0.01)}
        assert len(loops) > 1 and len(waits) == 1
    finally:
        stop.set()
        parked.set()
        for t in (looping, waiting):
            t.join()



def test_a_call_parked_in_a_loop_stays_still_once_python_specializes_it():
    """Python 3.11 makes a warmed-up loop's builtin call from its PRECALL
    instruction: a thread parked in ``while True: time.sleep(...)`` moved
    from the CALL's offset to the PRECALL's after about eight turns, and a
    look took it for progress (issue 59).  Sampled over 30 turns, the sleep
    is always read at its CALL (a sample between two sleeps is left aside)."""
    import dis
    import threading

    stop, turns = threading.Event(), []

    def parked():
        while True:  # a jump back: what warms 3.11's code up (a loop on a condition's test does not)
            if stop.is_set():
                return
            turns.append(None)
            time.sleep(0.02)

    ops = [i for i in dis.get_instructions(parked) if i.opname in ("PRECALL", "CALL")]
    call = next(i.offset for i in ops if i.opname == "CALL" and i.offset > next(
        j.offset for j in dis.get_instructions(parked) if j.argval == "sleep"))
    precall = {i.offset for i in ops if i.opname == "PRECALL"}
    thread = threading.Thread(target=parked)
    thread.start()
    try:
        late = []
        deadline = time.monotonic() + 10
        while len(turns) < 30 and time.monotonic() < deadline:
            time.sleep(0.005)
            stack = place.main_stack(thread.ident)
            if stack and stack[0][0] is parked.__code__:
                assert stack[0][1] not in precall, (len(turns), stack[0][1], call)
                if len(turns) > 15:  # warmed up
                    late.append(stack[0][1])
        assert len(turns) >= 30 and call in late, (len(turns), late, call)
    finally:
        stop.set()
        thread.join()


def test_the_stack_walk_stops_at_anything_not_a_frame():
    """CPython once handed the sampler a str as a frame's f_back (3.11, a
    controller over SSH, under load): the walk ends there, the look goes on."""
    import threading

    assert place.main_stack(1, frames=lambda: {1: "not a frame"}) == ()
    assert place.main_stack(2, frames=lambda: {1: "not a frame"}) == ()
    here = place.main_stack(threading.get_ident())
    assert [c for c, _ in here[:2]] == [place.main_stack.__code__,
                                       test_the_stack_walk_stops_at_anything_not_a_frame.__code__]


def test_a_look_that_fails_does_not_end_the_sampler(tmp_path):
    """A look that raises counts as progress (never a false stall), and the
    sampler goes on looking: before, the exception ended its thread, printed
    a traceback into the script's stderr, and left the process unwatched."""
    import threading

    looks = []

    def stack():
        looks.append(time.monotonic())
        if len(looks) == 2:
            raise AttributeError("'str' object has no attribute 'f_code'")
        return ((code("/work/train.py", "<module>"), 12),)

    path = tmp_path / "progress"
    sampler = activity.Sampler(str(path), 0.02, stack=stack, children=lambda: {}, threads=lambda: None,
                               io=lambda: None, waits=lambda: None)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(looks) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(looks) >= 6 and thread.is_alive()
    finally:
        sampler.write(contract.FINISHED)
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert path.read_text() == contract.FINISHED + "\n"

def test_each_threads_cpu_is_read_from_the_system_by_its_native_id():
    import threading

    from jaxrun import portable

    stop, ids = threading.Event(), []

    def work():
        ids.append(threading.get_native_id())
        while not stop.is_set():
            pass

    t = threading.Thread(target=work)
    t.start()
    try:
        while not ids:
            time.sleep(0.01)
        first = portable.thread_cpu()
        deadline = time.monotonic() + 10  # a loaded machine gives the spinning thread its share late
        while True:
            time.sleep(0.1)
            second = portable.thread_cpu()
            if second is None or first is None or second[ids[0]] - first[ids[0]] > 0.05 or time.monotonic() > deadline:
                break
    finally:
        stop.set()
        t.join()
    assert first is not None and second is not None, "this system has /proc/self/task"
    assert second[ids[0]] - first[ids[0]] > 0.05
    assert set(activity.python_threads(threading.main_thread().native_id)[0]) >= set()
    assert threading.main_thread().native_id in second


def test_a_spin_line_is_written_again_only_when_its_thread_count_changes(tmp_path):
    s = Sampler(tmp_path)
    path = str(tmp_path / "progress")
    s.live.write("spin 2 1.95")
    first = os.stat(path)
    s.live.write("spin 2 1.50")
    assert os.stat(path).st_ino == first.st_ino and contract.read_activity_file(path)[:1] == ["spin 2 1.95"]
    s.live.write("spin 3 2.90")
    assert contract.read_activity_file(path)[:1] == ["spin 3 2.90"]
    s.live.write(contract.IDLE)
    assert contract.read_activity_file(path)[:1] == [contract.IDLE]


def test_the_interval_is_a_tenth_of_the_timeout_within_bounds():
    assert activity.interval_for(600) == activity.MAX_INTERVAL
    assert activity.interval_for(2) == pytest.approx(0.2)
    assert activity.interval_for(0.01) == activity.MIN_INTERVAL


def test_the_state_is_written_only_when_it_changes(tmp_path):
    s = Sampler(tmp_path)
    path = tmp_path / "progress"
    s.live.write(contract.BUSY)
    first = path.stat()
    s.live.write(contract.BUSY)
    assert path.stat().st_ino == first.st_ino and contract.read_activity_file(str(path))[:1] == [contract.BUSY]
    s.live.write(contract.IDLE)
    assert contract.read_activity_file(str(path))[:1] == [contract.IDLE] and path.stat().st_mode & 0o777 == 0o600
    path.write_text("nonsense\n")
    assert contract.read_activity_file(str(path)) == []


# -- the launcher's watch ----------------------------------------------------------------

def at(file: str, line: int, func: str = "<module>", source: str = "x") -> Place:
    return Place(file, line, func, source, contract.IN_SCRIPT)


SHUTDOWN = Place(None, None, state=contract.IN_SHUTDOWN)


def test_the_odd_one_out_is_named_and_where_the_others_wait():
    found = stall.classify({0: at("t.py", 9), 1: at("t.py", 7, source="time.sleep(9)"), 2: at("t.py", 9)}, 600)
    assert found.waiting.ranks == (0, 2) and [g.ranks for g in found.odd] == [(1,)]
    assert found.fingerprint == ("stall", repr(("t.py", 7)))


def test_without_a_majority_every_group_stands_out():
    found = stall.classify({0: at("t.py", 9), 1: at("t.py", 7)}, 600)
    assert found.waiting is None and [g.ranks for g in found.odd] == [(0,), (1,)]
    found = stall.classify({0: at("t.py", 9), 1: at("t.py", 9), 2: at("u.py", 1), 3: at("u.py", 1)}, 600)
    assert found.waiting is None and [g.ranks for g in found.odd] == [(0, 1), (2, 3)]


def test_a_process_past_its_script_stands_out_among_waiting_ones():
    found = stall.classify({0: at("t.py", 9), 1: SHUTDOWN, 2: at("t.py", 9)}, 600)
    assert [g.ranks for g in found.odd] == [(1,)] and "JAX's shutdown" in found.odd[0].place.text()


def test_one_shared_place_or_an_unknown_one_is_no_stall():
    assert stall.classify({0: at("ckpt.py", 3), 1: at("ckpt.py", 3)}, 600) is None
    unknown = {0: at("t.py", 9), 1: Place(None, None, state=contract.IN_SCRIPT)}
    assert stall.classify(unknown, 600) is None
    assert "cannot tell where process 1 waits" in stall.waiting_line(unknown, 600)
    line = stall.waiting_line({0: at("ckpt.py", 3, "save", "time.sleep(30)")} , 600)
    assert "every process waits at ckpt.py:3 in save: time.sleep(30): not taken for a stall" in line


DUMP = """Thread 0x01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x02 (most recent call first):
  File "{file}", line {line} in <module>
  File "/x/jaxrun/child/shim.py", line 180 in run_script
  File "/x/jaxrun/child/shim.py", line 141 in run_target
"""


def watch(tmp_path, n=3, timeout=10.0, env=None):
    clock, notes = Clock(), []
    specs = [ProcessSpec(rank=r, local_rank=r, host=LOCAL_HOST, python="python", shim_args=("--", "x.py"),
                         env=env or {}) for r in range(n)]
    logs = {r: str(tmp_path / f"process-{r}.stderr") for r in range(n)}
    for path in logs.values():
        open(path, "w").close()
    w = stall.ActivityWatch(specs, timeout, clock, notes.append, logs)
    return w, clock, notes, logs


def test_the_watch_probes_once_every_process_has_been_idle_for_the_timeout(tmp_path):
    w, clock, notes, logs = watch(tmp_path)
    assert w.tick()[1] is None  # nobody has said anything yet
    for r in range(3):
        w.heard(r, contract.IDLE)
    clock.now += 9.9
    assert w.tick()[1] is None
    w.heard(0, contract.BUSY)  # one moves: the wait starts again when it stops
    clock.now += 1
    w.heard(0, contract.IDLE)
    clock.now += 9.9
    assert w.tick()[1] is None
    clock.now += 0.2
    wake, action = w.tick()
    assert action == "probe" and wake == pytest.approx(clock.now + stall.DUMP_LOOK)
    assert w.tick() == (pytest.approx(clock.now + stall.DUMP_LOOK), None)  # no dump yet: looked again soon
    for r, line in ((0, 9), (1, 7), (2, 9)):
        with open(logs[r], "a") as f:
            f.write(DUMP.format(file="/work/t.py", line=line))
    clock.now += stall.PROBE_WAIT
    wake, found = w.tick()
    assert wake is None and found.waiting.ranks == (0, 2) and found.odd[0].ranks == (1,)
    assert found.odd[0].place.at == "/work/t.py:7"


ENTRY = '  File "<frozen runpy>", line 88 in _run_code\n  File "<frozen runpy>", line 198 in _run_module_as_main\n'


@pytest.mark.parametrize("text, whole", [
    (DUMP.format(file="/work/t.py", line=3) + ENTRY, True),  # down to the interpreter's entry
    ((DUMP.format(file="/work/t.py", line=3) + ENTRY)[:-1], False),  # its last line still being written
    (DUMP.format(file="/work/t.py", line=3), False),  # no entry frame: cut, or not started by python -m
    ("Current thread 0x02 (most recent call first):\n  File \"/w/t.py\", line 3 in <module>\n\n"
     "Thread 0x01 (most recent call first):\n", True),  # another thread's block follows
    ("nothing dumped\n", False),
], ids=["whole", "being-written", "no-entry", "followed", "none"])
def test_a_dump_is_whole_once_its_main_thread_reaches_the_entry_frame(text, whole):
    from jaxrun.reporting import stacks

    assert stacks.dump_complete(text) is whole


def probed_and_dumped(tmp_path, n: int, flight: set[int] = frozenset()):
    """A watch of ``n`` idle processes that has just probed, 0.1 s after
    processes 0 and 1 wrote whole dumps (0 at line 9, 1 at line 7)."""
    w, clock, notes, logs = watch(tmp_path, n=n)
    w.flight = set(flight)
    for r in range(n):
        w.heard(r, contract.IDLE)
    clock.now += 10.1
    assert w.tick()[1] == "probe"
    for r, line in ((0, 9), (1, 7)):
        with open(logs[r], "a") as f:
            f.write(DUMP.format(file="/work/t.py", line=line) + ENTRY)
    clock.now += 0.1
    return w, clock, logs


def test_the_watch_decides_as_soon_as_every_dump_is_whole_and_waits_for_one_that_is_not(tmp_path):
    w, clock, logs = probed_and_dumped(tmp_path, 3)
    wake, action = w.tick()
    assert action is None and wake == pytest.approx(clock.now + stall.DUMP_LOOK)  # process 2's has not come
    with open(logs[2], "a") as f:
        f.write(DUMP.format(file="/work/t.py", line=9) + ENTRY)
    clock.now += 0.05
    wake, found = w.tick()  # 0.15 s after the probe, not PROBE_WAIT
    assert wake is None and found.odd[0].ranks == (1,) and found.waiting.ranks == (0, 2)


def test_with_the_flight_recorder_a_dump_is_whole_with_the_block_after_it(tmp_path):
    w, clock, logs = probed_and_dumped(tmp_path, 2, flight={0, 1})
    assert w.tick()[1] is None  # the blocks have not come
    for r in range(2):
        with open(logs[r], "a") as f:
            f.write(f"jaxrun: flight[{r}] begin: the last 0 of 0 programs run, oldest first; waiting\n"
                    f"jaxrun: flight[{r}] end\n")
    clock.now += 0.05
    assert isinstance(w.tick()[1], stall.Stall)


def test_a_shared_wait_is_warned_of_once_per_timeout_and_a_move_cancels_a_probe(tmp_path):
    w, clock, notes, logs = watch(tmp_path, n=2)
    for r in range(2):
        w.heard(r, contract.IDLE)
        with open(logs[r], "a") as f:
            f.write("an old dump:\n" + DUMP.format(file="/work/old.py", line=1))
    clock.now += 10
    assert w.tick()[1] == "probe"
    for r in range(2):
        with open(logs[r], "a") as f:
            f.write(DUMP.format(file="/work/ckpt.py", line=3))
    clock.now += stall.PROBE_WAIT
    assert w.tick()[1] is None and len(notes) == 1 and "every process waits at /work/ckpt.py:3" in notes[0]
    clock.now += 9  # within the timeout after the warning: no new probe
    assert w.tick()[1] is None
    clock.now += 1.1
    assert w.tick()[1] == "probe"
    w.heard(1, contract.BUSY)
    clock.now += stall.PROBE_WAIT
    assert w.tick()[1] is None and len(notes) == 1


def test_the_watch_reads_local_progress_files_and_forgets_ended_processes(tmp_path):
    w, clock, notes, logs = watch(tmp_path, n=2)
    paths = [str(tmp_path / f"process-{r}.activity") for r in range(2)]
    for r, path in enumerate(paths):
        w.watch(r, path)
        contract.write_private(path, b"idle\n")
    w.tick()
    assert w.state == {0: contract.IDLE, 1: contract.IDLE}
    w.ended(1)
    contract.write_private(paths[0], b"busy\n")
    w.tick()
    assert w.state[0] == contract.BUSY
    w.finish()
    assert not any(tmp_path.joinpath(f"process-{r}.activity").exists() for r in range(2))


def test_an_off_watch_does_nothing(tmp_path):
    w, clock, notes, logs = watch(tmp_path, timeout=0, env={contract.ACCOUNT: contract.ACCOUNT_OFF})
    for r in range(3):
        w.heard(r, contract.IDLE)
    clock.now += 1e6
    assert w.tick() == (None, None)


def test_with_the_watchdog_off_the_account_is_still_read_and_nothing_is_probed(tmp_path):
    w, clock, notes, logs = watch(tmp_path, timeout=0)
    path = tmp_path / "process-1.activity"
    path.write_text("time 100.000 2.000 1.000 0.500 0.500 0.000\n")
    w.watch(1, str(path))
    for r in range(3):
        w.heard(r, contract.IDLE)
    clock.now += 1e6
    assert w.tick() == (clock.now + stall.ACCOUNT_POLL, None)
    assert w.splits() == {1: contract.TimeSplit(100.0, 2.0, 1.0, 0.5, 0.5, 0.0)}


def test_finishing_removes_the_progress_files_and_a_copy_left_unrenamed(tmp_path):
    """A process that ends while its sampler writes leaves the new copy
    (``process-N.activity.PID.new``) beside its logs: the attempt's end takes it away."""
    w, _, _, _ = watch(tmp_path, n=2)
    for r in range(2):
        w.watch(r, str(tmp_path / f"process-{r}.activity"))
    contract.write_private(str(tmp_path / "process-0.activity"), b"BUSY\n")
    (tmp_path / "process-1.activity.4242.new").write_text("IDLE\n")
    (tmp_path / "process-1.activity-notes").write_text("not ours")
    w.finish()
    assert sorted(p.name for p in tmp_path.iterdir() if "activity" in p.name) == ["process-1.activity-notes"]


def test_a_far_end_watch_leaves_its_private_folder_empty(tmp_path):
    """The agent removes its folder after the watch stops: a copy the
    sampler left unrenamed must not keep it there."""
    from jaxrun.core.joinwatch import JoinWatch

    folder = tmp_path / "jaxrun-agent-x"
    folder.mkdir(mode=0o700)
    progress = folder / "progress"
    heard: list[str] = []
    w = JoinWatch(str(folder / "joined"), lambda: None, interval=0.01, activity_path=str(progress),
                  activity=heard.append).start()
    contract.write_private(str(progress), contract.IDLE.encode() + b"\n")
    (folder / "progress.4242.new").write_text("BUSY\n")
    deadline = time.monotonic() + 5
    while not heard and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    assert heard == [contract.IDLE]
    assert list(folder.iterdir()) == []


def test_a_script_that_returned_says_finished_and_nothing_after(tmp_path):
    s = Sampler(tmp_path)
    path = tmp_path / "progress"
    s.live.write(contract.BUSY)
    s.live.write(contract.FINISHED)
    s.live.write(contract.IDLE)  # a look that came late
    assert contract.read_activity_file(str(path))[:1] == [contract.FINISHED] and s.live.finished


def test_the_watch_takes_a_finished_process_for_an_idle_one(tmp_path):
    clock = Clock()
    w = stall.ActivityWatch([ProcessSpec(r, r, LOCAL_HOST, "python", (), {}) for r in range(2)], 10.0, clock,
                            lambda line: None, {r: str(tmp_path / f"e{r}") for r in range(2)})
    w.heard(0, contract.FINISHED)
    w.heard(1, contract.IDLE)
    clock.now += 10.0
    assert w.tick()[1] == "probe"  # every process idle for the stall timeout: their stacks are asked for


def test_a_spinning_process_has_not_moved_and_the_stall_says_its_threads_spun(tmp_path):
    w, clock, notes, logs = watch(tmp_path)
    w.heard(0, contract.IDLE)
    w.heard(1, "spin 2 1.95")
    w.heard(2, contract.IDLE)
    assert w.state[1] == contract.SPIN
    clock.now += 5
    w.heard(1, contract.IDLE)  # its spin dips under the share a look needs: still not moved
    w.heard(1, "spin 2 1.90")
    clock.now += 5.1
    assert w.tick()[1] == "probe"  # counted from the first look that saw it still
    for r, line in ((0, 9), (1, 7), (2, 9)):
        with open(logs[r], "a") as f:
            f.write(DUMP.format(file="/work/t.py", line=line))
    clock.now += stall.PROBE_WAIT
    _, found = w.tick()
    assert found.odd[0].ranks == (1,) and found.spinning == ((1, contract.Spinning(2, 1.90)),)


def test_a_spinning_process_that_moves_is_forgotten_as_spinning_and_an_unknown_line_is_not_heard(tmp_path):
    w, clock, notes, logs = watch(tmp_path, n=2)
    heard = []
    w.on_heard = lambda rank, state: heard.append((rank, state))
    w.heard(0, "spin 1 1.00")
    w.heard(0, "spin x")  # not a line a sampler writes
    w.heard(0, contract.BUSY)
    w.heard(1, contract.IDLE)
    assert heard == [(0, contract.SPIN), (0, contract.BUSY), (1, contract.IDLE)]
    assert w.spinning == {} and w.tick()[1] is None
    w.heard(0, contract.IDLE)
    clock.now += 10
    assert w.tick()[1] == "probe"


def test_the_watch_reads_a_spin_line_from_a_local_activity_file(tmp_path):
    w, clock, notes, logs = watch(tmp_path, n=1)
    path = str(tmp_path / "process-0.activity")
    w.watch(0, path)
    contract.write_private(path, b"spin 2 1.97\n")
    w.tick()
    assert w.state == {0: contract.SPIN} and w.spinning == {0: contract.Spinning(2, 1.97)}


# -- the culprit named on the spinning shape ---------------------------------------------

def test_the_summary_and_the_report_say_whose_threads_spun_while_its_python_stood_still(tmp_path):
    import signal

    from jaxrun.core.outcome import Outcome, ProcessRecord, Stall, StallGroup, StopReason, Verdict
    from jaxrun.core.spec import Host
    from jaxrun.reporting import report, summary

    recs = []
    for rank, host in enumerate((LOCAL_HOST, Host("hostB"), Host("hostB"))):
        spec = ProcessSpec(rank, rank, host, "python", (), {})
        logs = [str(tmp_path / f"process-{rank}.{kind}") for kind in ("stdout", "stderr", "error.json")]
        recs.append(ProcessRecord(spec, *logs, pid=100 + rank, started_at=1.0,
                                  ended_at=2.0, returncode=-signal.SIGTERM, verdict=Verdict.STOPPED))
        for path in (recs[-1].stdout_log, recs[-1].stderr_log):
            open(path, "w").close()
    parked = Place("/w/train.py", 20, "<module>", "threading.Event().wait()", contract.IN_SCRIPT)
    waiting = Place("/w/train.py", 15, "<module>", "loss = float(step(x))", contract.IN_SCRIPT)
    found = Stall(8.0, StallGroup((0, 2), waiting), (StallGroup((1,), parked),),
                  spinning=((1, contract.Spinning(2, 1.95)),))
    outcome = Outcome(recs, contract.STALL_EXIT, StopReason.STALL, stall=found)
    lines = summary.summary_lines(outcome, str(tmp_path))
    assert lines[1] == (
        "jaxrun:   process 1 on hostB stands out, at /w/train.py:20 in <module>: threading.Event().wait() (its "
        "Python stood still while 2 of its own threads spun, 1.95 cores of CPU); processes 0, 2 wait at "
        "/w/train.py:15 in <module>: loss = float(step(x))"), lines
    cause = report.report_dict([outcome], "run", [str(tmp_path)])["root_cause"]
    assert (cause["kind"], cause["process_id"], cause["host"], cause["at"]) == ("stall", 1, "hostB", "/w/train.py:20")
    assert cause["stall"]["spinning"] == [{"process_id": 1, "threads": 2, "cores": 1.95}]
    assert "2 of its own threads spun" in cause["exit"]
    both = Stall(8.0, None, (StallGroup((0, 2), waiting), StallGroup((1,), parked)),
                 spinning=((0, contract.Spinning(1, 1.0)), (2, contract.Spinning(3, 2.5))))
    line = summary.summary_lines(Outcome(recs, contract.STALL_EXIT, StopReason.STALL, stall=both), str(tmp_path))[1]
    assert ("processes 0, 2 at /w/train.py:15 in <module>: loss = float(step(x)) (their Python stood still while "
            "their own threads spun: process 0: 1 threads, 1.00 cores, process 2: 3 threads, 2.50 cores)") in line
    # Threads that spun though the load left them next to no CPU: said so, never "0.00 cores".
    starved = dataclasses.replace(found, spinning=((1, contract.Spinning(2, 0.0)),))
    line = summary.summary_lines(Outcome(recs, contract.STALL_EXIT, StopReason.STALL, stall=starved), str(tmp_path))[1]
    assert "(its Python stood still while 2 of its own threads spun, starved of CPU by the machine's load)" in line
    starved = dataclasses.replace(both, spinning=((0, contract.Spinning(1, 0.0)), (2, contract.Spinning(3, 2.5))))
    line = summary.summary_lines(Outcome(recs, contract.STALL_EXIT, StopReason.STALL, stall=starved), str(tmp_path))[1]
    assert "process 0: 1 threads, starved of CPU by the machine's load, process 2: 3 threads, 2.50 cores)" in line


SPINNING_MAIN = """
import ctypes, sys, threading, time
from jaxrun.child.watch import activity, place
sampler = activity.Sampler(sys.argv[1], 0.2)
threading.Thread(target=sampler.run, name="jaxrun-activity", daemon=True).start()
time.sleep(0.5)
from jaxrun import portable
before = portable.thread_times(portable.main_native_id())
if sys.argv[2] == "native":
    spin = ctypes.CDLL(sys.argv[3]).spin_here
    spin.argtypes = [ctypes.c_double]
    spin(2.0)
else:
    end = time.monotonic() + 2.0
    while time.monotonic() < end: sum(range(1000))
after = portable.thread_times(portable.main_native_id())
print(open(sys.argv[1]).read().strip())
print(*(a - b for a, b in zip(after, before)) if before and after else "")
"""


@pytest.mark.parametrize("how, said", [("native", contract.SPIN), ("python", contract.BUSY)])
def test_a_real_main_thread_spinning_in_a_native_call_spins_and_a_python_loop_works(tmp_path, how, said):
    from fixtures import spinner

    library = spinner.build(tmp_path)
    # Beside busy loops a thread that loops on sched_yield gets almost no CPU (this
    # kernel: 0.03-0.05 s in 2 s beside 4 on 2 cores), so it did nothing to judge and
    # read idle; raised above the machine's load (as root), it spins.
    favoured = (lambda: os.nice(-15)) if os.geteuid() == 0 else None
    out = subprocess.run([sys.executable, "-c", SPINNING_MAIN, str(tmp_path / "activity"), how, str(library)],
                         capture_output=True, text=True, timeout=60, preexec_fn=favoured)
    assert out.returncode == 0, out.stderr
    state, times = (out.stdout.splitlines() + [""])[:2]
    if how == "native" and times:
        # The rule reads a spinner by its CPU's shape: mostly system time (85-90% at every
        # look on a quiet machine).  Beside busy sessions of others the kernel charged this
        # loop mostly user time (2:1 in 9 looks of 10, the process "busy" in 7 runs of 14),
        # or so at some looks only: then the rule takes those for work, its safe side
        # (docs/restarts.md), and anything but work or a spin is wrong.
        user, system = map(float, times.split())
        # Under a heavier load still (four suite workers on two cores, some 25 threads
        # runnable) the loop got 0.22 s of CPU in its 2 s, even at nice -15 (each
        # sched_yield hands the core on): too little at each look to judge by shape.
        starved = user + system < 0.5
        if system < 0.75 * (user + system) or starved:
            assert contract.activity_word(state) in (contract.SPIN, contract.BUSY), out.stdout
            return
    assert contract.activity_word(state) == said, out.stdout


# Two samplers that look at one process side by side, 12 looks each; the main thread waits on ``looked``.
SIDE_BY_SIDE = """
left, lock, looked = [len(said)], threading.Lock(), threading.Event()
def look(key, sampler):
    for _ in range(12):
        time.sleep(0.2)
        said[key].append(sampler.judge())
    with lock:
        left[0] -= 1
        if not left[0]:
            looked.set()
"""


def beside_busy_loops(loops: int, script: str, *args) -> dict:
    """Run ``script`` (its first argument: the CPU it pins itself to) on one
    CPU shared with ``loops`` busy processes: what its samplers said."""
    import ast

    cpu = min(os.sched_getaffinity(0))
    burn = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nend = time.monotonic() + 10\n" \
        "while time.monotonic() < end: pass\n"
    load = [subprocess.Popen([sys.executable, "-c", burn, str(cpu)]) for _ in range(loops)]
    try:
        time.sleep(0.5)
        out = subprocess.run([sys.executable, "-c", script, str(cpu), *map(str, args)], capture_output=True,
                             text=True, timeout=60)
    finally:
        for p in load:
            p.kill()
        for p in load:
            p.wait()
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


STARVED_HELPER = """
import os, sys, threading, time
from jaxrun.child.watch import activity, place
os.sched_setaffinity(0, {int(sys.argv[1])})
stop = threading.Event()
def work():  # until every look is taken: starved, the looks may take longer than planned
    while not stop.is_set(): sum(range(1000))
said = {"waits": [], "cpu-only": []}
""" + SIDE_BY_SIDE + """helper = threading.Thread(target=work)
helper.start()
time.sleep(0.3)
lookers = [threading.Thread(target=look, name="jaxrun-" + key, args=(key, activity.Sampler(
    os.devnull, 0.2, **({} if key == "waits" else {"waits": lambda: None})))) for key in said]
for t in lookers: t.start()
looked.wait(50)  # the main thread parked, as in the calm job's helper phase
stop.set()
for t in lookers: t.join()
helper.join()
print(said)
"""


def test_a_real_helper_thread_starved_of_cpu_works_and_without_the_wait_it_looked_idle(tmp_path):
    """One CPU shared by the child and 24 busy processes: its helper thread
    gets about 4% of a core, under the 5% that makes work, and waits for the
    rest.  Two samplers look at it side by side: the one that reads each
    thread's wait for a CPU says BUSY at every look that can judge; the one
    that reads CPU time alone took the helper's work for IDLE."""
    from jaxrun import portable

    if portable.thread_waits() is None or not hasattr(os, "sched_setaffinity"):
        pytest.skip("no run-queue delay per thread, or no CPU affinity, on this system")
    said = beside_busy_loops(24, STARVED_HELPER)
    assert set(said["waits"][2:]) == {contract.BUSY}, said
    assert {contract.IDLE, contract.PARKED} & set(said["cpu-only"][2:]), said  # not moving: parked in its wait


STARVED_TOOL = """
import os, subprocess, sys, threading, time
from jaxrun.child.watch import activity
os.sched_setaffinity(0, {int(sys.argv[1])})
said = {"waits": [], "cpu-only": []}
""" + SIDE_BY_SIDE + """tool = subprocess.Popen([sys.executable, "-c", "import os\\nos.nice(19)\\nwhile True: pass"])
time.sleep(0.3)
cpu_only = lambda: {pid: (cpu, False) for pid, (cpu, _) in activity.children_cpu().items()}
lookers = [threading.Thread(target=look, name="jaxrun-" + key, args=(key, activity.Sampler(
    os.devnull, 0.2, **({} if key == "waits" else {"children": cpu_only})))) for key in said]
for t in lookers: t.start()
looked.wait(50)  # the main thread waits for its tool, as the calm job's process 0 does
tool.kill()
tool.wait()
print(said)
"""


def test_a_real_tool_starved_of_cpu_works_for_its_process_and_by_its_cpu_alone_looked_idle(tmp_path):
    """The process waits for a tool it started, which computes at nice 19
    on one CPU beside 2 busy processes: the tool gets about 1% of a core in
    slices far apart (none to the clock tick in a second, here), under the
    5% that makes work.  Two samplers look side by side: the one that reads
    whether the tool is ready to run says BUSY at every look that can judge;
    the one that reads its CPU alone took it for idle (four suite workers on
    two cores stopped a calm job over SSH so, its process 0 waiting for an
    external tool)."""
    from jaxrun import portable

    if portable.descendants_cpu(states=True) is None or not hasattr(os, "sched_setaffinity"):
        pytest.skip("no process tree with run-queue delays, or no CPU affinity, on this system")
    said = beside_busy_loops(2, STARVED_TOOL)
    assert set(said["waits"][2:]) == {contract.BUSY}, said
    assert {contract.IDLE, contract.PARKED} & set(said["cpu-only"][2:]), said


STARVED_SPINNERS = """
import ctypes, os, sys, threading, time
from jaxrun.child.watch import activity
os.sched_setaffinity(0, {int(sys.argv[1])})
said = {"switches": [], "cpu-only": []}
""" + SIDE_BY_SIDE + """ctypes.CDLL(sys.argv[2]).spin_start(2)  # native threads on sched_yield, as NCCL's in a hang
lookers = [threading.Thread(target=look, name="jaxrun-" + key, args=(key, activity.Sampler(
    os.devnull, 0.2, **({} if key == "switches" else {"preempted": lambda: None})))) for key in said]
for t in lookers: t.start()
looked.wait(50)  # the main thread parked, as the spinning job's culprit is
print(said, flush=True)
os._exit(0)  # the spinners spin until the end
"""


def test_real_threads_that_spin_beside_busy_loops_on_their_cpu_spin_where_their_cpu_alone_read_parked(tmp_path):
    """One CPU shared by the child and 8 busy processes: its two threads
    that loop on sched_yield get almost no CPU (0-6 ms in 5 s), and the
    kernel preempts them hundreds of times.  Two samplers look at them side
    by side: the one that counts preemptions says SPIN at every look that
    can judge; without that count the process read parked."""
    from fixtures import spinner

    from jaxrun import portable

    if portable.preempted() is None or not hasattr(os, "sched_setaffinity"):
        pytest.skip("no context switches per thread, or no CPU affinity, on this system")
    said = beside_busy_loops(8, STARVED_SPINNERS, spinner.build(tmp_path))
    assert {contract.activity_word(w) for w in said["switches"][2:]} == {contract.SPIN}, said
    assert contract.PARKED in said["cpu-only"][2:], said


FORKED_MAIN = """
import os, sys, threading, time
from jaxrun import portable
from jaxrun.child.watch import activity, place
threading.Thread(target=lambda: None).start()  # the parent's main thread has a native id of its own
pid = os.fork()  # as the preload server's children are made
if pid == 0:
    said = []
    def look(sampler):
        for _ in range(8):
            time.sleep(0.2)
            said.append(sampler.judge())
    looker = threading.Thread(target=look, args=(activity.Sampler(os.devnull, 0.2),), name="jaxrun-look")
    looker.start()
    end = time.monotonic() + 1.8
    while time.monotonic() < end: sum(range(1000))  # a hot loop on one line: its stack looks still
    looker.join()
    print(portable.main_native_id() == threading.get_native_id() == os.getpid(), said, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_in_a_forked_child_the_main_threads_python_loop_is_work_not_spin():
    """After a fork, Python 3.11's main_thread().native_id is the parent's
    thread's: the sampler took the child's main thread for a native thread,
    and its hot loop for spinning (the calm job's start-up, under the
    preload server, warned of as no progress)."""
    out = subprocess.run([sys.executable, "-c", FORKED_MAIN], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    right, said = out.stdout.split(" ", 1)
    assert right == "True", out.stdout
    import ast

    said = ast.literal_eval(said.strip())
    assert contract.SPIN not in {contract.activity_word(s) for s in said} and contract.BUSY in said, said


DUMPED_WHILE_PARKED = """
import sys, threading, time
from jaxrun.child.watch import activity, dumps
dumps.install()  # as the shim does
sampler = activity.Sampler(sys.argv[1], 0.1)
said = []
def look():
    time.sleep(0.3)
    sampler.judge()  # the baseline: parked from here on
    for _ in range(30):
        time.sleep(0.1)
        said.append(sampler.judge())
    print(" ".join(said), flush=True)
    done.set()
done = threading.Event()
threading.Thread(target=look, name="jaxrun-activity", daemon=True).start()
print("parked", flush=True)
done.wait()  # parked, as a stuck process's main thread is
"""


@pytest.mark.timeout(60)
def test_a_parked_main_thread_asked_for_dumps_again_and_again_never_looks_moved(tmp_path):
    """Each dump runs jaxrun's handler on the parked main thread's stack for
    a moment; the sampler read that as the script moving, so each probe of a
    stall made the process look working and the stall was found a probe
    later (a spinning job's, 9 s after it parked at --stall-timeout 2 under
    load).  Dumped every 30 ms, it stays idle at every look."""
    child = subprocess.Popen([sys.executable, "-c", DUMPED_WHILE_PARKED, str(tmp_path / "activity")],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout.readline() == "parked\n"
        dumps = 0
        while child.poll() is None and dumps < 200:
            child.send_signal(signal.SIGUSR1)
            dumps += 1
            time.sleep(0.03)
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    said = out.split()
    assert dumps > 50 and len(said) == 30, (dumps, out)
    assert set(said) == {contract.PARKED}, said  # in an event's wait: Python's own, outside JAX


# -- every process at one line: parked outside JAX (issue 71) ----------------------------

JAX_FRAME = (code("/site-packages/jax/_src/array.py", "_value"), 4)


def test_an_idle_process_parked_in_pythons_own_wait_outside_jax_says_parked(tmp_path):
    s = Sampler(tmp_path)
    s.threads, s.parked = {MAIN: 0.0}, True
    assert s.says(1.0) == contract.PARKED  # time.sleep, a queue's get: no CPU, no I/O, outside JAX
    assert s.says(1.0, io=10 * activity.BUSY_IO) == contract.BUSY  # a save writes
    assert s.burn(1.0, HELPER=0.5) == contract.BUSY  # a loader thread computes
    assert s.says(1.0) == contract.PARKED
    # Inside JAX, the CPU idle: a program on an accelerator.  Idle, never parked.
    assert s.says(1.0, stack=(JAX_FRAME, *s.stack)) == contract.BUSY  # it moved there
    assert s.says(1.0) == contract.IDLE
    # At the script's line, in a native call of jaxlib's (np.asarray(y)): not parked in Python's own wait.
    s.says(1.0, stack=((code("/work/train.py", "<module>"), 30),))
    assert s.says(1.0, parked=False) == contract.IDLE


# Each waits 10 s at most (the test takes well under 1 s): no thread outlives it by much.
SLEEPER = compile("def park(event):\n    event.set()\n    time.sleep(10)\n", "/work/train.py", "exec")
IN_JAX = compile("def program(event):\n    event.set()\n    time.sleep(10)\n", "/site-packages/jax/_src/pjit.py",
                 "exec")
NATIVE = compile("def native(event, libc):\n    event.set()\n    libc.sleep(10)\n", "/work/train.py", "exec")


def parked_thread(source, name: str, *args):
    """A daemon thread of the script's parked in ``name`` of ``source`` (a
    function that sets its event, then waits), once it waits."""
    import threading
    import time as time_module

    space = {"time": time_module}
    exec(source, space)  # noqa: S102 - the test's own code, under the file name it pretends
    event = threading.Event()
    thread = threading.Thread(target=space[name], args=(event, *args), daemon=True)
    thread.start()
    event.wait(10)
    return in_a_call(thread)


def in_a_call(thread):
    """``thread``, once its innermost frame stands at a call (a loaded machine may hold it before)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and place.callee_recipe(frame.f_code, place.site_offset(frame.f_code, frame.f_lasti)):
            return thread
        time.sleep(0.01)
    raise AssertionError(f"{thread.name} never reached its call")


def test_parked_in_pythons_own_wait_is_read_from_the_threads_frames():
    import ctypes
    import queue
    import threading

    asleep = parked_thread(SLEEPER, "park")
    assert place.parked_in_python(asleep.ident)  # time.sleep, called by its global name

    # A dead loader's queue.  Released by the test's own put, never by a
    # timeout: a get that timed out raised Empty in its thread seconds later,
    # and pytest blamed whichever test that worker ran then.
    loader = queue.Queue()
    getter = threading.Thread(target=loader.get, daemon=True)
    getter.start()
    try:
        in_a_call(getter)
        assert place.parked_in_python(getter.ident)  # the innermost frame is the standard library's

        libc = ctypes.CDLL(None)
        native = parked_thread(NATIVE, "native", libc)
        assert not place.parked_in_python(native.ident)  # a native call it cannot name: np.asarray(y), say
        assert not place.parked_in_python(parked_thread(IN_JAX, "program").ident)  # inside JAX

        # Another thread of the script's inside JAX (a program it runs for the main thread): none is parked.
        assert not place.parked_in_python(asleep.ident) and not place.parked_in_python(getter.ident)
    finally:
        loader.put(None)
        getter.join(5)


def heard_for(w, clock, states: dict[int, str], seconds: float) -> None:
    for rank, said in states.items():
        w.heard(rank, said)
    clock.now += seconds


def probe_with(w, clock, logs, lines: dict[int, str]) -> object:
    """Probe, let each process dump ``lines[rank]`` (a dump's frame lines), and decide."""
    assert w.tick()[1] == "probe"
    for rank, frames in lines.items():
        with open(logs[rank], "a") as f:
            f.write(f"Current thread 0x02 (most recent call first):\n{frames}{ENTRY}")
    clock.now += 0.1
    return w.tick()[1]


AT_SLEEP = '  File "/work/t.py", line 5 in <module>\n'
AT_PROGRAM = '  File "/site-packages/jax/_src/array.py", line 640 in _value\n  File "/work/t.py", line 9 in step\n'


def test_every_process_parked_at_one_line_for_the_timeout_is_a_stall(tmp_path):
    w, clock, notes, logs = watch(tmp_path, n=3)
    heard_for(w, clock, dict.fromkeys(range(3), contract.PARKED), 10.1)
    found = probe_with(w, clock, logs, dict.fromkeys(range(3), AT_SLEEP))
    assert isinstance(found, stall.Stall) and found.waiting is None, (found, notes)
    assert [g.ranks for g in found.odd] == [(0, 1, 2)] and found.odd[0].place.at == "/work/t.py:5"
    from jaxrun.reporting import diagnosis

    lines = diagnosis.stall_lines(found, [])
    assert lines[1] == ("processes 0, 1, 2 stand still at /work/t.py:5 in <module>, parked outside JAX with no "
                        "CPU and no I/O"), lines

    (tmp_path / "alone").mkdir()
    alone, clock, notes, logs = watch(tmp_path / "alone", n=1)  # one process: as stuck, nobody to share its line
    heard_for(alone, clock, {0: contract.PARKED}, 10.1)
    assert [g.ranks for g in probe_with(alone, clock, logs, {0: AT_SLEEP}).odd] == [(0,)]


@pytest.mark.parametrize("states, dumped", [
    # A program on an accelerator: the CPU idle, the main thread inside JAX (or in jaxlib's native call).
    ((contract.IDLE,) * 3, AT_PROGRAM),
    ((contract.IDLE,) * 3, AT_SLEEP),
    # One that waits in a way the sampler cannot name, among parked ones.
    ((contract.PARKED, contract.IDLE, contract.PARKED), AT_SLEEP),
    # Parked to the samplers, inside JAX to the dumps: the dumps' word stands.
    ((contract.PARKED,) * 3, AT_PROGRAM),
], ids=["inside-jax", "native-call", "one-not-parked", "dumped-inside-jax"])
def test_one_shared_line_without_every_process_parked_outside_jax_is_no_stall(tmp_path, states, dumped):
    w, clock, notes, logs = watch(tmp_path, n=3)
    heard_for(w, clock, dict(enumerate(states)), 10.1)
    assert probe_with(w, clock, logs, dict.fromkeys(range(3), dumped)) is None
    assert len(notes) == 1 and "not taken for a stall, as one long program looks the same" in notes[0]
    assert notes[0].endswith("so the job runs on.")  # a whole sentence (it ended in "waiting on")


def test_a_process_parked_for_less_than_the_timeout_stalls_a_timeout_later(tmp_path):
    w, clock, notes, logs = watch(tmp_path, n=2)
    heard_for(w, clock, {0: contract.PARKED, 1: contract.IDLE}, 6)  # 1 waits on a program of another thread's
    heard_for(w, clock, {1: contract.PARKED}, 4.1)  # that thread is done: parked from here on
    assert probe_with(w, clock, logs, dict.fromkeys(range(2), AT_SLEEP)) is None and len(notes) == 1
    clock.now += 10
    found = probe_with(w, clock, logs, dict.fromkeys(range(2), AT_SLEEP))
    assert [g.ranks for g in found.odd] == [(0, 1)]


@pytest.mark.parametrize("dumped", [AT_PROGRAM, AT_SLEEP], ids=["one-program", "native"])
def test_one_long_program_is_said_once_and_its_time_is_no_stall_in_the_goodput(tmp_path, dumped):
    """Every process at one place, none known to be parked (a 30 s program
    on the TPU host, --stall-timeout 8, its main thread in the jitted call's
    native code: no frame of JAX's in the dump): one line while nothing
    moves, not one every timeout, and the span is not a stall's; what the
    time was is the account's (programs, or idle outside JAX).  On the TPU
    host it read 'lost to stall 20.1 s' for a 39.6 s program (issue 76)."""
    clock, notes = Clock(), []
    specs = [ProcessSpec(rank=r, local_rank=r, host=LOCAL_HOST, python="python", shim_args=("--", "x.py"), env={})
             for r in range(2)]
    logs = {r: str(tmp_path / f"process-{r}.stderr") for r in range(2)}
    for path in logs.values():
        open(path, "w").close()
    w = stall.ActivityWatch(specs, 10.0, clock, notes.append, logs, wall=clock)
    heard_for(w, clock, dict.fromkeys(range(2), contract.IDLE), 10.1)
    assert probe_with(w, clock, logs, dict.fromkeys(range(2), dumped)) is None
    probes = 0
    for _ in range(3):  # it goes on: probed again each timeout, said no more
        clock.now += 10.1
        if w.tick()[1] == "probe":
            probes += 1
            for rank in range(2):
                with open(logs[rank], "a") as f:
                    f.write(f"Current thread 0x02 (most recent call first):\n{dumped}{ENTRY}")
            clock.now += 0.1
            assert w.tick()[1] is None
    assert probes >= 2
    assert len(notes) == 1, notes
    heard_for(w, clock, {0: contract.BUSY}, 0.1)  # the program ended
    w.tick()
    assert w.stills == [], w.stills


def test_a_long_program_that_ends_before_the_watchdogs_verdict_or_comes_back_is_no_stall_and_said_once(tmp_path):
    """On the TPU host a 30 s program at --stall-timeout 8 read 3.7 s of stall
    and its line twice (issue 76): a blip of CPU cut its stillness in two, and
    the second span ended (the program done) after the timeout, before the
    watchdog's verdict on it.  A span a process ends by moving is no stall;
    a place said once is not said again."""
    _, clock, notes, logs = watch(tmp_path, n=2)
    specs = [ProcessSpec(rank=r, local_rank=r, host=LOCAL_HOST, python="python", shim_args=("--", "x.py"), env={})
             for r in range(2)]
    w = stall.ActivityWatch(specs, 10.0, clock, notes.append, logs, wall=clock)  # spans by the test's clock
    heard_for(w, clock, dict.fromkeys(range(2), contract.IDLE), 10.1)
    assert probe_with(w, clock, logs, dict.fromkeys(range(2), AT_PROGRAM)) is None  # let run, said
    heard_for(w, clock, {0: contract.BUSY}, 0.1)  # a blip of CPU: the span ends ...
    heard_for(w, clock, {0: contract.IDLE}, 10.1)  # ... and a new one begins, at the same place
    assert probe_with(w, clock, logs, dict.fromkeys(range(2), AT_PROGRAM)) is None
    assert len(notes) == 1, notes
    heard_for(w, clock, {0: contract.BUSY}, 0.1)
    heard_for(w, clock, {0: contract.IDLE}, 10.1)  # a third span: the program ends before a verdict
    assert w.tick()[1] == "probe"
    heard_for(w, clock, {0: contract.BUSY, 1: contract.BUSY}, 0.1)
    w.tick()
    w.finish()
    assert w.stills == [], w.stills
