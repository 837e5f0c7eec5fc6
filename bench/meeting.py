"""The cost of the meeting before a program's first run, on a job that makes
a new program every step.

    python bench/meeting.py [--rounds 5] [--steps 100] [-n 2] [--width 256] [--paired]

Each process runs ``--steps`` steps; each step makes a new jitted program
that spans every process (a constant baked in that differs each step, and a
mean over the global batch: an all-reduce), compiles it, and runs it once,
then waits for its value.  So every step's program is met on before it
runs (``checks.meeting``) and posted for the programs check.  Each round runs
two jobs in turn, which one first alternating: ``--checks off`` and the
default (``on``).  The table shows each one's median step (process 0's) over
the rounds, and the ratio to off.  The goal: at most 1%.

``--paired`` measures the same in one job instead, where job-to-job noise
(the step with the checks off moved from 248 to 297 ms between jobs on one
machine) is gone: every job runs with the checks on, and its steps take
turns in pairs, one step with the checks' two hooks (``from_hlo``, where a
program is described, and the first run, where it is met on) and one with
the functions they wrap put back, which one first alternating from pair to
pair.  Both processes switch at the same step, so neither ever waits at a
meeting the other skipped.  It prints each job's median of the pairs'
differences and ratios, then every job's pairs pooled: the mean difference
with one standard error, the median difference and the median ratio.  What
it leaves out: whatever the checks cost a step that makes no new program
(their threads, which run in both halves of a pair); ``bench/checks.py``
measures that.  It needs the hooks of jaxrun after issue 74.

Each process also times the meetings' calls of the store (the client they
call, wrapped in the job), printed as each call's median, and the span of
each first run it met on (the checks' part of it: its line, its post, its
meeting), on the machine's clock: the driver prints the median, over the
first runs, of the time from the later start of the two processes' to the
later end, the latency the meeting adds where the program's first
collective alone would let both go on as the last one came.

Where the checks have the meeting (jaxrun after issue 74), each process
also times its meetings (``Meetings._rendezvous``, wrapped in the job): how
long a healthy first run waited for its group, the round trips included.
Run it with another checkout's interpreter (a venv of the code before the
change) for the figures before.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import JAXRUN, bench_script, checks_on_off, median  # noqa: E402

TRAIN = textwrap.dedent(
    """
    import statistics, sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    waited = []  # each meeting's seconds, its round trips and its wait for the peer
    # The checks' own time on the main thread: describing a program, its first run less its meeting;
    # and the CPU the main thread used in them (the rest of their time, other threads ran).
    own = {"got": [], "_first_run": []}
    cpu = {"got": [], "_first_run": [], "_rendezvous": []}

    def timing(owner, name, into):  # each call of owner.name: its seconds, less the meetings inside it
        real = getattr(owner, name)

        def timed(self, *args):
            start, used, met, met_cpu = time.perf_counter(), time.thread_time(), len(waited), len(cpu["_rendezvous"])
            try:
                return real(self, *args)
            finally:
                into.append(time.perf_counter() - start - sum(waited[met:]))
                cpu[name].append(time.thread_time() - used - sum(cpu["_rendezvous"][met_cpu:]))

        setattr(owner, name, timed)

    def hooks():  # the checks' two hooks, as installed: from_hlo's staticmethod, the first run's function
        from jax._src.interpreters import pxla
        return pxla.UnloadedMeshExecutable.__dict__["from_hlo"], pxla.ExecuteReplicated.__call__

    def closed(fn):  # what a hook's closure holds, by name
        return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))

    store = {}  # the meetings' calls of the store, by name: each call's seconds

    def time_store():  # wraps the client the meetings call (the from_hlo hook's checker's)
        meetings = closed(hooks()[0].__func__)["checker"].meetings
        real = meetings.client

        class Timed:
            def __init__(self, client):
                self.client = client

            def __getattr__(self, name):
                call = getattr(self.client, name)

                def timed(*args, **kwargs):
                    start = time.perf_counter()
                    try:
                        return call(*args, **kwargs)
                    finally:
                        store.setdefault(name, []).append(time.perf_counter() - start)

                return timed

        def client():
            found = real()
            return None if found is None else Timed(found)

        meetings.client = client

    spans = []  # each first run met on: (time.time() at its start, at its end), the run itself not included

    def spanning():  # wraps the checks' first run: when it began and when its program was let run
        real = programs.Programs._first_run

        def timed(self, made):
            start = time.time()
            try:
                return real(self, made)
            finally:
                if made.entry is not None:
                    spans.append((start, time.time()))

        programs.Programs._first_run = timed

    try:
        from jaxrun.child.checks import meeting, programs
        spanning()
        timing(meeting.Meetings, "_rendezvous", waited)
        timing(programs.Programs, "got", own["got"])
        timing(programs.Programs, "_first_run", own["_first_run"])
        time_store()
    except (ImportError, AttributeError, KeyError, TypeError):
        pass  # the checks before the meeting

    def switch():  # sets the checks' two hooks on or off: the functions they wrap, from their closures
        from jax._src.interpreters import pxla
        made, ran = hooks()
        real_made, real_ran = closed(made.__func__)["real"], closed(ran)["run"]

        def use(on):
            pxla.UnloadedMeshExecutable.from_hlo = made if on else staticmethod(real_made)
            pxla.ExecuteReplicated.__call__ = ran if on else real_ran

        return use

    steps, width, paired = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["paired"]
    use = switch() if paired else None
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("b",))
    rows = len(jax.local_devices()) * 8
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("b")),
                                               np.ones((rows, width), np.float32) / width)
    w = jax.device_put(np.eye(width, dtype=np.float32), NamedSharding(mesh, P()))

    def program(k):
        def step(w, x):
            return jnp.mean(jnp.tanh(x @ w) * (1.0 + k / 1000.0))

        step.__name__ = f"step_{k}"  # its own name: a program of its own in every way, met on
        return jax.jit(step)

    for k in range(3):
        float(program(-1 - k)(w, x))
    took, halves = [], {True: [], False: []}
    for k in range(steps):
        on = (k % 2 == 0) == (k // 2 % 2 == 0)  # pairs (k, k+1): on then off, then off then on
        if use is not None:
            use(on)
        start = time.perf_counter()
        float(program(k)(w, x))  # a new program: compiled, met on, run
        took.append(time.perf_counter() - start)
        halves[on].append(took[-1])
    rank = jax.process_index()
    if rank == 0:
        print(f"STEP_MS {statistics.median(took) * 1000:.3f}", flush=True)
    if rank == 0 and use is not None:
        pairs = list(zip(halves[True], halves[False]))
        print("PAIRS_ALL " + " ".join(f"{a * 1000:.3f}:{b * 1000:.3f}" for a, b in pairs), flush=True)
    if spans:
        print(f"SPANS {rank} " + " ".join(f"{a:.6f}:{b:.6f}" for a, b in spans), flush=True)
    if waited:  # the least: the last to come, who waits for no one (its round trips alone)
        print(f"MEET_MS {rank} {statistics.median(waited) * 1000:.3f} {max(waited) * 1000:.3f} {len(waited)} "
              f"{min(waited) * 1000:.3f}", flush=True)
    for name, seconds in sorted(store.items()):
        print(f"STORE_MS {rank} {name} {statistics.median(seconds) * 1000:.3f} {len(seconds)}", flush=True)
    if own["got"] and own["_first_run"]:
        print(f"OWN_MS {rank} {statistics.median(own['got']) * 1000:.3f} "
              f"{statistics.median(own['_first_run']) * 1000:.3f} {statistics.median(cpu['got']) * 1000:.3f} "
              f"{statistics.median(cpu['_first_run']) * 1000:.3f} "
              f"{statistics.median(cpu['_rendezvous'] or [0.0]) * 1000:.3f}",
              flush=True)
    """
)


# (rank, describing ms, a first run less its meeting ms, the main thread's CPU ms in each, and in the
# meeting): each job's medians
OWN: list[tuple] = []


EVERY_PAIR: list[tuple[float, float]] = []  # every job's pairs, pooled: (with ms, without ms), process 0's
SPANS: list[float] = []  # each first run met on, both processes': from the later start to the later end, ms
STORE: list[tuple[int, str, float]] = []  # each job's (rank, the store's call, its median ms) in the meetings


def run(checks: str, script: str, steps: int, width: int, processes: int,
        paired: bool = False) -> tuple[float, list[tuple]]:
    """One job: process 0's median step in ms, and each process's meetings (rank, median, max, count, least)."""
    cmd = [*JAXRUN, "-n", str(processes), "--cpu-devices", "2", "--checks", checks, script, str(steps), str(width),
           *(["paired"] if paired else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, start_new_session=True)
    found = re.search(r"STEP_MS ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-1500:]}")
    meetings = [(int(r), float(m), float(x), int(c), float(least))
                for r, m, x, c, least in re.findall(r"MEET_MS (\d+) ([\d.]+) ([\d.]+) (\d+) ([\d.]+)", proc.stdout)]
    STORE.extend((int(r), name, float(ms)) for r, name, ms, _ in
                 re.findall(r"STORE_MS (\d+) (\w+) ([\d.]+) (\d+)", proc.stdout))
    spans = {int(r): [tuple(map(float, pair.split(":"))) for pair in line.split()]
             for r, line in re.findall(r"SPANS (\d+) (.*)", proc.stdout)}
    if len(spans) >= 2 and len({len(s) for s in spans.values()}) == 1:  # the same first runs, in one order
        SPANS.extend((max(s[1] for s in at) - max(s[0] for s in at)) * 1000 for at in zip(*spans.values()))
    for line in re.findall(r"PAIRS_ALL (.*)", proc.stdout):
        EVERY_PAIR.extend(tuple(map(float, pair.split(":"))) for pair in line.split())
    OWN.extend((int(r), *map(float, rest)) for r, *rest in
               re.findall(r"OWN_MS (\d+) ([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+)", proc.stdout))
    return float(found[1]), meetings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("-n", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--paired", action="store_true",
                        help="in each job, steps with the checks' hooks and without, in pairs (see above)")
    args = parser.parse_args()
    script = bench_script("meeting", "train.py", TRAIN)
    if args.paired:
        paired(script, args)
        return
    print(f"{args.n} processes x 2 devices, a new program every step, {args.steps} steps a job, "
          f"{args.rounds} rounds ({sys.executable})")
    waits: list[tuple] = []

    def job(checks: str) -> float:
        ms, meetings = run(checks, script, args.steps, args.width, args.n)
        waits.extend(meetings)
        return ms

    checks_on_off(job, args.rounds, "a step that makes a new program")
    for rank in sorted({w[0] for w in waits}):
        mine = [w for w in waits if w[0] == rank]
        print(f"process {rank}: a first run's meeting took {median([w[1] for w in mine]):.3f} ms (median of the "
              f"jobs' medians), {max(w[2] for w in mine):.1f} ms at most, {min(w[4] for w in mine):.3f} ms at least "
              f"(the last to come: its round trips), {mine[0][3]} meetings a job")
    for rank in sorted({o[0] for o in OWN}):
        mine = [o for o in OWN if o[0] == rank]
        print(f"process {rank}: the checks' own time on the main thread, a new program: describing it "
              f"{median([o[1] for o in mine]):.3f} ms, its first run less the meeting "
              f"{median([o[2] for o in mine]):.3f} ms (medians of the jobs' medians); the main thread's CPU in "
              f"them {median([o[3] for o in mine]):.3f} ms and {median([o[4] for o in mine]):.3f} ms, in the "
              f"meeting {median([o[5] for o in mine]):.3f} ms")
    store_calls()


def store_calls() -> None:
    """Each process's calls of the store in its meetings: the median of the jobs' medians."""
    for rank in sorted({c[0] for c in STORE}):
        calls = sorted({c[1] for c in STORE if c[0] == rank})
        print(f"process {rank}: the meetings' calls of the store (median ms): " + ", ".join(
            f"{name} {median([c[2] for c in STORE if c[:2] == (rank, name)]):.3f}" for name in calls))


def paired(script: str, args) -> None:
    print(f"{args.n} processes x 2 devices, a new program every step, {args.steps} steps a job in pairs (with the "
          f"checks' hooks, without), {args.rounds} jobs ({sys.executable})")
    for job in range(args.rounds):
        before = len(EVERY_PAIR)
        _, meetings = run("on", script, args.steps, args.width, args.n, paired=True)
        pairs = EVERY_PAIR[before:]
        difference, ratio = median([a - b for a, b in pairs]), median([a / b for a, b in pairs])
        with_, without, count = median([a for a, _ in pairs]), median([b for _, b in pairs]), len(pairs)
        met = ", ".join(f"process {m[0]} {m[1]:.3f} ms" for m in sorted(meetings))
        print(f"job {job + 1}: a step {without:.2f} ms without the hooks, {with_:.2f} ms with; of {count} pairs, the "
              f"median difference {difference:+.3f} ms, the median ratio {ratio:.4f} ({(ratio - 1) * 100:+.2f}%); "
              f"a meeting took (median) {met}", flush=True)
    differences = [a - b for a, b in EVERY_PAIR]
    mean = statistics.fmean(differences)
    error = statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else 0.0
    step = median([b for _, b in EVERY_PAIR])
    print(f"all {len(EVERY_PAIR)} pairs: a step {step:.2f} ms without the hooks; the median difference "
          f"{median(differences):+.3f} ms ({median(differences) / step * 100:+.2f}%), the mean {mean:+.3f} ms "
          f"+- {error:.3f} (one standard error: {mean / step * 100:+.2f}% +- {error / step * 100:.2f}%); the median "
          f"ratio {median([a / b for a, b in EVERY_PAIR]):.4f}")
    if SPANS:
        print(f"the first runs met on ({len(SPANS)}): from the last one's start to the later end of both, the "
              f"meeting and its bookkeeping in both processes, median {median(SPANS):.3f} ms, quartiles "
              f"{statistics.quantiles(SPANS, n=4)[0]:.3f}-{statistics.quantiles(SPANS, n=4)[2]:.3f} ms")
    store_calls()


if __name__ == "__main__":
    main()
