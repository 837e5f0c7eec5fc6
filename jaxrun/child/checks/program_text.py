"""What a program is, as the programs check (``checks.programs``) compares
and tells it: its fingerprint and its collectives, and the lines that name
a difference (which processes made what, at which line).  Pure: each takes
what from_hlo was given or made, or the entries the processes posted."""

from __future__ import annotations

import functools
import hashlib
import os
import re

MAX_INPUTS = 8  # an entry names at most this many inputs, then how many more
# The module's name (jit_train_step) is the function's, compared apart.
_MODULE_NAME = re.compile(r"^(\s*module) @\S+", re.MULTILINE)
_JIT_NAME = re.compile(r"^(?:jit|pjit)\((.*)\)$")
_DTYPE_WORDS = (("bfloat", "bf"), ("complex", "c"), ("float", "f"), ("uint", "u"), ("int", "i"))
_SHORT: dict = {}  # dtype -> its short name: numpy's str of a dtype costs more than the rest of a name


def fingerprint(hlo) -> str:
    """The lowered module, printed without locations and without its name, hashed.
    Printed as verified (JAX verified the module as it lowered it): the
    verifier's walk was a quarter of the print's time."""
    text = hlo.operation.get_asm(enable_debug_info=False, assume_verified=True) if hasattr(hlo, "operation") \
        else str(hlo)
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


@functools.cache
def _print_options():
    """The compiled module's print options, made once: XLA's short form (no
    metadata, no operand shapes), where what a collective's line holds that
    the check reads is printed the same, in a third of the default's time (15
    against 48 us for a one-collective step); None (the default print) where
    this jaxlib has no such options."""
    try:
        from jaxlib import _hlo

        return _hlo.HloPrintOptions.short_parsable()
    except (ImportError, AttributeError):
        return None


def collectives_of(executable) -> list[str]:
    """The compiled program's collectives (and sends and receives), in order:
    each one's kind, shape and the attributes that say who takes part.
    Only such a program can make processes wait for each other.  The
    compiled HLO is the same in every process that compiled the same module,
    and is there for a program loaded from the persistent cache too.
    Unknown counts as one collective of unknown kind (compared)."""
    try:
        found, options = [], _print_options()
        for module in executable.xla_executable.hlo_modules():
            text = module.to_string() if options is None else module.to_string(options)
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
    """What keys a program run off the main thread: the same in every process
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
    name = _SHORT.get(dtype)
    if name is None:
        name = str(dtype)
        for word, short in _DTYPE_WORDS:
            if name.startswith(word):
                name = short + name[len(word):]
                break
        if len(_SHORT) < 256:
            _SHORT[dtype] = name
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
    what = f"program {k} of {plural} {group}" if k else f"a program of {plural} {group} run off the main thread"
    headline = (f"{what} differs ({', '.join(fields)}): "
                + "; ".join(f"{who(side)} made {made(entries[side[0]], shown=tuple(fields))}" for side in sides))
    lines = [f"--checks: the processes part at {what} "
             "(counting programs that span processes, as each process first ran them):"]
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
