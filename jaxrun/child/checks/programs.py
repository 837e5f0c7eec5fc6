"""Child side of ``--checks``: programs that span processes agree, checked
when each process first runs them (a compile alone is no run).

The guide's parted program (three processes run ``x @ y``, the last
``y @ x``) hangs in a collective that never matches, and a stack dump names
where each process waits, not where they parted.  So every process
describes each executable whose devices belong to more than one process
the moment it gets it: ``pxla.UnloadedMeshExecutable.from_hlo``, which every
``jax.jit`` call, eager operation and ``.lower().compile()`` passes through
once per program, whether XLA compiles it or the persistent compile cache
hands it back (so a warm host and a cold spare count alike).  Nothing is
posted then: a process may compile ahead a program it runs later, or never
(for its cost analysis, a warm-up, a thread pool's compiles in whatever
order).  The program counts at its first run: ``ExecuteReplicated.__call__``,
which every first execution passes through (JAX's C++ fast path takes only
calls whose first run in Python handed it the executable), asks ``ran``
whether the executable is one not run yet (one dictionary lookup), and
there the program is posted and met on (``checks.meeting``: its group comes
to it before it runs).  The post waits on the board for the meeting, ``HOLD``
seconds at most: where every process came with the same body, the meeting
compared all the post would, and the post is taken back unpublished; where
the meeting takes longer (a slow peer, or programs that differ: they meet
apart), it is published and judged.  Later executions are never seen: the fast path stays
on, and the cost is one print and hash of the module per program, next to
its compile, and the meeting at its first run.

Only a program whose compiled HLO holds a collective counts: one without
(a replicated mean that process 0 alone computes to log it) makes no
process wait for another, whichever ran it.  What can make processes wait
for each other is compared: the program's collectives in order, each with
its kind, shapes, replica groups and dimensions, and the devices the
program spans (``collectives_of``, hashed with the device ids).  The body
(the module as lowered, printed without source locations and without its
name, so the same program run at another line or from a checkout at
another path agrees) is compared too, but a body that differs where the
collectives agree (a per-process constant baked in, a local operation)
cannot make processes wait: one warning, and ``--checks strict`` stops.

Where programs are counted depends on who runs them.  The main thread runs
its programs in the script's order: each process counts their first runs
per group of processes (the processes whose devices the program uses: a
mesh over a subset compares among those only) and posts the k-th on the
board (:mod:`jaxrun.child.checks.agreement`) under ``programs/{group}/m/{k}``;
processes whose k-th programs' collectives differ would wait for each other
in different collectives, and the job stops.  Any other thread (a
background saver) runs them in an order its scheduling decides, so a
position there means nothing: such a program is keyed by what it is, its
line, function, inputs, shardings and collectives
(``programs/{group}/t{key}/{n}``), and only its body is compared, where the
key is unambiguous (each process ran one program under it).  A program
this process already posted under its key is not counted again.

On a difference in the collectives every process that sees it stops with a
``ProgramMismatchError`` naming each side's function, inputs, what differs
and line, the odd side first; the odd side stops at once, the others
``LATER`` seconds after, if fail-fast has not ended them by then, so that
the summary's "failed first" is the odd one out.  The board's own thread's
programs are not counted.  In a process started again alone (a recoverable
job) nothing is posted or met on: its peers are past its positions.

Known limits: a process that runs a program it already ran while another
runs a new one makes no new entry, so the difference is not found by
position (the parting check and ``--check-divergence`` remain for it);
programs run off the main thread whose collectives differ are not paired
(nothing says which of them stand for each other); ``pmap``'s programs are
not seen.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time
import weakref

from jaxrun import contract
from jaxrun.child import ending
from jaxrun.child.checks import agreement, meeting
from jaxrun.child.checks.program_text import (
    collectives_key,
    collectives_of,
    collectives_text,
    describe,
    fingerprint,
    function_name,
    group_text,
    inputs_text,
    made,
    program_hash,
    same_collectives,
    same_program,
    shardings_text,
    sides_of,
    thread_key,
    who,
)
from jaxrun.child.watch import backlog

# (module, attribute path) of the name where every program is made, which the check wraps ...
HOOK_POINT = ("jax._src.interpreters.pxla", "UnloadedMeshExecutable.from_hlo")
# ... and the one every first execution passes through (``checks.meeting``).
RUN_POINT = ("jax._src.interpreters.pxla", "ExecuteReplicated.__call__")
TESTED_JAX = ("0.10.2",)
LATER = 5.0  # seconds the larger side waits before it stops too
HOLD = 0.5  # seconds a first run's post waits for its meeting before the board publishes it


class ProgramMismatchError(RuntimeError):
    """Processes got different programs at the same position."""


def install(board, strict: bool) -> Programs | None:
    """Wrap ``from_hlo`` and the first runs (jax is loaded: ``checks`` calls this from its
    import hook); the check, where it runs."""
    jax_module = sys.modules["jax"]
    target, run = _hook_target(sys.modules, HOOK_POINT), _hook_target(sys.modules, RUN_POINT)
    if target is None or run is None:
        _unavailable(jax_module, board.rank, strict, HOOK_POINT if target is None else RUN_POINT)
        return
    if os.environ.get(contract.PROCESS_RESTARTS, "0") not in ("", "0"):
        return  # started again alone: its peers' positions are past its own
    from jaxrun.child.checks import flight

    locator = flight.Flight(board.rank, board.count, 0, None)  # its user_frame: the user's line
    locator.describe_paths(jax_module)
    checker = Programs(board, locator, strict, meeting.Meetings())
    # Its arguments by name, as Signature.bind's ``arguments`` has them (those given),
    # paired by hand: bind took 28 us of a new program's first run on a loaded machine.
    real, names = target, tuple(inspect.signature(target).parameters)

    def from_hlo(*args, **kwargs):
        executable = real(*args, **kwargs)
        try:
            given = dict(zip(names, args))
            given.update(kwargs)
            checker.got(given, executable)
        except Exception as e:  # noqa: BLE001 - a check that cannot read the program stays silent
            if os.environ.get(contract.VERBOSE) == "1":
                print(f"jaxrun: --checks could not read a program: {type(e).__name__}: {e}", file=sys.stderr)
        return executable

    pending, first_run = checker.pending, checker.ran

    def __call__(self, *args):
        if id(self.xla_executable) in pending:  # its first run: the rest never come here (C++'s fast path)
            first_run(self.xla_executable)
        return run(self, *args)

    pxla = sys.modules[HOOK_POINT[0]]
    pxla.UnloadedMeshExecutable.from_hlo = staticmethod(from_hlo)
    pxla.ExecuteReplicated.__call__ = __call__
    return checker


def _hook_target(modules, point):
    module = modules.get(point[0])
    target = module
    for part in point[1].split("."):
        target = getattr(target, part, None)
    return target if callable(target) else None


def _unavailable(jax_module, rank: int, strict: bool, point) -> None:
    version = getattr(jax_module, "__version__", "of unknown version")
    where = f"{point[0]}.{point[1]}"
    if strict:
        ending.fail(RuntimeError(f"--checks strict cannot compare programs on jax {version}: {where} not found "
                                 f"(tested with jax {', '.join(TESTED_JAX)}); run with --checks on or off"))
    if rank == 0:
        print(f"jaxrun: --checks: programs are not compared on jax {version}: {where} not found "
              f"(tested with jax {', '.join(TESTED_JAX)})", file=sys.stderr)


class Made:
    """A program made and not yet run: what its first run posts and meets on."""

    def __init__(self, owner, entry: dict | None, ranks: list[int], devices):
        self.owner = weakref.ref(owner)  # what from_hlo made (the executable itself takes no weak reference)
        self.entry, self.ranks, self.devices = entry, ranks, devices  # entry None: it makes no one wait
        self.lock = threading.Lock()
        self.done = False


class Programs:
    """This process's programs that span processes, as each first runs:
    counted per group (the main thread's) or keyed by what they are (other
    threads'), posted once each, and met on (``checks.meeting``)."""

    def __init__(self, board, locator, strict: bool = False, meetings=None):
        self.board, self.locator, self.strict = board, locator, strict
        self.counts: dict[str, int] = {}  # group/m, or group/t{key} -> programs posted
        self.seen: set[tuple[str, str]] = set()
        self.warned = False  # a body that differs is said once per process
        self.lock = threading.Lock()
        self.parting = None  # the parting check (checks.parting), told each program's line
        self.meetings = meetings  # where a first run waits for its peers (checks.meeting)
        self.pending: dict[int, Made] = {}  # id(xla_executable) -> the program made and not run yet

    def got(self, given: dict, executable) -> None:
        """``given``: from_hlo's arguments by name; ``executable``: what it made.
        Only described here: a compile is no run (it may never run)."""
        if threading.current_thread().name in (agreement.THREAD, backlog.THREAD):
            return  # a check's own program (the replicas' checksum), the account's probe: no user's position
        devices = given.get("device_list") or ()
        ranks = sorted({d.process_index for d in devices})
        entry = None
        if len(ranks) >= 2 and self.board.rank in ranks:  # else process-local: nothing another must match
            collectives = collectives_of(executable)
            if collectives:  # else no process waits for another in it (process 0 alone logs a replicated mean)
                entry = {"h": fingerprint(given["hlo"]),
                         "c": program_hash(collectives_key(collectives, devices)),
                         "cs": collectives_text(collectives), "fn": function_name(given.get("name", "")),
                         "in": inputs_text(given.get("global_in_avals")),
                         "sh": shardings_text(given.get("in_shardings"))}
        key, pending = id(executable.xla_executable), self.pending
        made = Made(executable, entry, ranks, devices)

        def forget(ref, key=key):
            if getattr(pending.get(key), "owner", None) is ref:
                pending.pop(key, None)

        made.owner = weakref.ref(executable, forget)
        pending[key] = made

    def ran(self, xla_executable) -> None:
        """A program's first run, before it runs: its line, its post, its meeting."""
        made = self.pending.get(id(xla_executable))
        if made is None:
            return
        with made.lock:
            if made.done:
                return
            try:
                owner = made.owner()
                if owner is not None and owner.xla_executable is xla_executable:
                    self._first_run(made)
            except Exception as e:  # noqa: BLE001 - as from_hlo's: a check that cannot read the program stays silent
                if os.environ.get(contract.VERBOSE) == "1":
                    print(f"jaxrun: --checks could not read a first run: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                made.done = True
                if self.pending.get(id(xla_executable)) is made:
                    del self.pending[id(xla_executable)]

    def _first_run(self, made: Made) -> None:
        file, line = self.locator.user_frame(sys._getframe(2))
        at = f"{file}:{line}"
        if made.entry is None:
            if self.parting is not None:  # a line whose program makes no process wait for another
                self.parting.made(at, [], "", made.devices)
            return
        entry, ranks = dict(made.entry, at=at), made.ranks
        group = group_text(ranks)
        if self.parting is not None:
            self.parting.made(at, ranks, entry["fn"], made.devices)
        main = threading.current_thread() is threading.main_thread()
        key = f"{group}/m" if main else f"{group}/t{program_hash(thread_key(entry))}"
        posted, post = False, None
        with self.lock:
            if (key, entry["h"]) not in self.seen:
                self.seen.add((key, entry["h"]))
                k = self.counts[key] = self.counts.get(key, 0) + 1
                posted = True
        if posted:
            if not main:
                entry["n"] = k  # more than 1: this key is ambiguous here, its bodies not paired
            same = (same_program if self.strict else same_collectives) if main else \
                (same_program if self.strict else None)
            # Held while the meeting runs: where every process comes with this body, the
            # post is taken back unpublished (the meeting compared all the post would).
            post = self.board.post(f"programs/{key}/{k}", entry, ranks,
                                   self.settled(k if main else 0, group, ranks, key), same=same,
                                   hold=HOLD if self.meetings is not None else 0.0)
        alike = self.meetings is not None and self.meetings.meet(entry, ranks, main)
        # Met with every body alike: nothing left for the post to compare.  Else (a body
        # of its own somewhere, a program met on before, no store) it goes out now.
        if post is not None and alike:
            self.board.withdraw(post)
        elif post is not None:
            self.board.release(post)

    def settled(self, k: int, group: str, ranks: list[int], key: str = ""):
        """The judge of program ``k`` of ``group`` (0: one run off the main thread)."""
        rank = self.board.rank

        def judge(topic: str, entries: dict, gone: set) -> None:
            del topic
            sides = sides_of(entries, "c")
            if len(sides) < 2:
                sides = sides_of(entries, 'h')
                if len(sides) < 2 or self._ambiguous(key, entries):
                    if gone and self.parting is not None:  # a rank finished without it: the parting check's
                        self.parting.unmet(entries, ranks, gone)
                    return  # agreed
                if not self.strict:
                    self._warn(k, group, entries, sides)
                    return
            headline, lines = describe(k, group, entries, gone, ranks)
            if rank not in sides[0]:
                time.sleep(LATER)  # the odd side stops first: the summary names it
            agreement.stop(ProgramMismatchError(headline), lines)

        return judge

    def _ambiguous(self, key: str, entries: dict) -> bool:
        """Off the main thread, a key under which some process made more than
        one program: which of them stand for each other, thread order decided."""
        if "/t" not in key:
            return False
        with self.lock:
            mine = self.counts.get(key, 0)
        return mine > 1 or any(e.get("n", 1) > 1 for e in entries.values())

    def _warn(self, k: int, group: str, entries: dict, sides: list[list[int]]) -> None:
        if self.warned:
            return
        self.warned = True
        what = f"program {k} of processes {group}" if k else f"a program of processes {group} run off the main thread"
        print(f"jaxrun: warning: {what} differs in its body only, not in its collectives (a per-process "
              "constant, a local operation): " + "; ".join(f"{who(side)} made {made(entries[side[0]])} "
                                                           f"[program {entries[side[0]].get('h')}]"
                                                           for side in sides)
              + "; the processes do not wait on it differently, so the job goes on (--checks strict stops it)",
              file=sys.stderr, flush=True)
