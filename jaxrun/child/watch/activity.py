"""Child side of the stall watchdog (``--stall-timeout``): is this process
making progress?

The main thread's sampler (``child.watch.sampler``, one thread that serves
the time account too) has the watchdog look at the process every
``interval`` seconds (a tenth of the stall timeout, at most
``MAX_INTERVAL``) and ask whether anything moved since its last look.  Progress is any of:

- the main thread's stack changed: it moved to another line, or to another
  instruction of one line (a loop written on one line), a call that Python
  3.11 specialized being where it was (``call_offset``);
- CPU time that is the script's own: at least ``BUSY_SHARE`` of a core
  used by a Python thread of the script's (a helper thread that loads
  data), or by one of the processes it started (a ``gsutil cp`` it waits
  for), or by any thread while the main thread is inside JAX (a program
  executing, a compile, ``block_until_ready``: XLA's threads do the work);
- I/O: at least ``BUSY_IO`` bytes read or written, files and sockets alike
  (a checkpoint save, a download), where the system counts them, the
  sampler's own left out (its reads of ``/proc``: ``portable.io_bytes``);
- the main thread is inside JAX's compiler or its ``initialize()``: a long
  compile is work, and a join waits for the others under JAX's own timeout;
- the script said so: ``jaxrun.alive()``, for a long phase that shows none
  of the above.

A process that waits in a collective, in ``time.sleep`` or on a lock uses
well under 1% of a core (JAX's own background threads included): IDLE.
Where its main thread is then parked in a wait of Python's own, outside
JAX, while no thread of the script's is inside JAX (``place.parked_in_python``:
a queue's ``get``, an event, ``time.sleep``), it says PARKED instead: it is
known to wait on no program.  IDLE alone may be a program running on an
accelerator (the CPU idle while the device computes), so the launcher takes
a wait every process shares at one line for a stall only where each said
PARKED for the whole timeout.
A third state is neither: SPIN, the process's own threads burn CPU while
its Python has not moved.  That is a GPU job's hang as NCCL shows it: the
culprit's native threads (no Python frame) loop on ``sched_yield`` at 100%
while its main thread is parked outside JAX at another line; or a main
thread that spins inside a native call outside JAX, its stack unchanged:
mostly system time (a loop on ``sched_yield``) with the GIL left free
(``main_spins``).  A main thread whose CPU is user time, or that holds the
GIL, works: a hot Python loop on one line, its time in one builtin, or a
numpy call, looks still to a stack that is read once per look.
A busy native thread is not progress, so the launcher counts SPIN as not
moving, and the line says how many threads spun and their CPU in cores,
for the summary.  CPU time per thread is read where the system says it
(``portable.thread_cpu``); elsewhere any CPU time is progress, as before.

On a loaded machine a thread that works or spins gets only a share of a
core: a Python helper thread among thirty busy processes on two cores
gets 6-7%, and less as the load grows.  So a thread that was ready to run
for at least ``WANTED_SHARE`` of the interval (its CPU time plus its wait
for a CPU, ``portable.thread_waits``) counts as if it had used the CPU:
the script's helper thread works, and so does a main thread that imports
or computes (unless its CPU has a spinner's shape, ``main_spins``; one
starved below ``BUSY_SHARE`` shows no shape, and works).  A parked thread
waits for no CPU; a thread that wakes now and then waits a little each
time.  A wrong "busy" only delays a stall's finding on a loaded machine;
a wrong "idle" may stop a job that works.  Another thread spins when it
used ``BUSY_SHARE`` of a core.  On a machine so loaded that a spinner gets
less (a loop on ``sched_yield`` got 0-6 ms in 5 s beside 4 to 60 busy
loops), its wait alone tells nothing, since a thread that woke once may
wait the whole interval for a CPU; but the kernel preempts a spinner again
and again, and it never sleeps.  So a thread starved so (``wanting``) that
was preempted at least ``PREEMPTED_SPIN`` times between two looks with no
voluntary switch (``starved_spinners``, from ``/proc/self/task/TID/status``,
read for those threads only) spins too, with the little CPU it got.  The
main thread's runs of jaxrun's signal handler (a stall's probe asks for
dumps) are jaxrun's: at a look after one, its CPU counts for neither.

The looks cost little, once per interval (reading each thread's CPU time
and its wait for a CPU, two small files a thread, only when the process
used ``LOOK_SHARE`` of a core, the last look was busy, or the kernel
preempted its threads ``PREEMPTED_LOOK`` times (``getrusage``: two system
calls): 0.3 ms a look in a jax process, 3-7 ms with
300 more native threads, 0.05 ms where it used none, ``bench/stall.py``;
the children's, one system call where there are none); nothing is hooked,
so the script's own calls run as fast as without jaxrun.  The sampler's
own CPU and I/O are left out of the process's: at 300 threads its reads
were 64 KiB a look, and passed for progress (issue 61).

What the launcher hears is only the changes: the file
``contract.ACTIVITY_FILE`` holds one line, ``busy``, ``idle``, ``parked`` or
``spin N CORES`` (``contract``'s words, ``contract.Spinning``), rewritten whole (a
new file renamed over the old) each time the state changes (for SPIN: or
the number of threads).  The launcher reads it, or the far-end agent does
and sends the change home.  Where each process waits is not reported here:
when no process has moved for the stall timeout, the launcher asks for
stack dumps (SIGUSR1), which say it.
"""

from __future__ import annotations

import os
import threading
import time

from jaxrun import contract, portable
from jaxrun.child.watch import dumps, sampler
from jaxrun.child.watch.place import busy_place, inside_jax, main_stack, parked_in_python

MAX_INTERVAL = 5.0
MIN_INTERVAL = 0.05
BUSY_SHARE = 0.05  # of one core, over an interval
LOOK_SHARE = 0.01  # of one core: less, and the process has nothing to judge thread by thread
WANTED_SHARE = 0.5  # of the interval, CPU time and the wait for a CPU: a Python thread that works, starved
BUSY_IO = 64 * 1024  # bytes per interval
PREEMPTED_LOOK = 2  # the process's threads preempted this often in an interval: its threads are read
PREEMPTED_SPIN = 2  # a starved thread preempted this often between two looks, never sleeping: it spins
SPIN_SYSTEM_SHARE = 0.5  # of the main thread's CPU: a loop on sched_yield is mostly system time
GIL_HELD = 0.001  # seconds to take the GIL back: more, and a thread is running Python
_OWN_THREADS = "jaxrun-"  # the names of jaxrun's own threads: neither work nor spin

_beats = 0
started: Sampler | None = None  # this process's sampler, once start() made it (child.accounting tells through it)


def alive() -> None:
    """Tell jaxrun's stall watchdog that this process is making progress:
    for a long phase that uses no CPU, no I/O and stays on one line (a wait
    on a slow external service, say).  Cheap enough to call in any loop."""
    global _beats
    _beats += 1


def interval_for(stall_timeout: float) -> float:
    return min(MAX_INTERVAL, max(MIN_INTERVAL, stall_timeout / 10))


def python_threads(main: int | None) -> tuple[set[int], set[int]]:
    """The native ids of the script's Python threads other than the main
    one (their CPU is work), and of jaxrun's own (the sampler's among them:
    their CPU is neither work nor spin)."""
    work, own = set(), set()
    first = threading.main_thread()  # its native_id may be stale after a fork: ``main`` is not
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is not None and tid != main and thread is not first:
            (own if thread.name.startswith(_OWN_THREADS) else work).add(tid)
    return work, own


def others_cpu() -> float:
    """CPU seconds this process has used so far, less the calling thread's
    (the sampler's: a look at 300 threads costs about as much as a parked
    process uses, and its own work is not the process's)."""
    return time.process_time() - time.thread_time()


def children_cpu() -> dict[int, tuple[float, bool]]:
    """Each process this one started and that still runs (grandchildren
    too), by pid: (its CPU seconds, whether it is running or ready to run
    now; False where only psutil can say).  A tool the script waits for
    works for it, also where the load starves it of CPU.  Asked at every
    look, so it walks this process's own tree only, and costs one system
    call where there is no child (``portable.descendants_cpu``); psutil's
    walk of every process of the host is the fallback."""
    used = portable.descendants_cpu(states=True)
    if used is not None:
        return used
    import psutil  # here: only where the layer cannot say

    used = {}
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return used
    for kid in kids:
        try:
            times = kid.cpu_times()
        except psutil.Error:
            continue
        used[kid.pid] = (times.user + times.system, False)
    return used


def children_work(before: float, cpu: float, running: bool, enough: float) -> bool:
    """Whether a child worked since the last look (its CPU seconds then and
    now, and whether it runs now): ``enough`` CPU, or it is running or ready
    to run at this look (a tool the load starves gets almost no CPU, but it
    wants it; a parked one does not)."""
    return cpu - before >= enough or running


def judge_threads(before: dict[int, float], now: dict[int, float], seconds: float, work: set[int],
                  own: set[int], waited: dict[int, float] | None = None, starved: set[int] = frozenset()) -> str:
    """From each thread's CPU seconds at two looks ``seconds`` apart: BUSY
    where the script's Python threads (``work``) used ``BUSY_SHARE`` of a
    core, else a SPIN line for the other threads (no Python frame, or the
    main thread, whose stack did not move) that each used that much, else
    IDLE.  ``own``: jaxrun's threads, left out.  ``waited``: the seconds
    each thread was ready to run but had no CPU, between the looks; a
    thread of ``work`` whose CPU and wait make ``WANTED_SHARE`` of the
    interval is starved, not parked, and works.  Spinning is judged by CPU,
    save for ``starved``: threads that spin though the load left them less
    than that (``starved_spinners``)."""
    seconds = max(seconds, 1e-9)
    enough, wanted = BUSY_SHARE * seconds, WANTED_SHARE * seconds
    waited = waited or {}
    used = _used(before, now, own)

    if sum(used.get(tid, 0.0) for tid in work) >= enough:
        return contract.BUSY
    if any(used[tid] + waited.get(tid, 0.0) >= wanted for tid in work if tid in used):
        return contract.BUSY  # starved: it wanted the CPU most of the interval
    spun = [cpu for tid, cpu in used.items() if tid not in work and (cpu >= enough or tid in starved)]
    if not spun:
        return contract.IDLE
    return contract.Spinning(len(spun), round(sum(spun) / seconds, 2)).line()


def wanting(before: dict[int, float], now: dict[int, float], seconds: float, work: set[int], own: set[int],
            waited: dict[int, float]) -> set[int]:
    """The threads, neither the script's Python (``work``) nor jaxrun's
    (``own``), that used less than ``BUSY_SHARE`` of a core but were ready
    to run for ``WANTED_SHARE`` of the interval: starved, whether they spin
    or woke once to wait for a CPU (``starved_spinners`` tells which)."""
    enough, wanted = BUSY_SHARE * seconds, WANTED_SHARE * seconds
    return {tid for tid, cpu in _used(before, now, own).items()
            if tid not in work and cpu < enough and cpu + waited.get(tid, 0.0) >= wanted}


def _used(before: dict[int, float], now: dict[int, float], own: set[int]) -> dict[int, float]:
    """Each thread's CPU seconds between two looks, jaxrun's own (``own``) left out."""
    return {tid: cpu - before.get(tid, 0.0) for tid, cpu in now.items() if tid not in own}


def starved_spinners(before: dict[int, tuple[int, int]], now: dict[int, tuple[int, int]]) -> set[int]:
    """Of the starved threads at two looks (each one's voluntary and
    involuntary context switches so far, ``portable.thread_switches``),
    those that spin: they never switched voluntarily in between (no sleep,
    no wait on anything) and were preempted at least ``PREEMPTED_SPIN``
    times (they ran, and wanted to go on).  A thread woken once that waited
    the whole interval for a CPU was not preempted; a thread that wakes
    often to do a little switches voluntarily each time."""
    return {tid for tid, (voluntary, preempted) in now.items()
            if tid in before and voluntary == before[tid][0] and preempted - before[tid][1] >= PREEMPTED_SPIN}


def main_spins(before: tuple[float, float] | None, now: tuple[float, float] | None, enough: float,
               gil_free) -> bool:
    """Whether the main thread, its stack unchanged and outside JAX, spins
    inside a native call rather than works.  Its CPU is work unless all of
    these hold: it used ``enough``; most of it was system time, as a loop on
    ``sched_yield`` is (NCCL's and CUDA's spin-waits; a Python loop, or a
    numpy call, is user time); and it has left the GIL free, so it is not
    running Python (``gil_free`` is asked last: it may take a few ms)."""
    if before is None or now is None:
        return False
    user, system = now[0] - before[0], now[1] - before[1]
    return user + system >= enough and system >= SPIN_SYSTEM_SHARE * (user + system) and gil_free()


def gil_left_free(tries: int = 3) -> bool:
    """Whether no other thread holds the GIL: ``time.sleep(0)`` gives it up
    and takes it back, at once when it is free, after the switch interval
    (5 ms) when a thread runs Python.  The least of a few tries."""
    waits = []
    for _ in range(tries):
        started = time.perf_counter()
        time.sleep(0)
        waits.append(time.perf_counter() - started)
    return min(waits) < GIL_HELD


class Sampler:
    """The sampler: its thread, its last look, and the state last written."""

    def __init__(self, path: str, interval: float, clock=time.monotonic, cpu=others_cpu,
                 io=portable.io_bytes, stack=None, children=None, threads=portable.thread_cpu, python=None,
                 main_times=None, gil_free=None, main_tid: int | None = None, waits=portable.thread_waits,
                 parked=None, preempted=portable.preempted, switches=portable.thread_switches):
        self.path, self.interval = path, interval
        self.clock, self.cpu, self.io = clock, cpu, io
        main = threading.main_thread()
        self.stack = stack or (lambda: main_stack(main.ident))
        self.parked = parked or (lambda: parked_in_python(main.ident))  # asked only of an idle look
        self.children = children or children_cpu
        self.threads = threads  # each thread's CPU seconds, or None (read only when the process used CPU)
        self.waits = waits  # each thread's seconds waiting for a CPU, or None (read with the CPU seconds)
        self.main_tid = portable.main_native_id() if main_tid is None else main_tid
        self.python = python or (lambda: python_threads(self.main_tid))
        # The main thread's (user, system) CPU seconds, and whether it has left the GIL free.
        self.main_times = main_times or (lambda: portable.thread_times(self.main_tid))
        self.gil_free = gil_free or gil_left_free
        self.preempted = preempted  # the process's involuntary context switches so far, or None
        self.switches = switches  # each starved thread's (voluntary, involuntary) switches, read for those only
        self.last_preempted = preempted()
        self.last_wanting: dict[int, tuple[int, int]] = {}  # the starved threads' switches at the last look
        self.last_heard = dumps.heard()  # the main thread's runs of jaxrun's signal handler
        self.last_main: tuple[float, float] | None = None
        self.state: str | None = None  # the line last written
        self.lock = threading.Lock()  # FINISHED is the last word: no look after it writes over it
        self.finished = False
        self.told = b""  # the account's TIME line, written with each state
        self.last = self._look()
        self.last_threads: dict[int, float] | None = None  # at the last look, where read then
        self.last_waits: dict[int, float] | None = None
        self.was_busy = False  # the last look's verdict

    def _look(self) -> tuple:
        return self.clock(), self.cpu(), self.io(), self.stack(), _beats, self.children()

    def judge(self) -> str:
        """What the process did since the last look: BUSY, IDLE, PARKED (idle,
        parked in a wait of Python's own outside JAX), or a SPIN line
        (``contract.Spinning``)."""
        said = self._judge()
        if said == contract.IDLE and not inside_jax(self.last[3]) and self.parked():
            said = contract.PARKED
        self.was_busy = said == contract.BUSY
        return said

    def _judge(self) -> str:
        (t0, cpu0, io0, stack0, beats0, kids0), now = self.last, self._look()
        self.last = now
        t, cpu, io, stack, beats, kids = now
        enough = BUSY_SHARE * max(t - t0, 1e-9)
        used = cpu - cpu0 >= enough
        # A starved process uses little CPU though its threads want more:
        # its threads are read from a share of a core well above a parked
        # one's, and after a busy look (a starved helper may get less than
        # that share in one interval, and what it waited for says it works).
        # A process whose threads spin on a machine so loaded that they get almost no CPU
        # still shows it: the kernel preempts them again and again.
        preempted0, self.last_preempted = self.last_preempted, self.preempted()
        heard0, self.last_heard = self.last_heard, dumps.heard()
        looked = (cpu - cpu0 >= LOOK_SHARE * max(t - t0, 1e-9) or self.was_busy
                  or (self.last_preempted is not None and preempted0 is not None
                      and self.last_preempted - preempted0 >= PREEMPTED_LOOK))
        before, self.last_threads = self.last_threads, (self.threads() if looked else None)
        waits_before, self.last_waits = self.last_waits, (self.waits() if looked else None)
        main_before, self.last_main = self.last_main, (self.main_times() if looked else None)
        if beats != beats0 or stack != stack0 or busy_place(stack):
            return contract.BUSY
        if any(children_work(kids0[pid][0] if pid in kids0 else 0.0, cpu, running, enough)
               for pid, (cpu, running) in kids.items()):
            return contract.BUSY
        if io is not None and io0 is not None and io - io0 >= BUSY_IO:
            return contract.BUSY
        if not looked:
            return contract.IDLE
        if before is None or self.last_threads is None:
            return contract.BUSY if used else contract.IDLE  # no thread's own count to judge by (yet)
        if inside_jax(stack):
            return contract.BUSY if used else contract.IDLE  # JAX's work
        work, own = self.python()
        if self.last_heard != heard0:
            # It ran jaxrun's signal handler (a stall's probe asks for dumps): its CPU was
            # jaxrun's, mostly system time with the GIL free, the shape of a spin.
            own = own | {self.main_tid}
        elif not main_spins(main_before, self.last_main, enough, self.gil_free):
            work = work | {self.main_tid}
        waited = waited_between(waits_before, self.last_waits)
        starved = wanting(before, self.last_threads, t - t0, work, own, waited)
        switches, self.last_wanting = self.last_wanting, (self.switches(starved) if starved else {})
        return judge_threads(before, self.last_threads, t - t0, work, own, waited,
                             starved_spinners(switches, self.last_wanting))

    def write(self, said: str) -> None:
        with self.lock:
            if self.finished or _key(said) == _key(self.state):
                return
            self.state = said
            self.finished = said == contract.FINISHED
            self._write()

    def tell(self, line: str) -> None:
        """The account's TIME line (``child.watch.accounting``), kept beside the state."""
        with self.lock:
            self.told = line.encode() + b"\n"
            if not self.finished and self.state is not None:
                self._write()

    def _write(self) -> None:
        try:
            contract.write_private(self.path, self.state.encode() + b"\n" + self.told)
        except OSError:
            pass  # a hint: the launcher then keeps the state it heard last

    def begin(self) -> None:
        """At the sampler thread's start: the first word, and the first look again."""
        self.write(contract.BUSY)
        try:  # again from the sampler's thread: its own CPU and I/O are the ones left out
            self.last = self._look()
        except Exception:  # noqa: BLE001 - the constructor's look stands, as a failed look's would
            pass

    def step(self) -> None:
        """One judgement, written where it is news."""
        try:
            said = self.judge()
        except Exception:  # noqa: BLE001 - a look that fails is no hang: never a false stall, and the next look
            said = contract.BUSY
        self.write(said)

    def run(self) -> None:
        """On a thread of its own (the tests' way; a process's runs on ``sampler.shared``)."""
        self.begin()
        while not self.finished:
            time.sleep(self.interval)
            self.step()


def _key(said: str | None) -> tuple:
    """What makes a line news: its word, and for SPIN how many threads spin
    (their CPU varies from look to look; the first look's is told)."""
    spinning = contract.Spinning.of(said) if said else None
    return (said,) if spinning is None else (contract.SPIN, spinning.threads)


def waited_between(before: dict[int, float] | None, now: dict[int, float] | None) -> dict[int, float]:
    """Each thread's wait for a CPU between two looks; empty where either
    look has none."""
    if not before or not now:
        return {}
    return {tid: seconds - before.get(tid, 0.0) for tid, seconds in now.items()}


def script_returned() -> None:
    """The script returned: the process says FINISHED, and its sampler stops."""
    if started is not None:
        started.write(contract.FINISHED)


def start(environ=os.environ) -> Sampler | None:
    """Start the sampler if the launcher asked for one (``--stall-timeout``)."""
    global started
    path, timeout = environ.get(contract.ACTIVITY_FILE), environ.get(contract.STALL_TIMEOUT)
    if not path or not timeout or started is not None:
        return started
    try:
        seconds = float(timeout)
    except ValueError:
        return None
    if seconds <= 0:
        return None
    started = Sampler(path, interval_for(seconds))
    sampler.shared.add_watchdog(started)
    return started
