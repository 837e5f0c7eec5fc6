"""The board's transport: the coordination service's key-value store, as
the checks' board (``checks.agreement``) uses it, and the back-off of its looks.

The keys: each rank's entry under ``ENTRIES/{topic}/{rank}``; entries that
differ, for the ranks that did not judge, under ``VERDICTS/{topic}``;
``FINISHED/{rank}`` once that rank's script returned, and ``LEFT/{rank}`` once
its board stopped with topics open (it judges nothing more); ``WAITS/{rank}``
while that rank waits inside JAX at one line (the parting check's).  Each function
here is one or two of the store's calls; what the answers mean is the
board's to judge.

The looks back off: the first comes ``POLL`` seconds after a post
(``END_POLL`` once the script returned), each pause twice the last, up to
``SLOW_POLL``.
"""

from __future__ import annotations

import json

PREFIX = "jaxrun/checks"
ENTRIES = f"{PREFIX}/t"  # each rank's entry: ENTRIES/{topic}/{rank}
VERDICTS = f"{PREFIX}/v"  # entries that differ, for the ranks that did not judge: VERDICTS/{topic}
FINISHED = f"{PREFIX}/finished"  # FINISHED/{rank}: that rank's script returned
LEFT = f"{PREFIX}/left"  # LEFT/{rank}: ... and its board stopped: it judges nothing more
WAITS = f"{PREFIX}/wait"  # WAITS/{rank}: where that rank waits now (``checks.parting``)
POLL = 0.05  # seconds from a post to its first look (each look costs the coordinator a few keys)
END_POLL = 0.01  # ... once the script returned: its end, and its peers', wait on the looks
SLOW_POLL = 1.0  # each pause is twice the last, up to this


def backed_off(pause: float) -> float:
    """The pause after ``pause``."""
    return min(pause * 2, SLOW_POLL)


def publish(client, topic: str, rank: int, entry: dict) -> None:
    client.key_value_set(f"{ENTRIES}/{topic}/{rank}", json.dumps(entry), allow_overwrite=True)


def by_rank(client, folder: str) -> dict[int, dict]:
    """Every rank's JSON value in ``folder`` (``folder/{rank}``), by rank."""
    found = {}
    for key, value in client.key_value_dir_get(f"{folder}/"):
        tail = key.rsplit("/", 1)[1]
        if tail.isdigit():
            try:
                found[int(tail)] = json.loads(value)
            except ValueError:
                continue
    return found


def entries(client, topic: str) -> dict[int, dict]:
    """Every rank's entry under ``topic``, by rank."""
    return by_rank(client, f"{ENTRIES}/{topic}")


def has_entry(client, topic: str, rank: int) -> bool:
    return try_get(client, f"{ENTRIES}/{topic}/{rank}") is not None


def agreed(client, topic: str) -> None:
    """Every entry alike: the topic's keys go (a peer that finds its own gone knows)."""
    client.key_value_delete(f"{ENTRIES}/{topic}")


def post_verdict(client, topic: str, wanted: dict, gone: set) -> None:
    client.key_value_set(f"{VERDICTS}/{topic}", json.dumps(
        {"entries": {str(r): e for r, e in wanted.items()}, "gone": sorted(gone)}), allow_overwrite=True)


def verdict(client, topic: str, rank: int) -> tuple[dict, set] | None:
    """The judge's verdict on ``topic`` (entries by rank, ranks gone), where
    it wrote one; read, this rank's entry goes, so that the judge may sweep."""
    said = try_get(client, f"{VERDICTS}/{topic}")
    if said is None:
        return None
    found = json.loads(said)
    client.key_value_delete(f"{ENTRIES}/{topic}/{rank}")
    return {int(r): e for r, e in found["entries"].items()}, set(found["gone"])


def sweep(client, topic: str) -> None:
    client.key_value_delete(f"{ENTRIES}/{topic}")
    client.key_value_delete(f"{VERDICTS}/{topic}")


def say_finished(client, rank: int) -> None:
    client.key_value_set(f"{FINISHED}/{rank}", "1", allow_overwrite=True)


def say_left(client, rank: int) -> None:
    client.key_value_set(f"{LEFT}/{rank}", "1", allow_overwrite=True)


def finished(client, rank: int) -> bool:
    return try_get(client, f"{FINISHED}/{rank}") is not None


def left(client, rank: int) -> bool:
    return try_get(client, f"{LEFT}/{rank}") is not None


def post_wait(client, rank: int, wait: dict) -> None:
    client.key_value_set(f"{WAITS}/{rank}", json.dumps(wait), allow_overwrite=True)


def clear_wait(client, rank: int) -> None:
    client.key_value_delete(f"{WAITS}/{rank}")


def waits(client) -> dict[int, dict]:
    """Every rank's wait, by rank."""
    return by_rank(client, WAITS)


class Finished:
    """The ranks whose script returned, read at most once per look, and only if asked."""

    def __init__(self, client):
        self.client, self.known = client, None

    def ranks(self) -> set[int]:
        if self.known is None:
            self.known = {int(k.rsplit("/", 1)[1]) for k, _ in self.client.key_value_dir_get(f"{FINISHED}/")}
        return self.known


def try_get(client, key: str) -> str | None:
    """The key's value, or None where the store has no such key."""
    try:
        return client.key_value_try_get(key)
    except Exception as e:  # jax's JaxRuntimeError has no public name: NOT_FOUND is an answer, the rest not
        if "NOT_FOUND" in str(e):
            return None
        raise


def jax_client():
    from jax._src import distributed

    return distributed.global_state.client
