"""Child side of ``--checks``: before a process first runs a program that
spans processes, the processes it spans meet on it.

The commonest mistake of a multi-controller job is a program that spans
processes run where its peers never come (``if jax.process_index() == 0:
evaluate(w)``).  Let it run and its collectives pair with whatever the
others run next: on 4 processes the others' train step, and process 0 trains
on mixed data for tens of steps before anything is said; on 2, Gloo aborts.
So the first run of each such program waits, before any of its collectives
runs, until every process of its group has come to the same program:

- the programs check (``checks.programs``) hears of every executable as it
  is made (``from_hlo``) and of its first run (its hook on
  ``pxla.ExecuteReplicated.__call__``, which every first execution passes
  through: JAX's C++ fast path only takes a call whose first run in Python
  handed it the executable), and calls ``meet`` there;
- ``meet`` adds one to a counter under the program's name and its body
  (``entry["h"]``) in the coordination service's store (the name: its
  group, and a hash of its collectives, devices, function and inputs, alike
  in every process that runs the same program, whatever line or thread runs
  it); the process that makes its body's count whole says under ``all``
  that every process came with one body, and every other waits for that
  word.  Where the bodies differ no body's count is ever whole: each process
  that did not make one whole reads every body's count, and the one that
  finds every process counted in says that they came with bodies apart;
- a group that never arrives is the parting check's (``checks.parting``):
  the waiting process's wait names the program it meets on, and where every
  process of the group waits elsewhere or finished its script, the job
  stops, each side named at its line, with the program never run.

A healthy job waits only until its slowest member comes to the program,
which the program's first collective would make it wait for anyway.  The
last to come pays two round trips to the coordinator (its count, the word),
the others three (the count, the counts, the wait for the word).  Where the
bodies were one, the program is the same
in every way the programs check compares, and its post on the board is
taken back before the board's thread ever publishes it (``Board.withdraw``):
on a job that makes a new program every step, the board's round trips and
its thread's wake-ups cost 8-17% of the step on a 2-core machine, the rest
of the checks about 1% (``bench/meeting.py``, docs/divergence.md).  Later runs of an
agreed program are not seen at all (the C++ fast path stays on).  A compile
is no run: an executable made ahead of time, for its cost analysis or a
warm-up, is met on only if and when it runs.

What it misses: a process that runs a program it already ran (the others
agreed on it once) where the others do not (the parting check's, from the
waits); a group met on once is not met on again in this process, even where
JAX made the executable again; ``pmap``'s programs; a job run with
``--no-account`` waits at the meeting until the stall watchdog ends it.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from jaxrun import contract
from jaxrun.child.checks import store
from jaxrun.child.checks.program_text import group_text, program_hash

MEET = f"{store.PREFIX}/meet"  # MEET/{group}/{program}/b/{body}: how many came with it; .../all: every one came
ALIKE, DIFFER = "1", "2"  # the last one's word: every one came, with one body or not
SLICE_MS = 10_000  # a wait for the word, between checks that the store still answers
GONE_PAUSE = 1.0  # seconds between asks once the store stopped answering


def meeting_name(entry: dict, ranks) -> str:
    """The program's name in the store: alike in every process that is to run it."""
    return f"{group_text(ranks)}/{program_hash(entry['c'] + chr(10) + entry['fn'] + chr(10) + entry['in'])}"


class Meetings:
    """This process's meetings: the programs its groups agreed to run, and those under way."""

    def __init__(self, parting=None, client=store.jax_client):
        self.parting = parting  # told what the main thread meets on, for its wait's entry
        self.client = client
        self.agreed: set[str] = set()
        self.going: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def meet(self, entry: dict, ranks: list[int], main: bool) -> bool:
        """Wait until every process of ``ranks`` has come to the program
        ``entry`` describes.  True where this meeting found every process's
        body of it alike (``entry["h"]``): the program is the same in every
        way the programs check compares, and its post need not be judged."""
        name = meeting_name(entry, ranks)
        with self.lock:
            if name in self.agreed:
                return False
            going = self.going.get(name)
            if going is None:
                self.going[name] = threading.Event()
        if going is not None:  # another thread of this process meets on it now
            going.wait()
            return False
        if main and self.parting is not None:
            self.parting.meeting = {"fn": entry["fn"], "spans": group_text(ranks), "among": list(ranks),
                                    "at": entry["at"], "name": name}
        try:
            return self._rendezvous(name, len(ranks), entry.get("h", ""))
        except Exception as e:  # noqa: BLE001 - a store that cannot count: the program runs, as without the check
            if os.environ.get(contract.VERBOSE) == "1":
                print(f"jaxrun: --checks could not meet on a program: {type(e).__name__}: {e}", file=sys.stderr)
            return False
        finally:
            if main and self.parting is not None:
                self.parting.met()
            with self.lock:
                self.agreed.add(name)
                self.going.pop(name).set()

    def _rendezvous(self, name: str, count: int, body: str) -> bool:
        """Meet; whether every process's body was ``body``."""
        client = self.client()
        if client is None:
            return False
        # One round trip counts this process in under its body.  The one that makes its
        # body's count whole knows that every process came, each with this body.
        marks, word = f"{MEET}/{name}/b/", f"{MEET}/{name}/all"
        if client.key_value_increment(marks + (body or "-"), 1) >= count:
            client.key_value_set(word, ALIKE, allow_overwrite=True)
            return True
        # Else either some are still to come, or the bodies differ and no body's count is
        # ever whole: whoever counts every process in, over all bodies, says so.  The last
        # to count itself in reads after every increment, so one of them always does.
        bodies = client.key_value_dir_get(marks)
        if len(bodies) > 1 and sum(int(n) for _, n in bodies) >= count:
            client.key_value_set(word, DIFFER, allow_overwrite=True)
            return False
        while True:
            try:
                return client.blocking_key_value_get(word, SLICE_MS) == ALIKE
            except Exception as e:  # noqa: BLE001 - jax's error type has no public name
                if "DEADLINE_EXCEEDED" not in str(e):
                    # The store is gone: the job ends (JAX ends a process whose coordinator
                    # went).  Its collectives would pair with whatever the survivors run.
                    time.sleep(GONE_PAUSE)
