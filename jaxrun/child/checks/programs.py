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
process wait for another, whichever ran it.  What can make processes wait
for each other is compared: the program's collectives in order, each with
its kind, shapes, replica groups and dimensions, and the devices the
program spans (``collectives_of``, hashed with the device ids).  The body
(the module as lowered, printed without source locations and without its
name, so the same program made at another line or from a checkout at
another path agrees) is compared too, but a body that differs where the
collectives agree (a per-process constant baked in, a local operation)
cannot make processes wait: one warning, and ``--checks strict`` stops.

Where programs are counted depends on who made them.  The main thread makes
its programs in the script's order: each process counts them per group of
processes (the processes whose devices the program uses: a mesh over a
subset compares among those only) and posts the k-th on the board
(:mod:`jaxrun.child.checks.agreement`) under ``programs/{group}/m/{k}``; processes
whose k-th programs' collectives differ would wait for each other in
different collectives, and the job stops.  Any other thread (a pool that
compiles ahead of time) makes them in an order its scheduling decides, so a
position there means nothing: such a program is keyed by what it is, its
line, function, inputs, shardings and collectives
(``programs/{group}/t{key}/{n}``), and only its body is compared, where the
key is unambiguous (each process made one program under it).  A program
this process already posted under its key is not counted again.

On a difference in the collectives every process that sees it stops with a
``ProgramMismatchError`` naming each side's function, inputs, what differs
and line, the odd side first; the odd side stops at once, the others
``LATER`` seconds after, if fail-fast has not ended them by then, so that
the summary's "failed first" is the odd one out.  The board's own thread's
programs are not counted.  In a process started again alone (a recoverable
job) nothing is posted: its peers are past its positions.

Known limits: a process that reuses a program it already has while another
compiles a new one makes no new entry, so the difference is not found by
position (the stall watchdog and ``--check-divergence`` remain for it); a
peer that finished its script without a program is left to the stall
watchdog; programs made off the main thread whose collectives differ are
not paired (nothing says which of them stand for each other); ``pmap``'s
programs are not seen.
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
from jaxrun.child import ending
from jaxrun.child.checks import agreement

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
    from jaxrun.child.checks import flight

    locator = flight.Flight(board.rank, board.count, 0, None)  # its user_frame: the user's line
    locator.describe_paths(jax_module)
    checker = Programs(board, locator, strict)
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
    """This process's programs that span processes: counted per group (the
    main thread's) or keyed by what they are (other threads'), posted once each."""

    def __init__(self, board, locator, strict: bool = False):
        self.board, self.locator, self.strict = board, locator, strict
        self.counts: dict[str, int] = {}  # group/m, or group/t{key} -> programs posted
        self.seen: set[tuple[str, str]] = set()
        self.warned = False  # a body that differs is said once per process
        self.lock = threading.Lock()

    def got(self, given: dict, executable) -> None:
        """``given``: from_hlo's arguments by name; ``executable``: what it made."""
        devices = given.get("device_list") or ()
        ranks = sorted({d.process_index for d in devices})
        if len(ranks) < 2 or self.board.rank not in ranks:
            return  # process-local: nothing that another process must match
        thread = threading.current_thread()
        if thread.name == agreement.THREAD:
            return  # a check's own program (the replicas' checksum): no user's position
        collectives = collectives_of(executable)
        if not collectives:
            return  # no process waits for another in it (process 0 alone logs a replicated mean)
        file, line = self.locator.user_frame(sys._getframe(2))
        entry = {"h": fingerprint(given["hlo"]), "c": program_hash(collectives_key(collectives, devices)),
                 "cs": collectives_text(collectives), "fn": function_name(given.get("name", "")),
                 "in": inputs_text(given.get("global_in_avals")),
                 "sh": shardings_text(given.get("in_shardings")), "at": f"{file}:{line}"}
        group = group_text(ranks)
        main = thread is threading.main_thread()
        key = f"{group}/m" if main else f"{group}/t{program_hash(thread_key(entry))}"
        with self.lock:
            if (key, entry["h"]) in self.seen:
                return
            self.seen.add((key, entry["h"]))
            k = self.counts[key] = self.counts.get(key, 0) + 1
        if not main:
            entry["n"] = k  # more than 1: this key is ambiguous here, its bodies not paired
        same = (same_program if self.strict else same_collectives) if main else (same_program if self.strict else None)
        self.board.post(f"programs/{key}/{k}", entry, ranks, self.settled(k if main else 0, group, ranks, key),
                        same=same)

    def settled(self, k: int, group: str, ranks: list[int], key: str = ""):
        """The judge of program ``k`` of ``group`` (0: one made off the main thread)."""
        rank = self.board.rank

        def judge(topic: str, entries: dict, gone: set) -> None:
            del topic
            sides = sides_of(entries, "c")
            if len(sides) < 2:
                sides = sides_of(entries, 'h')
                if len(sides) < 2 or self._ambiguous(key, entries):
                    return  # agreed; a rank that finished without it is the stall watchdog's
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
        what = f"program {k} of processes {group}" if k else f"a program of processes {group} made off the main thread"
        print(f"jaxrun: warning: {what} differs in its body only, not in its collectives (a per-process "
              "constant, a local operation): " + "; ".join(f"{who(side)} made {made(entries[side[0]])} "
                                                           f"[program {entries[side[0]].get('h')}]"
                                                           for side in sides)
              + "; the processes do not wait on it differently, so the job goes on (--checks strict stops it)",
              file=sys.stderr, flush=True)


# -- pure parts -------------------------------------------------------------------------

# The module's name (jit_train_step) is the function's, compared apart.
_MODULE_NAME = re.compile(r"^(\s*module) @\S+", re.MULTILINE)
_JIT_NAME = re.compile(r"^(?:jit|pjit)\((.*)\)$")
_DTYPE_WORDS = (("bfloat", "bf"), ("complex", "c"), ("float", "f"), ("uint", "u"), ("int", "i"))


def fingerprint(hlo) -> str:
    """The lowered module, printed without locations and without its name, hashed."""
    text = hlo.operation.get_asm(enable_debug_info=False) if hasattr(hlo, "operation") else str(hlo)
    return program_hash(text)


_OPS = r"(?:all-reduce|all-gather|all-to-all|ragged-all-to-all|reduce-scatter|collective-permute" \
    r"|collective-broadcast|send|recv)"
_FIND = re.compile(rf" {_OPS}(?:-start)?\(")  # fast, over the whole module's text
_COLLECTIVE = re.compile(rf"= (?P<type>.*?) (?P<op>{_OPS})(?:-start)?\((?P<args>[^)]*)\)(?P<attrs>.*)")  # its line
# What a collective's partners must match: who takes part, along which dimensions.
_KEPT = ("replica_groups", "dimensions", "source_target_pairs", "split_dimension", "concat_dimension",
         "use_global_device_ids")
_ATTRIBUTE = re.compile(r",\s*(?=[a-z_]+=)")
_LAYOUT = re.compile(r"\{[^{}]*\}|/\*.*?\*/")  # layouts, and the /*index=5*/ marks in a tuple
SHAPE_CHARS = 40  # a collective's shape is shown this long at most


def collectives_of(executable) -> list[str]:
    """The compiled program's collectives (and sends and receives), in order:
    each one's kind, shape and the attributes that say who takes part.
    Only such a program can make processes wait for each other.  The
    compiled HLO is the same in every process that compiled the same module,
    and is there for a program loaded from the persistent cache too.
    Unknown counts as one collective of unknown kind (compared)."""
    try:
        found = []
        for module in executable.xla_executable.hlo_modules():
            text = module.to_string()
            for hit in _FIND.finditer(text):
                end = text.find("\n", hit.end())
                line = text[text.rfind("\n", 0, hit.start()) + 1:end if end >= 0 else len(text)]
                m = _COLLECTIVE.search(line)
                if m is None:
                    continue
                attrs = [a for a in _ATTRIBUTE.split(m["attrs"]) if a.split("=", 1)[0].strip() in _KEPT]
                found.append(" ".join([m["op"], _LAYOUT.sub("", m["type"]).replace(" ", "")] + sorted(attrs)))
        return found
    except Exception:  # noqa: BLE001 - an executable that cannot say: compare it
        return ["?"]


def collectives_key(collectives: list[str], devices) -> str:
    ids = sorted(getattr(d, "id", -1) for d in devices)
    return "\n".join(collectives) + f"\ndevices {ids}"


def collectives_text(collectives: list[str]) -> str:
    """"all-gather f32[8,8], all-reduce f32[]": each collective's kind and shape."""
    parts = []
    for collective in collectives[:MAX_INPUTS]:
        op, _, rest = collective.partition(" ")
        shape = rest.split(" ", 1)[0]
        parts.append(f"{op} {shape if len(shape) <= SHAPE_CHARS else shape[:SHAPE_CHARS - 3] + '...'}")
    if len(collectives) > MAX_INPUTS:
        parts.append(f"+{len(collectives) - MAX_INPUTS}")
    return ", ".join(parts)


def thread_key(entry: dict) -> str:
    """What keys a program made off the main thread: the same in every process
    for the same program, whichever thread made it and when."""
    return "\n".join(str(entry[k]) for k in ("at", "fn", "in", "sh", "c"))


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
    return mine.get("h") == theirs.get("h") and mine.get("c") == theirs.get("c")


def same_collectives(mine: dict, theirs: dict) -> bool:
    return mine.get("c") == theirs.get("c")


def sides_of(entries: dict, field: str = "c") -> list[list[int]]:
    """The ranks grouped by ``field`` (the collectives, or the body), the odd
    side first: fewest ranks, then lowest rank."""
    by_value: dict[str, list[int]] = {}
    for rank in sorted(entries):
        by_value.setdefault(entries[rank].get(field), []).append(rank)
    return sorted(by_value.values(), key=lambda ranks: (len(ranks), ranks[0]))


def who(ranks) -> str:
    return ("process " if len(ranks) == 1 else "processes ") + ", ".join(map(str, ranks))


# What an entry says, the word for it in "differs (...)", and how a side shows it.
_FIELDS = (("fn", "function", None), ("in", "shapes", None), ("sh", "shardings", "sharded {}"),
           ("cs", "collectives", "with {}"))


def what_differs(entries: dict, sides: list[list[int]]) -> list[str]:
    """Which of function, shapes, shardings, collectives differ between the
    sides (the collectives only where nothing before them does); ["body"]
    where none do."""
    firsts = [entries[side[0]] for side in sides]
    fields = [word for key, word, _ in _FIELDS if len({str(e.get(key)) for e in firsts}) > 1]
    if len(fields) > 1 and "collectives" in fields:
        fields.remove("collectives")
    return fields or ["body"]


def made(entry: dict, short: bool = True, shown: tuple[str, ...] = ()) -> str:
    """"matmul(f32[8,4], f32[4,8]) at job.py:29", with each field in ``shown``
    that the function and its inputs do not say (its shardings, its
    collectives, or for a body alone its program's hash)."""
    at = str(entry.get("at", "?"))
    if short:
        file, _, line = at.rpartition(":")
        at = f"{os.path.basename(file)}:{line}"
    extra = "".join(f" {form.format(entry.get(key) or '-')}" for key, word, form in _FIELDS
                    if form and word in shown)
    if "body" in shown:  # nothing a user wrote differs: the programs' own hashes do
        extra += f" [program {entry.get('h')}]"
    return f"{entry.get('fn', '?')}({entry.get('in', '')}){extra} at {at}"


def describe(k: int, group: str, entries: dict, gone: set, ranks) -> tuple[str, list[str]]:
    """(the error's one line, the lines for stderr): each side, the odd one
    first, showing what differs on each (its shardings, its collectives)."""
    sides = sides_of(entries, "c")
    if len(sides) < 2:
        sides = sides_of(entries, "h")
    fields = what_differs(entries, sides)
    plural = "processes" if "," in group or "-" in group else "process"
    what = f"program {k} of {plural} {group}" if k else f"a program of {plural} {group} made off the main thread"
    headline = (f"{what} differs ({', '.join(fields)}): "
                + "; ".join(f"{who(side)} made {made(entries[side[0]], shown=tuple(fields))}" for side in sides))
    lines = [f"--checks: the processes part at {what} "
             "(counting programs that span processes, as each process first got them):"]
    for side in sides:
        e = entries[side[0]]
        lines.append(f"  {who(side)}: {made(e, short=False)}, sharded {e.get('sh') or '-'}, "
                     f"collectives {e.get('cs') or '-'}, program {e.get('h')}")
    for rank in sorted(gone):
        lines.append(f"  process {rank}: finished its script without it")
    waiting = [r for r in ranks if r not in entries and r not in gone]
    if waiting:
        lines.append(f"  {who(waiting)}: not at program {k} yet")
    if fields == ["body"]:
        lines.append("  stopping the job (--checks strict): the programs differ in their bodies")
    else:
        lines.append("  stopping the job: these processes would wait for each other in different collectives")
    return headline, lines
