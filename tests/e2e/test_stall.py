"""The stall watchdog (``--stall-timeout``, docs/restarts.md "Hangs"), with
real JAX jobs, locally with the preloading server and over SSH on the
namespaced hosts (whose processes a host's own server starts).

Per place, up to five jobs run side by side:

- ``stuck``: process 1 of 3 sleeps in user code at step 5 of its first
  attempt while the others wait in the step's collective; the watchdog
  names it, its host and its line, and where the others wait, and
  ``--max-restarts 1`` resumes from the checkpoint and finishes with exit 0;
- ``calm``: everything a stall must never be taken for, in two jobs side
  by side, one thing after the other in each: ``work`` (a compile longer
  than the timeout, one program longer than it) and ``waits`` (a start-up
  longer than the timeout, steps that print nothing, an external tool that
  process 0 waits for, a helper thread of process 0's that computes in
  Python while its main thread waits, a long wait that says
  ``jaxrun.alive()``, then every process waits at one line outside JAX
  for its input pipeline's loader thread, which computes, and then for its
  checkpoint save's writer thread, which writes, each longer than the
  timeout: never parked (issue 71: a wait every process shares at one line
  is a stall only with no CPU and no I/O)): exit 0 for both, nothing warned
  of but JAX's shutdown on a loaded machine;
- ``parted``: examples/hang.py, whose processes issue their collectives in
  different orders, with ``--flight-recorder``: the watchdog stops it and
  the summary says where the processes parted;
- ``spin``: a hang as GPU jobs show it (NCCL's): at step 3 of its first
  attempt, process 1 of 3 starts two native threads that spin on
  ``sched_yield`` (tests/fixtures/spinner.py: no Python frame) and parks
  its main thread in ``threading.Event().wait()`` while the others wait in
  the step's collective.  The watchdog names it, its line, where the others
  wait and that its threads spun, within the timeout plus 5 s on jaxrun's
  record; the restart's process 1 starts its spinning threads at step 3
  too and goes on stepping with them to the end: never stopped, exit 0.

``spin`` runs in every place.  The default local mode runs ``stuck``,
``calm`` and ``spin`` again under CPU overload: a stall found, timed and
restarted under load, and slow work not taken for one (load is what makes slow
work look like a stall). ``parted`` says where the processes parted, which load
does not change. Of the local places, ``calm``, the longest job (even in two
halves side by side), runs there alone, and over SSH: an unloaded local run
would add only time, and so would one without preload: every process's sampler
starts at the script's first line, whichever way the process started, and until
a process has said anything it keeps the job from stalling
(jaxrun/launcher/attempt/activity.py), so the launch path cannot make slow work
look idle. Without preload, where the start decides whether the sampler and the
flight recorder's hook run at all, test_matrix.py's ``local`` cells find a
stuck, a spinning and a parked job, and test_divergence.py's both-mode tests
install the recorder's hook. The time from the stall's start to the end of the
stalled attempt, and to the restart's first step, are printed for the note
(``-s``).

At ``--stall-timeout 8`` (``LONG_TIMEOUT``), locally and over SSH, two more
jobs side by side: ``parked`` (issue 59), process 2 of 3 in ``while True:
time.sleep(1)``, whose looks never say working once it has waited, and whose
stall ends within the timeout plus 5 s of the park; and ``big`` (issue 61),
process 1 of 3 with 300 parked native threads, then the spin shape, named at
its line as soon (the launch path changes no thread); and ``alone`` (issue 71),
a one-process job parked in that loop (nobody to stand out from), stopped as
soon and named at its line.
"""

from __future__ import annotations

import contextlib
import json
import re
import textwrap

import pytest
from fixtures import spinner
from fixtures.jobs import EXAMPLES, ROOT, TOKEN, overload

TIMEOUT = 2.0  # --stall-timeout: every phase of the calm job lasts longer (LONG in the script: 1.5x; waits 2x)

STUCK = '''
import json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

state = sys.argv[1]
attempt = int(os.environ["JAXRUN_RESTART_COUNT"])
mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("i")))
checkpoint = os.path.join(state, "checkpoint")
start = int(open(checkpoint).read()) if os.path.exists(checkpoint) else 0
for step in range(start, 10):
    total = float(jnp.sum(x * step))  # a collective: every process takes part
    if step == start:
        print(f"attempt {attempt} first step {step} at {time.time()!r}", flush=True)
    if jax.process_index() == 0:
        with open(checkpoint + ".new", "w") as f:
            f.write(str(step + 1))
        os.replace(checkpoint + ".new", checkpoint)
    if step == 5 and attempt == 0 and jax.process_index() == 1:
        print(f"stuck at {time.time()!r}", flush=True)
        time.sleep(600)  # alive, and stuck
print("done", total)
'''

SPIN = '''
import ctypes, os, sys, threading, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

library = sys.argv[1]
attempt = int(os.environ["JAXRUN_RESTART_COUNT"])
mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("i")))


def prepare(seconds):  # a step's own work in Python, between its collectives
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        n += sum(range(100))


for step in range(200):  # 200 steps of 20 ms or more: longer than twice the timeout
    total = float(jnp.sum(x * step))  # a collective: every process takes part
    if step == 3 and jax.process_index() == 1:
        spinning = ctypes.CDLL(library).spin_start(2)  # native threads in a busy wait, as NCCL's
        print(f"attempt {attempt}: {spinning} threads spin from {time.time()!r}", flush=True)
        if attempt == 0:
            threading.Event().wait()  # parked, while its threads spin
    prepare(0.02)
print("done", total)
'''

CALM = '''
import os, queue, subprocess, sys, threading, time
import jax, jax.numpy as jnp, numpy as np
import jaxrun

T = float(os.environ["JAXRUN_STALL_TIMEOUT"])
LONG = 1.5 * T  # a phase that computes: longer than the timeout (twice it, before: a third more of the suite's CPU)
rank = int(os.environ["JAXRUN_PROCESS_ID"])
part = sys.argv[1]  # "work" (long JAX work) or "waits" (a slow start, quiet steps, waits in one process, in all)


def python_work(seconds):  # a start-up: data loading in pure Python, before the first step
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        n += sum(range(1000))


if part == "waits":
    python_work(LONG)
mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 8), np.float32), jax.sharding.NamedSharding(mesh, jax.P("i")))
total = jax.jit(lambda x: jnp.sum(jnp.tanh(x)))
float(total(x))


def chain(x):  # a program whose compile takes longer than the timeout
    for i in range(5000):
        x = jnp.sin(x) if i % 2 else jnp.cos(x)
    return jnp.sum(x)


def work():
    t = time.monotonic()
    compiled = jax.jit(chain).lower(x).compile()
    print(f"compile {time.monotonic() - t:.1f} s", flush=True)
    float(compiled(x))

    # One program longer than the timeout, in every process.
    long = jax.jit(lambda y, n: jax.lax.fori_loop(0, n, lambda i, y: jnp.tanh(y @ y), y))
    y = jnp.ones((256, 256), jnp.float32)
    long(y, 10).block_until_ready()
    t = time.monotonic()
    long(y, 100).block_until_ready()
    n = int(100 * LONG / max(time.monotonic() - t, 1e-3))
    took = 0.0
    while took < 1.25 * T:  # a machine whose load changed may make it short: longer, then
        t = time.monotonic()
        long(y, n).block_until_ready()
        took, n = time.monotonic() - t, 2 * n
    print(f"one program {took:.1f} s", flush=True)


def input_pipeline():  # every process waits here, outside JAX, for a batch its loader computes
    batches = queue.Queue()
    threading.Thread(target=lambda: (python_work(LONG), batches.put("batch")), daemon=True).start()
    return batches.get()


def save_checkpoint():  # every process waits here, outside JAX, for its save's writer thread, which writes
    def write(path, block=bytes(1 << 20)):
        end = time.monotonic() + 2.5 * T
        with open(path, "wb") as f:
            while time.monotonic() < end:  # 20 MB/s, a few % of a core
                f.seek(0)
                f.write(block)
                f.flush()
                time.sleep(0.05)
        os.remove(path)

    writer = threading.Thread(target=write, args=(f"{sys.argv[2]}-save-{rank}",))
    writer.start()
    writer.join()


def waits():
    # Steps that print nothing, for longer than the timeout: each process's own (no
    # collective, so that the processes may run different numbers of them).
    step = jax.jit(lambda y: jnp.sum(jnp.tanh(y @ y)))
    y = jnp.ones((256, 256), jnp.float32)
    end = time.monotonic() + LONG
    while time.monotonic() < end:
        float(step(y))

    # Process 0 waits for an external tool; the others wait for it in a collective.
    if rank == 0:
        subprocess.run([sys.executable, "-c", f"import time\\nend = time.monotonic() + {LONG}\\n"
                        "while time.monotonic() < end: pass"], check=True)
    float(total(x))

    # Process 0's main thread waits for a helper thread of its own that computes
    # in Python; the others wait for it in a collective.
    if rank == 0:
        helper = threading.Thread(target=python_work, args=(LONG,))
        helper.start()
        threading.Event().wait(LONG)
        helper.join()
    float(total(x))

    # Process 1 waits in one call that shows nothing, and says it is alive.
    if rank == 1:
        done = threading.Event()

        def beat():
            while not done.wait(0.1):
                jaxrun.alive()

        threading.Thread(target=beat, daemon=True).start()
        threading.Event().wait(2 * T)
        done.set()
    float(total(x))

    input_pipeline()
    save_checkpoint()


work() if part == "work" else waits()
float(total(x))
print("calm done", flush=True)
'''
# The calm job's two halves run side by side (the whole was the place's
# longest job, 40-50 s on a loaded 2-core machine): "work" holds the compile
# (3 s of CPU a process, 10-20 s of a loaded machine's time) and the long
# program; "waits" the slow start-up, the quiet steps, the waits of one
# process and then every process's (12 timeouts in all).
CALM_PARTS = ("work", "waits")


def took(report_path) -> str:
    """The seconds from the first attempt's start to the last process's end, for the note."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        report = json.loads(report_path.read_text())
        ends = [p["ended_at"] for a in report["attempts"] for p in a["processes"] if p.get("ended_at")]
        return f"{max(ends) - report['attempts'][0]['began_at']:.1f} s"
    return "?"


def line_of(text: str, needle: str) -> int:
    return 1 + next(i for i, line in enumerate(text.splitlines()) if needle in line)


@pytest.fixture(params=["preload", "ssh", "loaded"])
def place(request, monkeypatch, tmp_path):
    """(n -> the flags that start n processes there, a folder every host
    sees, where process 1 of 3 runs, the jobs that run there).  ``loaded``:
    the default local mode with a CPU burner per core beside the jobs, as on
    a shared CI machine."""
    if request.param == "ssh":
        hosts = request.getfixturevalue("sshd_hosts")
        common = ["--ssh-config", hosts.config, "--env", f"PYTHONPATH={ROOT}", "-x", TOKEN]
        spread = {2: "hostA,hostB", 3: "hostA:1,hostB:2", 4: "hostA:2,hostB:2"}
        yield (lambda n: ["-H", spread[n], *common]), request.getfixturevalue("shared_dir"), " on hostB", \
            {"stuck", "calm", "parted", "spin"}
        return
    monkeypatch.delenv("JAXRUN_NO_PRELOAD", raising=False)
    with overload() if request.param == "loaded" else contextlib.nullcontext():
        yield (lambda n: ["-n", n]), tmp_path, "", {"stuck", "calm", "spin"} if request.param == "loaded" else \
            {"stuck", "parted", "spin"}


@pytest.mark.timeout(300)
def test_stalls_are_found_and_never_taken_for_slow_work(place, start_job, tmp_path, request):
    where, folder, host1, runs = place
    jobs = {}
    script = folder / "stuck.py"
    script.write_text(textwrap.dedent(STUCK))
    state = folder / "stuck-state"
    state.mkdir()
    jobs["stuck"] = start_job(*where(3), "--cpu-devices", 1, "--stall-timeout", TIMEOUT, "--max-restarts", 1,
                              "--report", tmp_path / "stuck.json", "--log-dir", tmp_path / "stuck-logs", script, state)
    if "calm" in runs:
        script = folder / "calm.py"
        script.write_text(textwrap.dedent(CALM))
        for part in CALM_PARTS:
            jobs[f"calm-{part}"] = start_job(*where(2), "--cpu-devices", 1, "--stall-timeout", TIMEOUT,
                                             "--report", tmp_path / f"calm-{part}.json", "--log-dir",
                                             tmp_path / f"calm-{part}-logs", script, part, folder / "calm")
    if "spin" in runs:
        script = folder / "spin.py"
        script.write_text(textwrap.dedent(SPIN))
        jobs["spin"] = start_job(*where(3), "--cpu-devices", 1, "--stall-timeout", TIMEOUT, "--max-restarts", 1,
                                 "--report", tmp_path / "spin.json", "--log-dir", tmp_path / "spin-logs", script,
                                 spinner.build(folder))
    if "parted" in runs:
        hang = folder / "hang.py"  # where every host finds it
        hang.write_text((EXAMPLES / "hang.py").read_text())
        jobs["parted"] = start_job(*where(4), "--cpu-devices", 2, "--stall-timeout", TIMEOUT, "--flight-recorder",
                                   "--report", tmp_path / "parted.json", hang)
    codes = {name: job.wait(timeout=200) for name, job in jobs.items()}
    print("each job's attempts, began to ended on jaxrun's record:",
          ", ".join(f"{name} {took(tmp_path / f'{name}.json')}" for name in jobs))

    # -- stuck: named, stopped, restarted from the checkpoint --------------------------
    job = jobs["stuck"]
    assert codes["stuck"] == 0, job.stderr
    script = folder / "stuck.py"
    sleeping, waiting = line_of(STUCK, "time.sleep(600)"), line_of(STUCK, "total = float(")
    assert re.search(rf"^jaxrun: the job stalled: no process made progress for {TIMEOUT:g} s", job.stderr, re.M)
    said = (f"jaxrun:   process 1{host1} stands out, at {script}:{sleeping} in <module>: time.sleep(600)"
            f"  # alive, and stuck; processes 0, 2 wait at {script}:{waiting} in <module>: ")
    assert said in job.stderr, job.stderr
    assert "jaxrun: restarting the whole job (restart 1 of 1)" in job.stderr
    report = json.loads((tmp_path / "stuck.json").read_text())
    first, second = report["attempts"]
    assert first["exit_code"] == 125 and first["stop_reason"] == "stall"
    cause = first["root_cause"]
    assert (cause["kind"], cause["process_id"], cause["at"]) == ("stall", 1, f"{script}:{sleeping}"), cause
    assert [g["process_ids"] for g in cause["stall"]["stand_out"]] == [[1]]
    assert cause["stall"]["waiting"]["process_ids"] == [0, 2]
    assert second["exit_code"] == 0 and report["exit_code"] == 0
    assert "[0] attempt 1 first step 6 at" in job.stdout  # resumed from the checkpoint
    assert job.stdout.count("done 108.0") == 3, job.stdout
    stuck_at = float(re.search(r"\[1\] stuck at ([\d.]+)", job.stdout)[1])
    resumed_at = float(re.search(r"\[0\] attempt 1 first step 6 at ([\d.]+)", job.stdout)[1])
    ended_at = max(p["ended_at"] for p in first["processes"])
    print(f"stall start -> attempt end {ended_at - stuck_at:.1f} s, -> restart's first step "
          f"{resumed_at - stuck_at:.1f} s (--stall-timeout {TIMEOUT:g})")
    # Timed on jaxrun's record (the report's ended_at) from the job's own
    # note: 4.4-4.5 s unloaded (the timeout, a tenth of it to notice, the
    # dumps (3 s at most), the stop).  The bound holds a second look (dumps that
    # come late on a loaded machine are not taken for a stall: 3.5 s more)
    # and four times the rest, for the burners of the loaded place.
    assert TIMEOUT < ended_at - stuck_at < TIMEOUT + 15

    # -- calm: nothing taken for a stall; the shared wait warned of ------------------
    if "calm" in runs:
        warned = re.compile(r"^jaxrun: no process has made progress for .*$", re.M)
        # A loaded machine may also take longer than the timeout for JAX's
        # shutdown, where every process waits too: that is warned of alike.
        at_exit = "every process waits at JAX's shutdown, past the end of the script"
        for part in CALM_PARTS:
            job = jobs[f"calm-{part}"]
            assert codes[f"calm-{part}"] == 0, job.stderr
            assert "stalled" not in job.stderr, job.stderr
            assert job.stdout.count("calm done") == 2, job.stdout
        work, waits = jobs["calm-work"], jobs["calm-waits"]
        compile_s = float(re.search(r"compile ([\d.]+) s", work.stdout)[1])
        program_s = float(re.search(r"one program ([\d.]+) s", work.stdout)[1])
        print(f"calm: compile {compile_s:.1f} s, one program {program_s:.1f} s")
        assert compile_s > TIMEOUT and program_s > TIMEOUT, work.stdout  # the phases did outlast the timeout
        assert all(at_exit in w for w in warned.findall(work.stderr)), work.stderr
        # The pipeline computes and the save writes: neither is a wait, not even warned of.
        assert all(at_exit in w for w in warned.findall(waits.stderr)), waits.stderr

    # -- spin: native threads spin, the main thread parked: named; stepping: never stopped --
    if "spin" in runs:
        job = jobs["spin"]
        assert codes["spin"] == 0, job.stderr
        script = folder / "spin.py"
        parked, waiting = line_of(SPIN, "threading.Event().wait()"), line_of(SPIN, "total = float(")
        said = (f"jaxrun:   process 1{host1} stands out, at {script}:{parked} in <module>: threading.Event().wait()"
                f"  # parked, while its threads spin (its Python stood still while ")
        assert said in job.stderr, job.stderr
        # On a machine loaded enough, the spinning threads get next to no CPU (CI: the job's
        # 3 processes used 0.9 CPU seconds in all): they are seen spinning by the kernel's
        # preemptions, and the line says the load starved them.
        assert re.search(r"stood still while [12] of its own threads spun, (?:[\d.]+ cores of CPU|starved of CPU by "
                         r"the machine's load)\); processes 0, 2 wait "
                         rf"at {re.escape(str(script))}:{waiting} in <module>: ", job.stderr), job.stderr
        report = json.loads((tmp_path / "spin.json").read_text())
        first, second = report["attempts"]
        assert first["exit_code"] == 125 and first["stop_reason"] == "stall"
        cause = first["root_cause"]
        assert (cause["kind"], cause["process_id"], cause["at"]) == ("stall", 1, f"{script}:{parked}"), cause
        assert cause["stall"]["waiting"]["process_ids"] == [0, 2]
        spun = cause["stall"]["spinning"]
        assert [s["process_id"] for s in spun] == [1], spun
        # Cores of CPU where the threads got some; next to none said as the load's doing.
        assert spun[0]["cores"] > 0 or "spun, starved of CPU by the machine's load" in job.stderr, (spun, job.stderr)
        # Each of the 2 threads is counted when it got 5% of a core, or was preempted
        # again and again without sleeping: on a machine that another pytest worker
        # loads (the "loaded" place beside this one), one may show neither at the looks
        # that counted.
        assert spun[0]["threads"] in (1, 2), spun
        # The restart's process 1 spins from step 3 on and steps to the end: never taken for a stall.
        assert second["exit_code"] == 0 and report["exit_code"] == 0, report
        assert "[1] attempt 1: 2 threads spin from" in job.stdout and job.stdout.count("] done ") == 3, job.stdout
        spun_at = float(re.search(r"\[1\] attempt 0: 2 threads spin from ([\d.]+)", job.stdout)[1])
        ended_at = max(p["ended_at"] for p in first["processes"])
        print(f"spin: parked -> attempt end {ended_at - spun_at:.1f} s (--stall-timeout {TIMEOUT:g})")
        # Timed on jaxrun's record, as stuck's: the timeout, a look or two to
        # see the threads spin (a tenth of it each), the dumps (3 s at most), the stop.
        # Beside the burners, with the calm jobs compiling, the stop alone took
        # 3.5 s from SIGKILL to the reaped end (seen): twice the rest there.
        # A dump that looked like progress cost a whole probe (9.1 s, CI):
        # tests/unit/test_stall.py holds that one exactly.
        loaded = request.node.callspec.params.get("place") == "loaded"
        assert TIMEOUT < ended_at - spun_at < TIMEOUT + (10 if loaded else 5)

    # -- parted: the processes' collectives in different orders ----------------------
    if "parted" in runs:
        job = jobs["parted"]
        assert codes["parted"] == 125, job.stderr
        assert "jaxrun: the job stalled" in job.stderr
        assert re.search(r"^jaxrun:   process 2( on hostB)? stands out, at \S+hang.py:\d+ in check_config",
                         job.stderr, re.M), job.stderr
        assert re.search(r"^jaxrun: the processes parted at call \d+: ", job.stderr, re.M), job.stderr


# -- at --stall-timeout 8: a parked process, and a hang on a host with 300 threads -------------

LONG_TIMEOUT = 8.0  # the issues' own: long enough for Python 3.11 to warm a parked loop up

PARKED = '''
import time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("i")))
for step in range(200):
    total = float(jnp.sum(x * step))  # a collective: every process takes part
    if step == 3 and jax.process_index() == 2:
        print(f"parked at {time.time()!r}", flush=True)
        while True:
            time.sleep(1)  # alive, outside the collective
print("done", total)
'''

BIG_HOST = '''
import ctypes, os, sys, threading, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

library = ctypes.CDLL(sys.argv[1])
mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("i")))
if jax.process_index() == 1:
    library.park_start(300)  # a large host's XLA and NCCL pools: parked native threads
for step in range(200):
    total = float(jnp.sum(x * step))  # a collective: every process takes part
    if step == 3 and jax.process_index() == 1:
        library.spin_start(2)  # native threads in a busy wait, as NCCL's
        print(f"{len(os.listdir('/proc/self/task'))} threads, 2 spin from {time.time()!r}", flush=True)
        threading.Event().wait()  # parked, while its threads spin
    time.sleep(0.02)
print("done", total)
'''


ALONE = '''
import time
import jax, jax.numpy as jnp

print(float(jnp.sum(jnp.ones(4))), f"parked at {time.time()!r}", flush=True)
while True:
    time.sleep(1)  # the only process, parked outside JAX
'''


@pytest.fixture(params=["preload", "ssh"])
def long_place(request, monkeypatch, tmp_path):
    """(the flags that start 3 processes there, a folder every host sees,
    where process 1 runs, where process 2 runs, whether the big host's job
    runs there)."""
    if request.param == "ssh":
        hosts = request.getfixturevalue("sshd_hosts")
        flags = ["-H", "hostA:1,hostB:2", "--ssh-config", hosts.config, "--env", f"PYTHONPATH={ROOT}", "-x", TOKEN]
        yield flags, request.getfixturevalue("shared_dir"), " on hostB", " on hostB", True
        return
    monkeypatch.delenv("JAXRUN_NO_PRELOAD", raising=False)
    yield ["-n", 3], tmp_path, "", "", True


def states_of(timeline, rank: int, since: float) -> list[tuple[float, str]]:
    """(seconds after ``since``, state) of each state the launcher heard of ``rank`` from then on."""
    events = (json.loads(line) for line in timeline.read_text().splitlines())
    return [(e["t"] - since, e["state"]) for e in events
            if e.get("event") == "state" and e.get("rank") == rank and e["t"] >= since]


@pytest.mark.timeout(200)
def test_a_parked_process_never_looks_working_and_a_hang_among_300_threads_is_found(long_place, start_job,
                                                                                     tmp_path):
    """Issue 59: a process parked in ``while True: time.sleep(1)`` said
    ``working`` once, 4-5 s after it parked (Python 3.11 specialized the
    loop's call, and the frame's instruction moved from CALL to PRECALL),
    and the stall ended a quarter-timeout late.  Issue 61: a process with
    300 native threads looked busy at every look, its sampler's own reads
    of /proc counted as its I/O, and its hang was never found."""
    flags, folder, host1, host2, big = long_place
    parked_script, big_script = folder / "parked.py", folder / "big_host.py"
    parked_script.write_text(textwrap.dedent(PARKED))
    jobs = {"parked": start_job(*flags, "--cpu-devices", 1, "--stall-timeout", LONG_TIMEOUT, "--report",
                                tmp_path / "parked.json", "--log-dir", tmp_path / "parked-logs", parked_script)}
    alone_script = folder / "alone.py"
    alone_script.write_text(textwrap.dedent(ALONE))
    one = ["-H", "hostB:1", *flags[2:]] if flags[0] == "-H" else ["-n", 1]
    jobs["alone"] = start_job(*one, "--stall-timeout", LONG_TIMEOUT, "--report", tmp_path / "alone.json",
                              alone_script)
    if big:
        big_script.write_text(textwrap.dedent(BIG_HOST))
        jobs["big"] = start_job(*flags, "--cpu-devices", 1, "--stall-timeout", LONG_TIMEOUT, "--report",
                                tmp_path / "big.json", "--log-dir", tmp_path / "big-logs", big_script,
                                spinner.build(folder))
    # Each stalls within 10 s of its start and ends within the timeout plus
    # 5 s of it: one that runs on for 60 s was not found at all (issue 61's
    # big host, before the change).
    job = jobs["parked"]
    assert job.wait(timeout=60) == 125, job.stderr
    sleeping = line_of(PARKED, "time.sleep(1)")
    assert f"process 2{host2} stands out, at {parked_script}:{sleeping} in <module>: time.sleep(1)" in job.stderr, \
        job.stderr
    parked_at = float(re.search(r"\[2\] parked at ([\d.]+)", job.stdout)[1])
    heard = states_of(tmp_path / "parked-logs" / "timeline.jsonl", 2, parked_at)
    report = json.loads((tmp_path / "parked.json").read_text())
    ended_at = max(p["ended_at"] for p in report["attempts"][0]["processes"])
    print(f"parked: process 2's states after it parked {[(round(t, 1), s) for t, s in heard]}; "
          f"parked -> attempt end {ended_at - parked_at:.1f} s (--stall-timeout {LONG_TIMEOUT:g})")
    # The first look after the park may still see the move from the step's
    # line to the sleep (it was working then); from its first wait on, never again.
    states = [s for _, s in heard]
    assert "waiting" in states, heard
    assert "working" not in states[states.index("waiting"):], heard
    # On jaxrun's own record: the timeout, one or two looks (0.8 s each) to
    # see the park, the dumps (3 s at most), the stop; the blip made it 13.6 s.
    assert LONG_TIMEOUT < ended_at - parked_at < LONG_TIMEOUT + 5

    # -- alone: one process parked outside JAX, no CPU, no I/O (issue 71: warned of every 8 s, forever) --
    job = jobs["alone"]
    assert job.wait(timeout=60) == 125, job.stderr
    sleeping = line_of(ALONE, "time.sleep(1)")
    assert re.search(rf"^jaxrun:   process 0{host2} stands still at {re.escape(str(alone_script))}:{sleeping} in "
                     r"<module>: time.sleep\(1\)  # the only process, parked outside JAX, parked outside JAX with no "
                     r"CPU and no I/O$", job.stderr, re.M), job.stderr
    parked_at = float(re.search(r"4.0 parked at ([\d.]+)", job.stdout)[1])
    report = json.loads((tmp_path / "alone.json").read_text())
    assert report["attempts"][0]["root_cause"]["at"] == f"{alone_script}:{sleeping}"
    ended_at = max(p["ended_at"] for p in report["attempts"][0]["processes"])
    print(f"alone: parked -> attempt end {ended_at - parked_at:.1f} s (--stall-timeout {LONG_TIMEOUT:g})")
    assert LONG_TIMEOUT < ended_at - parked_at < LONG_TIMEOUT + 5  # as the parked job's

    if big:
        job = jobs["big"]
        assert job.wait(timeout=60) == 125, job.stderr
        parked = line_of(BIG_HOST, "threading.Event().wait()")
        said = (f"process 1{host1} stands out, at {big_script}:{parked} in <module>: threading.Event().wait()"
                f"  # parked, while its threads spin (its Python stood still while ")
        assert said in job.stderr, job.stderr
        threads, spun_at = re.search(r"\[1\] (\d+) threads, 2 spin from ([\d.]+)", job.stdout).groups()
        assert int(threads) > 300, job.stdout
        report = json.loads((tmp_path / "big.json").read_text())
        cause = report["attempts"][0]["root_cause"]
        assert (cause["kind"], cause["process_id"], cause["at"]) == ("stall", 1, f"{big_script}:{parked}"), cause
        ended_at = max(p["ended_at"] for p in report["attempts"][0]["processes"])
        print(f"big host: {threads} threads; spin -> attempt end {ended_at - float(spun_at):.1f} s")
        assert LONG_TIMEOUT < ended_at - float(spun_at) < LONG_TIMEOUT + 5
