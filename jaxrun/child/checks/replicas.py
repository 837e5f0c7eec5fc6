"""Child side of ``--checks``: replicas built from per-process data agree.

JAX builds a global array from what each process passes
(``jax.make_array_from_process_local_data``, ``make_array_from_callback``,
``make_array_from_single_device_arrays``) without looking across processes:
when the sharding puts one slice on devices of several processes (a model
replica that spans hosts) and those processes load different data, the job
computes a silently wrong result.  jaxrun wraps the three calls:

- which calls are checked is decided from the call site (the user's file
  basename, line and function: alike on every host) and its call count alone:
  the first ``FIRST`` calls, then each call whose count is a power of two
  (every call under ``--checks strict``), so processes that share a slice
  always check the same calls (:mod:`jaxrun.child.checks.replicas_prints`);
- only the main thread's calls are counted and checked: it makes them in the
  script's order, the same in every process.  Calls from other threads (a
  prefetching loader's) come in the order their scheduling gives, so the n-th
  call at a line may hold batch n in one process and batch n+1 in another; a
  difference there would be the threads' order, not the data's;
- on such a call, this process fingerprints each slice it holds that other
  processes hold too (host data: ``blake2b`` of its bytes; a device-resident
  input: a small checksum computed on its device, read back only on the
  board's thread) and posts them, one entry per group of processes that
  hold the same slices, among that group;
- the board (:mod:`jaxrun.child.checks.agreement`) compares them off the step's
  path; a difference ends the process that finds it with a
  :class:`ReplicaMismatchError` naming the slice, the processes and the line;
- host data of a floating or integer batch that is byte-for-byte the same in
  every process although the sharding gives them different slices (every host
  read the whole dataset) is warned of once per call site, by the lowest
  rank.  Constant arrays and ranges along an axis (position ids, masks) are
  never flagged.

An unsampled call costs a walk up the stack and a count.  Nothing here runs
per execution of a compiled program.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading

from jaxrun import contract

CALLS = ("make_array_from_callback", "make_array_from_process_local_data", "make_array_from_single_device_arrays")


class ReplicaMismatchError(AssertionError):
    """Devices that should hold the same data do not."""


def install(board, strict: bool) -> None:
    """Wrap the three calls where jax defines them and where ``jax`` binds them.
    A process restarted alone (a recoverable job) checks nothing: its calls
    count from 1 again while its peers' entries in the store are from their
    first calls, so it would compare unlike batches."""
    if os.environ.get(contract.PROCESS_RESTARTS, "0") not in ("", "0"):
        return
    import jax

    try:
        from jax._src import array
    except ImportError:
        array = None
    missing = [name for name in CALLS if not callable(getattr(array, name, None))]
    if missing:
        _missing_hook_points(board, strict, missing, jax)
        return
    from jaxrun.child.checks import replicas_prints

    checker = ReplicaCheck(board, strict, replicas_prints)
    for name in CALLS:
        original = getattr(array, name)
        if getattr(original, "_jaxrun_checks", False):
            continue  # already wrapped (a preloaded jax kept across installs)
        wrapped = checker.wrap(name, original)
        setattr(array, name, wrapped)
        if getattr(jax, name, None) is original:
            setattr(jax, name, wrapped)


def _missing_hook_points(board, strict: bool, missing: list[str], jax) -> None:
    what = ", ".join(f"jax._src.array.{name}" for name in missing)
    version = getattr(jax, "__version__", "?")
    if strict:
        from jaxrun.child.checks import agreement

        error = RuntimeError(f"--checks strict: this jax ({version}) lacks {what}, "
                             "where the replica check hooks in")
        agreement.stop(error, [str(error)])
    elif board.rank == 0:
        print(f"jaxrun: --checks: the replica check is off: this jax ({version}) lacks {what}",
              file=sys.stderr)


class ReplicaCheck:
    """The wrapped calls' shared state: the count per call site, and what was warned of."""

    def __init__(self, board, strict: bool, prints):
        self.board, self.strict, self.prints = board, strict, prints
        self.sites: dict = {}  # (code, line) of the caller -> (site, where, its call counter)
        self.counters: dict[str, itertools.count] = {}
        self.lock = threading.Lock()
        self.local = threading.local()  # .captures while a checked call runs
        self.warned: set[str] = set()
        self.skip = prints.skipped_folders()
        self.main = threading.main_thread()

    def wrap(self, kind: str, original):
        checker = self

        def call(*args, **kwargs):
            captures = getattr(checker.local, "captures", None)
            if captures is not None:  # inside a checked call (process-local data builds via a callback)
                if kind == "make_array_from_callback":
                    args, kwargs = checker.prints.capturing(args, kwargs, captures)
                return original(*args, **kwargs)
            if threading.current_thread() is not checker.main:
                return original(*args, **kwargs)  # its n-th call here is whichever batch the threads' order gave
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(checker.skip[0]):
                return original(*args, **kwargs)  # jax's own use (its token arrays)
            site, where, count = checker.site_of(caller)
            n = next(count)
            if not (checker.strict or checker.prints.sampled(n)):
                return original(*args, **kwargs)
            captures = []
            if kind == "make_array_from_callback":
                args, kwargs = checker.prints.capturing(args, kwargs, captures)
            checker.local.captures = captures
            try:
                out = original(*args, **kwargs)
            finally:
                checker.local.captures = None
            checker.check(kind, site, where, n, out, captures)
            return out

        call.__wrapped__ = original
        call.__name__ = call.__qualname__ = getattr(original, "__name__", kind)
        call.__doc__ = getattr(original, "__doc__", None)
        call._jaxrun_checks = True
        return call

    def site_of(self, caller) -> tuple:
        """The call site of a call from ``caller``, and its counter (``next`` is
        atomic): a dict lookup once the site is known."""
        known = self.sites.get((caller.f_code, caller.f_lineno))
        if known is None:
            site, where = self.prints.site_of(caller, self.skip)
            with self.lock:
                count = self.counters.setdefault(site, itertools.count(1))
            if caller.f_code.co_filename.startswith(self.skip[1]):  # jaxrun's helper: the user's line varies
                return site, where, count
            known = self.sites[caller.f_code, caller.f_lineno] = (site, where, count)
        return known

    def check(self, kind: str, site: str, where: str, n: int, out, captures: list) -> None:
        """Post this call's fingerprints; a failure here never fails the user's call."""
        try:
            import jax

            leaves = jax.tree_util.tree_leaves(out)
            if len(captures) != len(leaves):
                captures = [{} for _ in leaves]
            call = CheckedCall(kind, site, where, n)
            for leaf, (array, captured) in enumerate(zip(leaves, captures)):
                self._post_array(call, leaf, array, captured)
        except Exception as e:  # noqa: BLE001 - a check that cannot run says so under -v only
            if os.environ.get(contract.VERBOSE) == "1":
                print(f"jaxrun: --checks could not check {where}: {type(e).__name__}: {e}", file=sys.stderr)

    def _post_array(self, call: CheckedCall, leaf: int, array, captured: dict) -> None:
        """One post per group of processes that share slices: each slice's
        fingerprint, and one over them all to compare at a glance."""
        prints, rank = self.prints, self.board.rank
        shape = tuple(array.shape)
        layout = prints.layout_of(array.sharding, shape)
        topic = f"{call.site}/{call.n}.{leaf}"
        hashed: dict = {}
        groups: dict[tuple, dict] = {}  # the processes that hold them -> {slice: its print}
        for shard in array.addressable_shards:
            key = prints.key_of(shard.index, shape)
            holders = layout.holders.get(key, ())
            if len(holders) < 2 or key in groups.get(holders, ()):
                continue
            value = captured.get(key)
            if value is not None and not prints.on_device(value):
                hashed[key] = prints.host_print(value)
                groups.setdefault(holders, {})[key] = {"fp": hashed[key], "device": str(shard.device)}
            else:
                part = prints.device_print(shard.data, str(shard.device))
                if part is not None:
                    groups.setdefault(holders, {})[key] = part
        for holders, parts in groups.items():
            self.board.post(f"replicas/{topic}/{'-'.join(map(str, holders))}", prints.group_entry(parts),
                            holders, self._judge(call, sorted(parts)), same=_same)
        if layout.differs and rank in layout.slices_of and captured:
            self.board.post(f"sameness/{topic}", {"fp": prints.batch_print(captured, layout.slices_of[rank], hashed)},
                            sorted(layout.slices_of), self._sameness(call))

    def _judge(self, call: CheckedCall, keys: list):
        def settled(topic: str, entries: dict, gone: set) -> None:
            del topic, gone  # a process that finished without this call is the program check's to name
            if len({e["fp"] for e in entries.values()}) > 1:
                self._mismatch(call, keys, entries)

        return settled

    def _mismatch(self, call: CheckedCall, keys: list, entries: dict) -> None:
        from jaxrun.child.checks import agreement

        texts = [self.prints.key_text(k) for k in keys]
        differ = [i for i, t in enumerate(texts) if len({e["slices"][t]["fp"] for e in entries.values()}) > 1]
        first = differ[0] if differ else 0
        where, text = self.prints.index_text(keys[first]), texts[first]
        groups: dict[str, list[int]] = {}
        for rank, entry in sorted(entries.items()):
            groups.setdefault(entry["slices"][text]["fp"], []).append(rank)
        parts = []
        for fp, ranks in sorted(groups.items(), key=lambda g: g[1][0]):
            holders = ", ".join(f"{entries[r]['slices'][text]['device']} (process {r})" for r in ranks)
            parts.append(f"checksum {fp[:8]} on {holders}")
        ranks = sorted(entries)
        others = len(differ) - 1
        more = f" ({others} more slice{'s' if others > 1 else ''} they share differ{'' if others > 1 else 's'} too)" \
            if others else ""
        error = ReplicaMismatchError(
            f"replicas differ at {call.where} ({call.kind}, call {call.n} there): "
            f"slice {where} of the global array: " + "; ".join(parts))
        agreement.stop(error, [
            f"processes {', '.join(map(str, ranks))} hold slice {where} of the array built at {call.where} "
            f"(call {call.n} there), and hold different data for it{more}",
            "processes that share a slice must load the same data: read the input by replica stream "
            "(jaxrun.replica_input_index), not by process index",
        ])

    def _sameness(self, call: CheckedCall):
        def settled(topic: str, entries: dict, gone: set) -> None:
            del topic
            prints = {e["fp"] for e in entries.values()}
            if gone or len(prints) != 1 or None in prints or call.site in self.warned:
                return
            self.warned.add(call.site)
            if self.board.rank == min(entries):
                print(f"jaxrun: warning: every process passed the same data to {call.kind} at {call.where} "
                      f"(call {call.n} there), though its sharding gives them different slices: "
                      "did every host read the whole dataset?", file=sys.stderr, flush=True)

        return settled


class CheckedCall:
    __slots__ = ("kind", "site", "where", "n")

    def __init__(self, kind: str, site: str, where: str, n: int):
        self.kind, self.site, self.where, self.n = kind, site, where, n


def _same(mine: dict, theirs: dict) -> bool:
    return mine["fp"] == theirs["fp"]
