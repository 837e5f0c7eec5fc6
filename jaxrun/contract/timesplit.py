"""Where one process's time went, as it travels to the launcher: the
``TimeSplit`` record and its line, and the activity file that carries it.

A process's accountant (``child.watch.accounting``) writes its cumulative split
as one TIME line beside its activity line in the activity file
(``contract.ACTIVITY_FILE``); the launcher reads the file, or a far end's
agent reads it and sends each new line home the way it sends the activity
(the SSH stream's marker, the task channel's ``TaskActivity``).

Imported at every controller's start, as ``files`` is: a plain class, no
dataclasses."""

from __future__ import annotations

import math

from jaxrun.contract.files import ACTIVITY_LINE_MAX, activity_word, read_small
from jaxrun.contract.names import TIME

__all__ = ["ACTIVITY_FILE_MAX", "TIME_LINE_MAX", "TimeSplit", "read_activity_file"]

TIME_LINE_MAX = 132  # bytes: "time" and seven numbers
ACTIVITY_FILE_MAX = ACTIVITY_LINE_MAX + TIME_LINE_MAX + 2  # the state's line and the time's


class TimeSplit:
    """One process's time since its account began (its join), cumulative, in
    seconds: ``work`` (its main thread outside JAX and using or wanting the
    CPU: input, Python, numpy, the script's own compute; the goodput's
    ``input``), ``idle`` (outside JAX, and neither using nor wanting a CPU:
    a sleep, a queue's ``get``, a socket's read), ``programs`` (inside JAX
    with the CPU the process used or wanted: programs executing, dispatch,
    transfers; alone in its job, all its time inside JAX), ``waiting``
    (inside JAX while the process used no CPU and wanted none: a collective
    or a sync point waiting for the other processes), ``compile`` (inside
    JAX's compiler).  ``began``: when the account began (the wall clock's
    seconds since the epoch); ``covered``: the seconds it covers, from
    ``began`` to this record (the five parts sum to it, to a tick).  A
    line of six numbers (an account without ``idle``: a far end of the last
    version) reads with ``idle`` 0.  A
    value: compared by its fields, never changed."""

    __slots__ = ("began", "covered", "work", "programs", "waiting", "compile", "idle")
    FIELDS = __slots__
    began: float
    covered: float
    work: float
    programs: float
    waiting: float
    compile: float
    idle: float

    def __init__(self, began: float, covered: float, work: float, programs: float, waiting: float,
                 compile: float = 0.0, idle: float = 0.0) -> None:
        for name, value in zip(self.FIELDS, (began, covered, work, programs, waiting, compile, idle)):
            object.__setattr__(self, name, float(value))

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a TimeSplit is never changed: cannot set {name!r}")

    def __eq__(self, other) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.values() == other.values()

    def __hash__(self) -> int:
        return hash(self.values())

    def __repr__(self) -> str:
        return "TimeSplit(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS) + ")"

    def __reduce__(self):
        return TimeSplit, self.values()

    def values(self) -> tuple[float, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    @property
    def own(self) -> float:
        """Its own time: its work and its programs."""
        return self.work + self.programs

    def minus(self, earlier: TimeSplit) -> TimeSplit:
        """The window between an earlier record of the same account and this one."""
        return TimeSplit(earlier.began + earlier.covered, *(a - b for a, b in zip(self.values()[1:],
                                                                                  earlier.values()[1:])))

    def line(self) -> str:
        """The TIME line that says it: ``time BEGAN COVERED WORK PROGRAMS WAITING COMPILE IDLE``."""
        return f"{TIME} {self.began:.3f} " + " ".join(f"{v:.3f}" for v in self.values()[1:])

    @classmethod
    def of(cls, said: str) -> TimeSplit | None:
        """The split a TIME line says; None for any other line."""
        word, *rest = said.split() or [""]
        if word != TIME or len(rest) not in (len(cls.FIELDS) - 1, len(cls.FIELDS)) or len(said) > TIME_LINE_MAX:
            return None
        try:
            numbers = [float(v) for v in rest]
        except ValueError:
            return None
        if not all(math.isfinite(v) and v >= 0 for v in numbers):
            return None
        return cls(*numbers)


def read_activity_file(path: str) -> list[str]:
    """The lines of a process's activity file that say something: its
    state's (``activity_word``'s), then its TIME line, each where present."""
    data = read_small(path, ACTIVITY_FILE_MAX)
    if not data:
        return []
    lines = [line.strip() for line in data.decode(errors="replace").splitlines()]
    state = [line for line in lines if activity_word(line) is not None][:1]
    return state + [line for line in lines if TimeSplit.of(line) is not None][:1]
