"""Child side of ``--checks``: a program that spans processes, run where its
peers never come (the guide's commonest mistake), stopped in seconds.

``if jax.process_index() == 0: eval_step(w)``, where ``eval_step``'s program
spans every process: process 0 waits at its first run's meeting
(``checks.meeting``; or in it, where it ran before, agreed on by all), the
others wait in their next step (or finished their script), and nothing moves.  The programs check
cannot see it (the others never make ``eval_step``: its topic waits for
ever), and the stall watchdog takes its timeout.  So:

- the programs check tells this one (``made``) the line that made each
  program that spans processes (the user's frame, as its entries say) and
  the processes it spans;
- the time account (``child.watch.accounting``) sees each 20 ms whether the
  main thread is inside JAX and whether the process wanted CPU; once it
  has waited inside JAX with no CPU at one call site for ``seconds`` (3 s on
  CPU devices; ``ACCELERATOR_WAIT`` where a program runs on an accelerator,
  whose programs run with the host idle), it says so (``changed``);
- a thread of this module's, started at the first such wait, posts where
  this process waits under ``WAITS/{rank}`` in the store (the line, its
  text, and the processes the program made at that line spans, or every
  group of processes this process's programs span where that line made
  none; at a meeting, the program it is to run and its group, ``meets``),
  and clears it once the process moves;
- the lowest rank that waits reads every wait and who finished its script
  (the board's ``FINISHED`` keys): where every process of a group a waiting
  process's program spans waits or finished, and they do not all wait at
  one line, they parted (``parted``).  Seen alike on two looks ``LOOK``
  apart, the job stops, as a parted program does, with each side's line.

Never a parting: processes that wait at one line (a long program on an
accelerator, a slow peer), a program of a subset of processes whose members
wait together, a process-local program (it spans no one), a process busy in
its own work (it wants CPU, or it is outside JAX, or a thread of its runs a
host callback of the script's: ``in_callback``).  Known limits: with
``--no-account`` nothing here runs; a process that finished its script with
a long program still running in the background reads as finished.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import time

from jaxrun import contract
from jaxrun.child.checks import agreement, store
from jaxrun.child.checks.program_text import group_text, who

WAIT = 3.0  # seconds a process waits inside JAX with no CPU, at one line, before it says so
ACCELERATOR_WAIT = 30.0  # ... where a program runs on an accelerator: a long one leaves the host idle
# ... where it waits at a meeting (checks.meeting): a wait with no doubt about what it waits
# for, which its group ends in milliseconds once all came.  Its peers' own waits keep theirs.
MEETING_WAIT = 0.5
# Where every process of a parting waits at a meeting (programs that differ: they meet apart),
# the programs check (its posts out after programs.HOLD) names what differs, the odd side
# first: the parting stops the job only once it has stood this long, as with WAIT before.
APART = WAIT - MEETING_WAIT
LOOK = 0.5  # seconds between the judge's looks; a parting is one seen alike on two
THREAD = "jaxrun-parting"
CALLBACK_FILE = os.path.join("jax", "_src", "callback.py")


class PartedProgramError(RuntimeError):
    """Processes that a program spans wait at different lines, or finished without it."""


def parted(waits: dict[int, dict], finished: set[int]) -> list[int] | None:
    """The ranks of the first group whose members all wait or finished, not
    all at one line; None where none parted.  ``waits``: rank -> its wait
    (``at``, and ``groups``: the rank lists its line's programs span)."""
    waiting = {r: w for r, w in waits.items() if r not in finished}
    for rank in sorted(waiting):
        for ranks in waiting[rank].get("groups", ()):
            if any(r not in waiting and r not in finished for r in ranks):
                continue
            # At one meeting (the same program, whatever line runs it) they are together.
            if any(r in finished for r in ranks) or len({waiting[r].get("program") or waiting[r].get("at")
                                                         for r in ranks}) > 1:
                return sorted(ranks)
    return None


def ripe(ranks: list[int], waits: dict[int, dict], finished: set[int], stood: float) -> bool:
    """Whether a parting seen alike for ``stood`` seconds stops the job now:
    at once, unless every one of its processes waits at a meeting (``APART``)."""
    apart = not any(r in finished for r in ranks) and all(waits.get(r, {}).get("meets") for r in ranks)
    return not apart or stood >= APART


def describe(ranks: list[int], waits: dict[int, dict], finished: set[int]) -> tuple[str, list[str]]:
    """The headline and the lines that name each side of a parting: first a
    program some came to run and the others never reached (a meeting,
    ``checks.meeting``: it never ran), or else one some ran that the others
    never made (an open topic of the programs check); then where each other
    side waits now, the smallest side first."""
    sides: dict[str, list[int]] = {}
    for r in ranks:
        sides.setdefault("" if r in finished else waits[r].get("at", "?"), []).append(r)
    order = sorted(sides.items(), key=lambda side: (len(side[1]), side[1]))
    meeting = [(at, side) for at, side in order if at and waits[side[0]].get("meets")]
    pieces, lines = [], []
    headline = f"processes {group_text(ranks)} parted: "
    for at, side in meeting:
        wait = waits[side[0]]
        pieces.append(f"{who(side)} came to run {wait['fn']} (spanning {wait['spans']}) at {os.path.basename(at)}")
        lines.append(f"{who(side)} {'waits' if len(side) == 1 else 'wait'} to run {wait['fn']} at {at}: "
                     f"{wait.get('text', '')}")
    if meeting:
        others = [r for r in ranks if not any(r in side for _, side in meeting)]
        reached = f", which {who(others)} never reached" if others and len(meeting) == 1 else ""
        headline += "; ".join(pieces) + reached + (" (stopped before it ran: none of its collectives ran)"
                                                   if len(meeting) == 1 else " (stopped before any of them ran)")
        pieces = []
    else:
        ran = _unmatched(ranks, waits, finished)
        if ran:
            program, had = ran
            lacking = [r for r in ranks if r not in had]
            headline += (f"{who(had)} ran {program['fn']} (spanning {program['spans']}) at "
                         f"{os.path.basename(program['at'])} and {who(lacking)} never made it; now ")
            lines.append(f"{who(had)} ran {program['fn']} at {program['at']}, which {who(lacking)} never made")
    for at, side in order:
        if (at, side) in meeting:
            continue
        if not at:
            pieces.append(f"{who(side)} finished {'its' if len(side) == 1 else 'their'} script")
            continue
        wait, verb = waits[side[0]], "waits" if len(side) == 1 else "wait"
        program = f" in {wait['fn']} (spanning {wait['spans']})" if wait.get("fn") else ""
        pieces.append(f"{who(side)} {verb}{program} at {os.path.basename(at)}")
        lines.append(f"{who(side)} {verb} at {at}: {wait.get('text', '')}")
    headline += ("; " if meeting and pieces else "") + "; ".join(pieces)
    headline += " (a program that spans processes runs on every one of them, or on none)"
    return headline, [headline, *lines]


def _unmatched(ranks: list[int], waits: dict[int, dict], finished: set[int]):
    """(the program, the ranks that made it): the first program made by some
    of ``ranks`` that spans all of them and the others never made."""
    for r in ranks:
        for program in waits.get(r, {}).get("open", ()) if r not in finished else ():
            had = [q for q in ranks if q not in finished and program in waits[q].get("open", ())]
            if set(program.get("among", ())) == set(ranks) and len(had) < len(ranks):
                return program, had
    return None


def in_callback(frames=sys._current_frames) -> bool:
    """Whether a thread (the main one, or one of JAX's) runs a host callback
    of the script's (``jax.pure_callback``, ``io_callback``): the process
    waits for its own code, which may sleep or read a file."""
    for frame in frames().values():
        while frame is not None:
            if frame.f_code.co_filename.endswith(CALLBACK_FILE):
                return True
            frame = frame.f_back
    return False


class Parting:
    """This process's side: the lines its programs were made at, its wait, the judge."""

    def __init__(self, board, locator):
        self.board, self.locator = board, locator
        self.sites: dict[str, dict[str, tuple[str, list[int]]]] = {}  # line -> group -> (function, ranks) made there
        self.groups: dict[str, list[int]] = {}  # every group this process's programs span
        self.base = WAIT  # how long a wait lasts before it is said (ACCELERATOR_WAIT on an accelerator)
        self.missed: list[dict] = []  # programs the programs check settled with a peer that finished without them
        self.waiting, self.turn = False, 0  # the account's word, and how many waits it said
        self.meeting: dict | None = None  # the program the main thread waits to run first (checks.meeting)
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def made(self, at: str, ranks: list[int], fn: str, devices) -> None:
        """The programs check got a program that spans ``ranks`` (none: it makes
        no process wait for another, a process-local one), made at ``at``."""
        spans = self.sites.setdefault(at, {})
        if ranks:
            group = group_text(ranks)
            spans[group] = (fn, ranks)
            self.groups[group] = ranks
        if self.base == WAIT and any(getattr(d, "platform", "cpu") != "cpu" for d in devices):
            self.base = ACCELERATOR_WAIT

    @property
    def seconds(self) -> float:
        """How long the main thread's wait must last before it is said: less at a meeting."""
        return MEETING_WAIT if self.meeting is not None else self.base

    def unmet(self, entries: dict, ranks: list[int], gone: set) -> None:
        """The programs check settled a program that ``gone`` finished their script without."""
        entry = next(iter(entries.values()), {})
        if len(self.missed) < 8:
            self.missed.append({"fn": entry.get("fn", "?"), "at": entry.get("at", "?"),
                                "spans": group_text(ranks), "among": list(ranks)})

    def met(self) -> None:
        """The main thread's meeting ended: no longer a meeting, and a wait said
        there is posted again as what it is now (its program runs at that line)."""
        self.meeting = None
        with self.lock:
            if not self.waiting:
                return
            self.turn += 1
        self.wake.set()

    def changed(self, waiting: bool) -> None:
        """From the sampler's thread: the wait began (it lasted ``seconds``) or ended."""
        with self.lock:
            self.waiting = waiting
            self.turn += waiting
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=THREAD, daemon=True)
                self.thread.start()
        self.wake.set()

    def wait_entry(self) -> dict:
        frame = sys._current_frames().get(threading.main_thread().ident)
        file, line = self.locator.user_frame(frame)
        at = f"{file}:{line}"
        text = linecache.getline(file, line).strip()[:120]
        meeting = self.meeting
        if meeting is not None:  # before its first run: it waits for its group to come to the same program
            return {"at": at, "text": text, "groups": [meeting["among"]], "fn": meeting["fn"],
                    "spans": meeting["spans"], "meets": True, "program": meeting["name"], "open": []}
        made = self.sites.get(at)  # a line that made only programs that span no one waits for no one
        groups = [ranks for _, ranks in made.values()] if made is not None else list(self.groups.values())
        fn, spans = next(((fn, group) for group, (fn, _) in (made or {}).items()), ("", ""))
        return {"at": at, "text": text, "groups": groups, "fn": fn, "spans": spans, "open": self.unmatched()}

    def unmatched(self) -> list[dict]:
        """The programs this process made that its peers have not matched yet
        (the programs check's topics still open on the board), oldest first."""
        found = list(self.missed)
        for post in list(self.board.open)[:8]:
            entry = post.entry
            if post.topic.startswith("programs/") and isinstance(entry, dict) and not post.agreed:
                found.append({"fn": entry.get("fn", "?"), "at": entry.get("at", "?"),
                              "spans": group_text(post.among), "among": list(post.among)})
        return found

    def _run(self) -> None:
        rank, posted, last, since = self.board.rank, 0, None, 0.0
        try:
            client = store.jax_client()
            while True:
                self.wake.wait(LOOK if self.waiting else None)
                self.wake.clear()
                with self.lock:
                    waiting, turn = self.waiting, self.turn
                if waiting and in_callback():
                    waiting = False  # in its own code: its wait is posted again once out
                if not waiting:
                    if posted:
                        store.clear_wait(client, rank)
                    posted, last = 0, None
                    continue
                if posted != turn:
                    store.post_wait(client, rank, self.wait_entry())
                    posted, last = turn, None
                waits, finished = store.waits(client), store.Finished(client).ranks()
                if min((r for r in waits if r not in finished), default=rank) != rank:
                    continue  # the lowest rank that waits judges
                ranks = parted(waits, finished)
                found = None if ranks is None else (ranks, {r: waits.get(r, {}).get("at") for r in ranks})
                if found is not None and found == last:
                    if ripe(ranks, waits, finished, time.monotonic() - since):
                        headline, lines = describe(ranks, waits, finished)
                        agreement.stop(PartedProgramError(headline), lines)
                    continue
                last, since = found, time.monotonic()
        except Exception as e:  # noqa: BLE001 - the store gone (coordinator ended): the check ends quietly
            if os.environ.get(contract.VERBOSE) == "1":
                print(f"jaxrun: --checks stopped looking for partings: {type(e).__name__}: {e}", file=sys.stderr)


def install(board, programs) -> None:
    """Hear of the account's long waits (programs: the check that tells the lines)."""
    from jaxrun.child.watch import accounting

    parting = Parting(board, programs.locator)
    programs.parting = parting
    if programs.meetings is not None:
        programs.meetings.parting = parting
    accounting.waits = parting
