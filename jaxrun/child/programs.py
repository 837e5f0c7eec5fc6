"""Child side of ``--checks``: programs that span processes agree, checked
when each process first gets them.

The guide's parted program (three processes run ``x @ y``, the last
``y @ x``) hangs in a collective that never matches, and a stack dump names
where each process waits, not where they parted.  So every process
fingerprints each executable whose devices belong to more than one process,
the moment it gets it: ``pxla.UnloadedMeshExecutable.from_hlo``, which every
``jax.jit`` call, eager operation and ``.lower().compile()`` passes through
once per program, whether XLA compiles it or the persistent compile cache
hands it back (so a warm host and a cold spare count alike).  Executions are
never seen: the C++ fast path stays on, and the cost is one print and hash
of the module per program, next to its compile.

Only a program whose compiled HLO holds a collective counts: one without
(a replicated mean that process 0 alone computes to log it) makes no
process wait for another, whichever ran it.  The fingerprint hashes the
module as lowered, printed without source
locations and without its name, so the same program made at another line,
or from a checkout at another path, agrees.  Each process counts the
programs of each group of processes (the processes whose devices the program
uses: a mesh over a subset compares among those only) and posts the k-th on
the board (:mod:`jaxrun.child.agreement`) under ``programs/{group}/{k}``.
A program this process already posted for that group is not counted again.

On a difference every process that sees it stops with a
``ProgramMismatchError`` naming each side's function, inputs, shardings and
line, the odd side first; the odd side stops at once, the others
``LATER`` seconds after, if fail-fast has not ended them by then, so that the
summary's "failed first" is the odd one out.

A program compiled on a thread other than the main one is counted apart, per
thread name (threads started in the same order are named alike); the
board's own thread's programs are not counted.  In a process started again
alone (a recoverable job) nothing is posted: its peers are past its positions.

Known limits: a process that reuses a program it already has while another
compiles a new one makes no new entry, so the difference is not found by
position (the stall watchdog and ``--check-divergence`` remain for it); a
peer that finished its script without a program is left to the stall
watchdog; ``pmap``'s programs are not seen.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import sys
import threading
import time

from jaxrun import contract
from jaxrun.child import agreement, ending

# (module, attribute path) of the one name the check wraps.
HOOK_POINT = ("jax._src.interpreters.pxla", "UnloadedMeshExecutable.from_hlo")
TESTED_JAX = ("0.10.2",)
LATER = 5.0  # seconds the larger side waits before it stops too
MAX_INPUTS = 8  # an entry names at most this many inputs, then how many more


class ProgramMismatchError(RuntimeError):
    """Processes got different programs at the same position."""


def install(board, strict: bool) -> None:
    """Wrap ``from_hlo`` (jax is loaded: ``checks`` calls this from its import hook)."""
    jax_module = sys.modules["jax"]
    target = _hook_target(sys.modules)
    if target is None:
        _unavailable(jax_module, board.rank, strict)
        return
    if os.environ.get(contract.PROCESS_RESTARTS, "0") not in ("", "0"):
        return  # started again alone: its peers' positions are past its own
    from jaxrun.child import flight

    locator = flight.Flight(board.rank, board.count, 0, None)  # its user_frame: the user's line
    locator.describe_paths(jax_module)
    checker = Programs(board, locator)
    real, signature = target, inspect.signature(target)

    def from_hlo(*args, **kwargs):
        executable = real(*args, **kwargs)
        try:
            checker.got(signature.bind(*args, **kwargs).arguments, executable)
        except Exception as e:  # noqa: BLE001 - a check that cannot read the program stays silent
            if os.environ.get(contract.VERBOSE) == "1":
                print(f"jaxrun: --checks could not read a program: {type(e).__name__}: {e}", file=sys.stderr)
        return executable

    sys.modules[HOOK_POINT[0]].UnloadedMeshExecutable.from_hlo = staticmethod(from_hlo)


def _hook_target(modules):
    module = modules.get(HOOK_POINT[0])
    target = module
    for part in HOOK_POINT[1].split("."):
        target = getattr(target, part, None)
    return target if callable(target) else None


def _unavailable(jax_module, rank: int, strict: bool) -> None:
    version = getattr(jax_module, "__version__", "of unknown version")
    where = f"{HOOK_POINT[0]}.{HOOK_POINT[1]}"
    if strict:
        ending.fail(RuntimeError(f"--checks strict cannot compare programs on jax {version}: {where} not found "
                                 f"(tested with jax {', '.join(TESTED_JAX)}); run with --checks on or off"))
    if rank == 0:
        print(f"jaxrun: --checks: programs are not compared on jax {version}: {where} not found "
              f"(tested with jax {', '.join(TESTED_JAX)})", file=sys.stderr)


class Programs:
    """This process's programs that span processes: counted per group, posted once each."""

    def __init__(self, board, locator):
        self.board, self.locator = board, locator
        self.counts: dict[str, int] = {}  # group (and thread) -> programs posted
        self.seen: set[tuple[str, str]] = set()
        self.lock = threading.Lock()

    def got(self, given: dict, executable) -> None:
        """``given``: from_hlo's arguments by name; ``executable``: what it made."""
        ranks = sorted({d.process_index for d in given.get("device_list") or ()})
        if len(ranks) < 2 or self.board.rank not in ranks:
            return  # process-local: nothing that another process must match
        thread = threading.current_thread()
        if thread.name == agreement.THREAD:
            return  # a check's own program (the replicas' checksum): no user's position
        if not communicates(executable):
            return  # no process waits for another in it (process 0 alone logs a replicated mean)
        file, line = self.locator.user_frame(sys._getframe(2))
        entry = {"h": fingerprint(given["hlo"]), "fn": function_name(given.get("name", "")),
                 "in": inputs_text(given.get("global_in_avals")),
                 "sh": shardings_text(given.get("in_shardings")), "at": f"{file}:{line}"}
        group = group_text(ranks)
        counter = group if thread is threading.main_thread() else f"{group}/{thread.name}"
        with self.lock:
            if (counter, entry["h"]) in self.seen:
                return
            self.seen.add((counter, entry["h"]))
            k = self.counts[counter] = self.counts.get(counter, 0) + 1
        topic = f"programs/{counter}/{k}"
        self.board.post(topic, entry, ranks, self.settled(k, group, ranks), same=same_program)

    def settled(self, k: int, group: str, ranks: list[int]):
        rank = self.board.rank

        def judge(topic: str, entries: dict, gone: set) -> None:
            del topic
            sides = sides_of(entries)
            if len(sides) < 2:
                return  # agreed; a rank that finished without it is the stall watchdog's
            headline, lines = describe(k, group, entries, gone, ranks)
            if rank not in sides[0]:
                time.sleep(LATER)  # the odd side stops first: the summary names it
            agreement.stop(ProgramMismatchError(headline), lines)

        return judge


# -- pure parts -------------------------------------------------------------------------

# The module's name (jit_train_step) is the function's, compared apart.
_MODULE_NAME = re.compile(r"^(\s*module) @\S+", re.MULTILINE)
_JIT_NAME = re.compile(r"^(?:jit|pjit)\((.*)\)$")
_DTYPE_WORDS = (("bfloat", "bf"), ("complex", "c"), ("float", "f"), ("uint", "u"), ("int", "i"))


def fingerprint(hlo) -> str:
    """The lowered module, printed without locations and without its name, hashed."""
    text = hlo.operation.get_asm(enable_debug_info=False) if hasattr(hlo, "operation") else str(hlo)
    return program_hash(text)


_COLLECTIVE = re.compile(r" (?:all-reduce|all-gather|all-to-all|ragged-all-to-all|reduce-scatter|collective-permute"
                         r"|collective-broadcast|send|recv)(?:-start)?\(")


def communicates(executable) -> bool:
    """Whether the compiled program holds a collective (or a send or receive):
    only then can processes that run different ones wait for each other.
    The compiled HLO is the same in every process that compiled the same
    module, and is there for a program loaded from the persistent cache too.
    Unknown counts as yes."""
    try:
        return any(_COLLECTIVE.search(m.to_string()) for m in executable.xla_executable.hlo_modules())
    except Exception:  # noqa: BLE001 - an executable that cannot say: compare it
        return True


def program_hash(text: str) -> str:
    return hashlib.blake2b(_MODULE_NAME.sub(r"\1", text, count=1).encode(), digest_size=8).hexdigest()


def function_name(name: str) -> str:
    """"jit(train_step)" -> "train_step"."""
    m = _JIT_NAME.match(name or "")
    return re.sub(r"\s+", "_", m[1] if m else (name or "")) or "?"


def array_text(aval) -> str:
    """"f32[8,4]" for a shaped value; its type's name for anything else."""
    dtype, shape = getattr(aval, "dtype", None), getattr(aval, "shape", None)
    if dtype is None or shape is None:
        return type(aval).__name__
    name = str(dtype)
    for word, short in _DTYPE_WORDS:
        if name.startswith(word):
            name = short + name[len(word):]
            break
    return f"{name}[{','.join(map(str, shape))}]"


def inputs_text(avals) -> str:
    avals = list(avals or ())
    parts = [array_text(a) for a in avals[:MAX_INPUTS]]
    if len(avals) > MAX_INPUTS:
        parts.append(f"+{len(avals) - MAX_INPUTS}")
    return ", ".join(parts)


def sharding_text(sharding) -> str:
    """A NamedSharding's spec, "P('b', None)"; "-" where jit chooses; else the type."""
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return re.sub(r"^PartitionSpec", "P", str(spec))
    name = type(sharding).__name__
    return "-" if "Unspecified" in name else name


def shardings_text(shardings) -> str:
    shardings = list(shardings or ())
    parts = [sharding_text(s) for s in shardings[:MAX_INPUTS]]
    if len(shardings) > MAX_INPUTS:
        parts.append(f"+{len(shardings) - MAX_INPUTS}")
    return ", ".join(parts)


def group_text(ranks) -> str:
    """"0-3" for a run of ranks, else "0,2,5": the same text in every process."""
    ranks = sorted(ranks)
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def same_program(mine: dict, theirs: dict) -> bool:
    return mine.get("h") == theirs.get("h")


def sides_of(entries: dict) -> list[list[int]]:
    """The ranks grouped by program, the odd side first: fewest ranks, then lowest rank."""
    by_hash: dict[str, list[int]] = {}
    for rank in sorted(entries):
        by_hash.setdefault(entries[rank].get("h"), []).append(rank)
    return sorted(by_hash.values(), key=lambda ranks: (len(ranks), ranks[0]))


def who(ranks) -> str:
    return ("process " if len(ranks) == 1 else "processes ") + ", ".join(map(str, ranks))


def made(entry: dict, short: bool = True) -> str:
    at = str(entry.get("at", "?"))
    if short:
        file, _, line = at.rpartition(":")
        at = f"{os.path.basename(file)}:{line}"
    return f"{entry.get('fn', '?')}({entry.get('in', '')}) at {at}"


def what_differs(entries: dict, sides: list[list[int]]) -> str:
    """Which of function, shapes, shardings differ between the sides; "body" where none do."""
    firsts = [entries[side[0]] for side in sides]
    fields = [word for key, word in (("fn", "function"), ("in", "shapes"), ("sh", "shardings"))
              if len({str(e.get(key)) for e in firsts}) > 1]
    return ", ".join(fields) or "body"


def describe(k: int, group: str, entries: dict, gone: set, ranks) -> tuple[str, list[str]]:
    """(the error's one line, the lines for stderr): each side, the odd one first."""
    sides = sides_of(entries)
    plural = "processes" if "," in group or "-" in group else "process"
    headline = (f"program {k} of {plural} {group} differs ({what_differs(entries, sides)}): "
                + "; ".join(f"{who(side)} made {made(entries[side[0]])}" for side in sides))
    lines = [f"--checks: the processes part at program {k} of {plural} {group} "
             "(counting programs that span processes, as each process first got them):"]
    for side in sides:
        e = entries[side[0]]
        lines.append(f"  {who(side)}: {made(e, short=False)}, sharded {e.get('sh') or '-'}, program {e.get('h')}")
    for rank in sorted(gone):
        lines.append(f"  process {rank}: finished its script without it")
    waiting = [r for r in ranks if r not in entries and r not in gone]
    if waiting:
        lines.append(f"  {who(waiting)}: not at program {k} yet")
    lines.append("  stopping the job: these processes would wait for each other in different collectives")
    return headline, lines
