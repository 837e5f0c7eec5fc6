"""The programs check's pure parts (jaxrun/child/programs.py): the message a
difference gives, the topics and positions each process posts, the
fingerprint's stability, and who stops first.  Real jobs are in
tests/e2e/test_checks_programs.py."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from jaxrun.child import hooks, programs

MODULE = '''module @jit_{name} attributes {{mhlo.num_partitions = 8 : i32}} {{
  func.func public @main(%arg0: tensor<8x4xf32>) -> tensor<8x4xf32> {{
    %0 = stablehlo.{op} %arg0, %arg0 : tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }}
}}
'''


def entry(h, fn="matmul", inputs="f32[8,4], f32[4,8]", sh="P('b', None), P(None, 'b')", at="/w/job.py:10"):
    return {"h": h, "fn": fn, "in": inputs, "sh": sh, "at": at}


def test_the_fingerprint_leaves_out_the_modules_name_but_not_its_body():
    add = programs.program_hash(MODULE.format(name="step", op="add"))
    assert programs.program_hash(MODULE.format(name="train_step_1", op="add")) == add
    assert programs.program_hash(MODULE.format(name="step", op="multiply")) != add


def test_the_fingerprint_prints_the_module_without_locations():
    asked = {}

    class Operation:
        def get_asm(self, **kw):
            asked.update(kw)
            return MODULE.format(name="f", op="add")

    module = types.SimpleNamespace(operation=Operation())
    assert programs.fingerprint(module) == programs.program_hash(MODULE.format(name="g", op="add"))
    assert asked == {"enable_debug_info": False}


@pytest.mark.parametrize("ranks, text", [([0, 1, 2, 3], "0-3"), ([3, 1, 2], "1-3"), ([0, 2, 5], "0,2,5"),
                                         ([4, 5], "4,5")])
def test_a_group_is_named_alike_in_every_process(ranks, text):
    assert programs.group_text(ranks) == text


@pytest.mark.parametrize("name, function", [("jit(train_step)", "train_step"), ("pjit(f)", "f"),
                                            ("jit(<lambda>)", "<lambda>"), ("", "?")])
def test_the_function_is_named_without_jit(name, function):
    assert programs.function_name(name) == function


def test_inputs_and_shardings_are_short():
    class Spec:
        def __str__(self):
            return "PartitionSpec('b', None)"

    avals = [types.SimpleNamespace(dtype="float32", shape=(8, 4)), types.SimpleNamespace(dtype="bfloat16", shape=()),
             3]
    assert programs.inputs_text(avals) == "f32[8,4], bf16[], int"
    assert programs.inputs_text([avals[1]] * 10) == ", ".join(["bf16[]"] * 8 + ["+2"])
    unspecified = type("UnspecifiedValue", (), {})()
    assert programs.shardings_text([types.SimpleNamespace(spec=Spec()), unspecified]) == "P('b', None), -"


def test_the_odd_side_leads_and_a_tie_goes_to_the_lowest_rank():
    entries = {0: entry("a"), 1: entry("a"), 2: entry("a"), 3: entry("b")}
    assert programs.sides_of(entries) == [[3], [0, 1, 2]]
    assert programs.sides_of({0: entry("a"), 1: entry("a"), 2: entry("b"), 3: entry("b")}) == [[0, 1], [2, 3]]


def test_the_message_names_each_side_its_line_and_what_differs():
    entries = {0: entry("a"), 1: entry("a"), 2: entry("a"),
               3: entry("b", inputs="f32[4,8], f32[8,4]", sh="P(None, 'b'), P('b', None)", at="/w/job.py:12")}
    headline, lines = programs.describe(3, "0-3", entries, set(), [0, 1, 2, 3])
    assert headline == ("program 3 of processes 0-3 differs (shapes, shardings): "
                        "process 3 made matmul(f32[4,8], f32[8,4]) at job.py:12; "
                        "processes 0, 1, 2 made matmul(f32[8,4], f32[4,8]) at job.py:10")
    assert lines[1] == ("  process 3: matmul(f32[4,8], f32[8,4]) at /w/job.py:12, sharded P(None, 'b'), "
                        "P('b', None), program b")
    assert lines[2].startswith("  processes 0, 1, 2: matmul(f32[8,4], f32[4,8]) at /w/job.py:10")


def test_the_message_says_who_finished_and_who_is_not_there_yet():
    entries = {0: entry("a"), 2: entry("c", fn="eval_step")}
    headline, lines = programs.describe(1, "0-3", entries, {3}, [0, 1, 2, 3])
    assert headline.startswith("program 1 of processes 0-3 differs (function): process 0 made matmul")
    assert "  process 3: finished its script without it" in lines
    assert "  process 1: not at program 1 yet" in lines


def test_a_program_communicates_when_its_hlo_holds_a_collective():
    assert programs.communicates(Executable("all-reduce-start")) and programs.communicates(Executable("send"))
    assert not programs.communicates(Executable("add")) and not programs.communicates(Executable("all-reducer"))
    assert programs.communicates(object())  # unknown: compared


def test_a_body_alone_can_differ():
    assert programs.what_differs({0: entry("a"), 1: entry("b")}, [[0], [1]]) == "body"


class Board:
    def __init__(self, rank, count=4):
        self.rank, self.count, self.posts = rank, count, []

    def post(self, topic, entry, among, settled, same=None):
        self.posts.append((topic, entry, list(among), settled, same))


class Device:
    def __init__(self, process_index):
        self.process_index = process_index


def given(ranks, op="add", name="jit(step)"):
    operation = types.SimpleNamespace(get_asm=lambda **kw: MODULE.format(name="x", op=op))
    return {"name": name, "hlo": types.SimpleNamespace(operation=operation),
            "global_in_avals": [types.SimpleNamespace(dtype="float32", shape=(8, 4))], "in_shardings": [],
            "device_list": [Device(r) for r in ranks for _ in range(2)]}


class Executable:
    """What from_hlo made: its compiled HLO holds ``op``."""

    def __init__(self, op="all-reduce"):
        module = types.SimpleNamespace(to_string=lambda: f"  %r = f32[] {op}(f32[] %x), replica_groups={{}}")
        self.xla_executable = types.SimpleNamespace(hlo_modules=lambda: [module])


COLLECTIVE = Executable()


def checker(rank):
    locator = types.SimpleNamespace(user_frame=lambda frame: ("/w/job.py", 7))
    board = Board(rank)
    return board, programs.Programs(board, locator)


def test_each_group_counts_its_own_programs_once_each():
    board, check = checker(rank=1)
    check.got(given([0, 1, 2, 3]), COLLECTIVE)
    check.got(given([0, 1, 2, 3]), COLLECTIVE)  # the same program again (a new jit of the same function): once
    check.got(given([0, 1], op="multiply"), Executable("all-gather-start"))
    check.got(given([0, 1, 2, 3], op="subtract"), Executable("add"))  # no collective: nobody waits in it
    check.got(given([0, 1, 2, 3], op="multiply"), Executable("collective-permute"))
    check.got(given([1]), COLLECTIVE)  # process-local: nobody to agree with
    check.got(given([2, 3]), COLLECTIVE)  # not this process's
    assert [(topic, among) for topic, _, among, _, _ in board.posts] == [
        ("programs/0-3/1", [0, 1, 2, 3]), ("programs/0,1/1", [0, 1]), ("programs/0-3/2", [0, 1, 2, 3])]
    topic, posted, _, _, same = board.posts[0]
    assert posted == {"h": programs.program_hash(MODULE.format(name="y", op="add")), "fn": "step",
                      "in": "f32[8,4]", "sh": "", "at": "/w/job.py:7"}
    assert same(posted, dict(posted, at="/elsewhere/job.py:99", fn="other")) and not same(posted, dict(posted, h="z"))


def test_another_threads_programs_count_apart_and_the_boards_own_not_at_all():
    board, check = checker(rank=0)
    for name in ("loader", programs.agreement.THREAD):
        thread = threading.Thread(target=check.got, args=(given([0, 1]), COLLECTIVE), name=name)
        thread.start()
        thread.join()
    check.got(given([0, 1]), COLLECTIVE)
    assert [topic for topic, *_ in board.posts] == ["programs/0,1/loader/1", "programs/0,1/1"]


@pytest.mark.parametrize("rank, waits", [(3, []), (0, [programs.LATER])])
def test_the_odd_side_stops_at_once_and_the_others_later(monkeypatch, rank, waits):
    stopped, slept = [], []
    monkeypatch.setattr(programs.agreement, "stop", lambda error, lines: stopped.append((error, lines)))
    monkeypatch.setattr(programs.time, "sleep", slept.append)
    board, check = checker(rank)
    check.got(given([0, 1, 2, 3]), COLLECTIVE)
    settled = board.posts[0][3]
    settled("programs/0-3/1", {0: entry("a"), 1: entry("a"), 2: entry("a"), 3: entry("b")}, set())
    assert slept == waits
    (error, lines), = stopped
    assert type(error).__name__ == "ProgramMismatchError" and str(error).startswith("program 1 of processes 0-3")
    stopped.clear()
    settled("programs/0-3/1", {0: entry("a"), 1: entry("a"), 2: entry("a")}, {3})  # agreed; 3 finished
    assert stopped == []


def test_two_patches_of_one_module_both_run(tmp_path, monkeypatch):
    """--check-divergence and --checks both patch jax as it is imported."""
    (tmp_path / "patched_twice.py").write_text("value = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(hooks._finder, "patches", {})
    seen = []
    hooks.after_import("patched_twice", lambda m: seen.append(("first", m.value)))
    hooks.after_import("patched_twice", lambda m: seen.append(("then", m.value)))
    try:
        import patched_twice  # noqa: F401
    finally:
        sys.modules.pop("patched_twice", None)
    assert seen == [("first", 1), ("then", 1)]
