"""Child side: ``--check-divergence``, the strict check that every process
runs the same program at the same call.

The flight recorder (:mod:`jaxrun.child.checks.flight`) hooks every execution; for
one that spans processes it asks the ``Checker`` here first, which agrees on
the program with the other processes through the coordination service's
key-value store.  The first process that differs stops the job with a
``DivergenceError`` naming each side.
"""

from __future__ import annotations

import os
import time

from jaxrun.child import ending


class DivergenceError(RuntimeError):
    """Processes were about to run different programs at the same call."""


class Checker:
    """One key-value round trip per execution that spans processes: set this
    process's entry for the call, then wait for one peer's (process 0's; for
    process 0, process 1's).  Everyone who differs from process 0 finds out,
    and process 0 finds out when it is the odd one, or runs on after its peer
    finished the script."""

    PREFIX = "jaxrun/divergence"
    BLOCK = 1024  # calls per key folder; a folder is deleted once everyone is past it
    WAIT_SLICE_MS = 1000  # between looks at whether the peer finished the script
    GATHER_WAIT = 3.0  # on a difference: how long to wait for everyone's entry

    def __init__(self, rank: int, count: int):
        self.rank, self.count = rank, count
        self.peer = 1 if rank == 0 else 0
        self.client = None

    def _client(self):
        if self.client is None:
            from jax._src import distributed

            self.client = distributed.global_state.client
        return self.client

    def _key(self, call: int, rank: int) -> str:
        return f"{self.PREFIX}/calls/{call // self.BLOCK}/{call}/{rank}"

    def agree(self, call: int, program, occurrence: int, file: str, line: int) -> None:
        """``program``: the recorder's ``flight.Program`` for this execution."""
        import json

        client = self._client()
        if client is None:
            return
        if call % self.BLOCK == 0:
            self._entered_folder(client, call // self.BLOCK)
        mine = {"fn": program.function, "n": occurrence, "fp": program.fingerprint, "in": program.inputs,
                "at": f"{file}:{line}"}
        client.key_value_set(self._key(call, self.rank), json.dumps(mine))
        theirs = self._wait_for_peer(client, call)
        if theirs is None or theirs.get("fp") != mine["fp"]:
            self._stop(client, call, mine)

    def _wait_for_peer(self, client, call: int) -> dict | None:
        """The peer's entry for ``call``; None once the peer finished the
        script without making it."""
        import json

        key = self._key(call, self.peer)
        while True:
            try:
                return json.loads(client.blocking_key_value_get(key, self.WAIT_SLICE_MS))
            except Exception as e:  # noqa: BLE001 - jax's error type moves between versions
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise
            made = self._finished(client).get(self.peer)
            if made is not None and made < call:
                return None

    def _finished(self, client) -> dict[int, int]:
        """Processes that finished the script: rank -> the calls it made."""
        return {int(k.rsplit("/", 1)[1]): int(v) for k, v in client.key_value_dir_get(f"{self.PREFIX}/end/")}

    def _entered_folder(self, client, folder: int) -> None:
        """Everyone in folder ``folder`` has read every entry of the one
        before: the last to arrive deletes it, so that a long run does not
        grow the coordination service's store."""
        counter = f"{self.PREFIX}/entered/{folder}"
        if client.key_value_increment(counter, 1) == self.count:
            client.key_value_delete(f"{self.PREFIX}/calls/{folder - 1}")
            client.key_value_delete(counter)

    def script_returned(self, calls: int) -> None:
        client = self._client()
        if client is None:
            return
        try:
            client.key_value_set(f"{self.PREFIX}/end/{self.rank}", str(calls))
        except Exception:  # noqa: BLE001 - the script is done; a dead service changes nothing
            pass

    def _stop(self, client, call: int, mine: dict) -> None:
        """Gather what every process runs at ``call``, say it, and leave."""
        import json

        folder = f"{self.PREFIX}/calls/{call // self.BLOCK}/{call}/"
        deadline = time.monotonic() + self.GATHER_WAIT
        while True:
            seen = {int(k.rsplit("/", 1)[1]): json.loads(v) for k, v in client.key_value_dir_get(folder)}
            seen[self.rank] = mine
            finished = {r: n for r, n in self._finished(client).items() if r not in seen}
            if len(seen) + len(finished) >= self.count or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        headline, lines = describe_difference(call, seen, finished, self.count)
        text = "".join(f"jaxrun: {line}\n" for line in lines)
        error = DivergenceError(headline)
        ending.judged(error, text, text)


def describe_difference(call: int, seen: dict[int, dict], finished: dict[int, int],
                        count: int) -> tuple[str, list[str]]:
    """(one-line message, lines for stderr) naming each side at ``call``:
    what it runs and where, and which processes are on it.  Smaller sides
    first: the odd one out leads."""
    sides: dict[str, list[int]] = {}
    said: dict[str, str] = {}
    for rank, entry in sorted(seen.items()):
        key = entry.get("fp", "?")
        sides.setdefault(key, []).append(rank)
        said[key] = (f"{entry.get('fn')}#{entry.get('n')} [program {key}] at "
                     f"{os.path.basename(str(entry.get('at', '?')))}")
        said[key + "/long"] = (f"{entry.get('fn')}#{entry.get('n')}, program {key}, inputs {entry.get('in') or '-'}, "
                               f"called at {entry.get('at')}")
    for rank, made in sorted(finished.items()):
        key = f"finished/{made}"
        sides.setdefault(key, []).append(rank)
        said[key] = said[key + "/long"] = f"finished the script after {made} calls"
    missing = [r for r in range(count) if r not in seen and r not in finished]
    if missing:
        sides["missing"] = missing
        said["missing"] = said["missing/long"] = "not at this call yet"
    order = sorted(sides, key=lambda k: (len(sides[k]), sides[k][0]))

    def who(ranks: list[int]) -> str:
        return ("process " if len(ranks) == 1 else "processes ") + ", ".join(map(str, ranks))

    def verb(key: str, ranks: list[int]) -> str:
        plural = len(ranks) > 1
        if key.startswith("finished/"):
            return "had " + said[key]
        if key == "missing":
            return ("were " if plural else "was ") + said[key]
        return ("run " if plural else "runs ") + said[key]

    headline = f"call {call} differs across processes: " + "; ".join(
        f"{who(sides[k])} {verb(k, sides[k])}" for k in order)
    lines = [f"--check-divergence: the processes part at call {call} (counting programs that span processes):"]
    lines += [f"  {who(sides[k])}: {said[k + '/long']}" for k in order]
    lines.append("  stopping the job before that call runs")
    return headline, lines
