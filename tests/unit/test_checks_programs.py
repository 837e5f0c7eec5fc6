"""The programs check's pure parts (jaxrun/child/checks/programs.py): the message a
difference gives, the topics and positions each process posts, the
fingerprint's stability, and who stops first.  Real jobs are in
tests/e2e/test_checks_programs.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import types

import pytest

from jaxrun.child import hooks
from jaxrun.child.checks import program_text, programs

MODULE = '''module @jit_{name} attributes {{mhlo.num_partitions = 8 : i32}} {{
  func.func public @main(%arg0: tensor<8x4xf32>) -> tensor<8x4xf32> {{
    %0 = stablehlo.{op} %arg0, %arg0 : tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }}
}}
'''


def entry(h, fn="matmul", inputs="f32[8,4], f32[4,8]", sh="P('b', None), P(None, 'b')", at="/w/job.py:10", c=None,
          cs="all-gather f32[8,8]"):
    """A program's entry; its collectives ``c`` differ where its body ``h`` does, unless given."""
    return {"h": h, "c": c or h, "cs": cs, "fn": fn, "in": inputs, "sh": sh, "at": at}


def test_the_fingerprint_leaves_out_the_modules_name_but_not_its_body():
    add = program_text.program_hash(MODULE.format(name="step", op="add"))
    assert program_text.program_hash(MODULE.format(name="train_step_1", op="add")) == add
    assert program_text.program_hash(MODULE.format(name="step", op="multiply")) != add


def test_the_fingerprint_prints_the_module_without_locations():
    asked = {}

    class Operation:
        def get_asm(self, **kw):
            asked.update(kw)
            return MODULE.format(name="f", op="add")

    module = types.SimpleNamespace(operation=Operation())
    assert program_text.fingerprint(module) == program_text.program_hash(MODULE.format(name="g", op="add"))
    assert asked == {"enable_debug_info": False, "assume_verified": True}


def test_printed_as_verified_a_real_module_gives_the_fingerprint_its_verified_print_gives():
    jax = pytest.importorskip("jax")
    lowered = jax.jit(lambda x: (x * 2.0).sum()).lower(jax.ShapeDtypeStruct((4, 3), "float32"))
    module = lowered.compiler_ir("stablehlo")
    verified = module.operation.get_asm(enable_debug_info=False)
    assert program_text.fingerprint(module) == program_text.program_hash(verified)


@pytest.mark.parametrize("ranks, text", [([0, 1, 2, 3], "0-3"), ([3, 1, 2], "1-3"), ([0, 2, 5], "0,2,5"),
                                         ([4, 5], "4,5")])
def test_a_group_is_named_alike_in_every_process(ranks, text):
    assert program_text.group_text(ranks) == text


@pytest.mark.parametrize("name, function", [("jit(train_step)", "train_step"), ("pjit(f)", "f"),
                                            ("jit(<lambda>)", "<lambda>"), ("", "?")])
def test_the_function_is_named_without_jit(name, function):
    assert program_text.function_name(name) == function


def test_inputs_and_shardings_are_short():
    class Spec:
        def __str__(self):
            return "PartitionSpec('b', None)"

    avals = [types.SimpleNamespace(dtype="float32", shape=(8, 4)), types.SimpleNamespace(dtype="bfloat16", shape=()),
             3]
    assert program_text.inputs_text(avals) == "f32[8,4], bf16[], int"
    assert program_text.inputs_text([avals[1]] * 10) == ", ".join(["bf16[]"] * 8 + ["+2"])
    unspecified = type("UnspecifiedValue", (), {})()
    assert program_text.shardings_text([types.SimpleNamespace(spec=Spec()), unspecified]) == "P('b', None), -"


def test_the_odd_side_leads_and_a_tie_goes_to_the_lowest_rank():
    entries = {0: entry("a"), 1: entry("a"), 2: entry("a"), 3: entry("b")}
    assert program_text.sides_of(entries) == [[3], [0, 1, 2]]
    assert program_text.sides_of({0: entry("a"), 1: entry("a"), 2: entry("b"), 3: entry("b")}) == [[0, 1], [2, 3]]


def test_the_message_names_each_side_its_line_and_what_differs():
    entries = {0: entry("a"), 1: entry("a"), 2: entry("a"),
               3: entry("b", inputs="f32[4,8], f32[8,4]", sh="P(None, 'b'), P('b', None)", at="/w/job.py:12")}
    headline, lines = program_text.describe(3, "0-3", entries, set(), [0, 1, 2, 3])
    assert headline == ("program 3 of processes 0-3 differs (shapes, shardings): "
                        "process 3 made matmul(f32[4,8], f32[8,4]) sharded P(None, 'b'), P('b', None) at job.py:12; "
                        "processes 0, 1, 2 made matmul(f32[8,4], f32[4,8]) sharded P('b', None), P(None, 'b') "
                        "at job.py:10")
    assert lines[1] == ("  process 3: matmul(f32[4,8], f32[8,4]) at /w/job.py:12, sharded P(None, 'b'), "
                        "P('b', None), collectives all-gather f32[8,8], program b")
    assert lines[2].startswith("  processes 0, 1, 2: matmul(f32[8,4], f32[4,8]) at /w/job.py:10")


def test_the_message_says_who_finished_and_who_is_not_there_yet():
    entries = {0: entry("a"), 2: entry("c", fn="eval_step")}
    headline, lines = program_text.describe(1, "0-3", entries, {3}, [0, 1, 2, 3])
    assert headline.startswith("program 1 of processes 0-3 differs (function): process 0 made matmul")
    assert "  process 3: finished its script without it" in lines
    assert "  process 1: not at program 1 yet" in lines


def test_a_programs_collectives_are_read_from_its_hlo_without_names_or_places():
    assert program_text.collectives_of(Executable("all-reduce-start")) == ["all-reduce f32[] replica_groups={}"]
    assert program_text.collectives_of(Executable("send")) == ["send f32[] replica_groups={}"]
    assert program_text.collectives_of(Executable("add")) == []
    assert program_text.collectives_of(Executable("all-reducer")) == []
    assert program_text.collectives_of(object()) == ["?"]  # unknown: compared
    line = ("  ROOT %all-reduce.7 = f32[8,8]{1,0} all-reduce(%fusion.3), channel_id=4, "
            "replica_groups=mesh['axis_0'=1,'axis_1'=4] {'axis_1'}, use_global_device_ids=true, "
            "to_apply=%add.clone, metadata={op_name=\"jit(mm)/dot_general\" stack_frame_id=2}")
    assert program_text.collectives_of(Executable(text=line)) == [
        "all-reduce f32[8,8] replica_groups=mesh['axis_0'=1,'axis_1'=4] {'axis_1'} use_global_device_ids=true"]


SHORT_AND_FULL = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxrun.child.checks import program_text
mesh = jax.make_mesh((2, 2), ("a", "b"))
x = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P("a", "b")))
spec = dict(mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b"))
programs = [jnp.mean, jax.jit(lambda v: v, out_shardings=NamedSharding(mesh, P())),
            lambda v: jnp.dot(v, v.T, out_sharding=NamedSharding(mesh, P("a", None))),
            jax.shard_map(lambda v: jax.lax.psum_scatter(v, "a", tiled=True), **spec),
            jax.shard_map(lambda v: jax.lax.ppermute(v, "a", [(0, 1), (1, 0)]), **spec),
            jax.shard_map(lambda v: jax.lax.all_to_all(v, "b", 0, 1, tiled=True), **spec)]
for program in programs:
    executable = jax.jit(program).lower(x).compile()._executable
    short = program_text.collectives_of(executable)
    short_print, program_text._print_options = program_text._print_options, lambda: None  # the full print
    full = program_text.collectives_of(executable)
    program_text._print_options = short_print
    print(short == full and bool(short) and short != ["?"], short, full)
"""


def test_the_compiled_modules_short_print_reads_every_collective_as_its_full_print_does():
    """The scan prints the compiled module without metadata (a third of the
    time): for an all-reduce, all-gather, all-reduce after a gather,
    reduce-scatter, collective-permute and all-to-all on a real 2x2 mesh, it
    reads what the module's full print gives."""
    pytest.importorskip("jax")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", SHORT_AND_FULL], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 6 and all(line.startswith("True ") for line in lines), done.stdout
    assert {"reduce-scatter", "collective-permute", "all-to-all"} <= {c.split()[0] for line in lines
                                                                      for c in re.findall(r"'([a-z-]+) ", line)}


def test_a_body_alone_can_differ_and_the_collectives_are_named_only_where_nothing_else_differs():
    assert program_text.what_differs({0: entry("a", c="x"), 1: entry("b", c="x")}, [[0], [1]]) == ["body"]
    alike = {0: entry("a", cs="all-reduce f32[]"), 1: entry("b", cs="all-gather f32[8]")}
    assert program_text.what_differs(alike, [[0], [1]]) == ["collectives"]
    headline, _ = program_text.describe(2, "0,1", alike, set(), [0, 1])
    assert headline == ("program 2 of processes 0,1 differs (collectives): "
                        "process 0 made matmul(f32[8,4], f32[4,8]) with all-reduce f32[] at job.py:10; "
                        "process 1 made matmul(f32[8,4], f32[4,8]) with all-gather f32[8] at job.py:10")
    shaped = {0: entry("a", cs="all-reduce f32[]"), 1: entry("b", inputs="f32[2]", cs="all-gather f32[8]")}
    assert program_text.what_differs(shaped, [[0], [1]]) == ["shapes"]


class Board:
    def __init__(self, rank, count=4):
        self.rank, self.count, self.posts, self.held, self.withdrawn, self.released = rank, count, [], [], [], []

    def post(self, topic, entry, among, settled, same=None, hold=0.0):
        self.posts.append((topic, entry, list(among), settled, same))
        self.held.append(hold)
        return topic

    def withdraw(self, post):
        self.withdrawn.append(post)
        return True

    def release(self, post):
        self.released.append(post)


class Device:
    def __init__(self, process_index):
        self.process_index = process_index


def given(ranks, op="add", name="jit(step)"):
    operation = types.SimpleNamespace(get_asm=lambda **kw: MODULE.format(name="x", op=op))
    return {"name": name, "hlo": types.SimpleNamespace(operation=operation),
            "global_in_avals": [types.SimpleNamespace(dtype="float32", shape=(8, 4))], "in_shardings": [],
            "device_list": [Device(r) for r in ranks for _ in range(2)]}


class Executable:
    """What from_hlo made: its compiled HLO holds ``op`` (or is ``text``)."""

    def __init__(self, op="all-reduce", text=None):
        text = text or f"  %r = f32[] {op}(f32[] %x), channel_id=1, replica_groups={{}}"
        module = types.SimpleNamespace(to_string=lambda options=None: text)
        self.xla_executable = types.SimpleNamespace(hlo_modules=lambda: [module])


COLLECTIVE = Executable()


def made_and_ran(check, made, executable=COLLECTIVE):
    """What from_hlo gave and made, then its first run (a compile alone posts nothing)."""
    check.got(made, executable)
    check.ran(executable.xla_executable)


def checker(rank, strict=False):
    locator = types.SimpleNamespace(user_frame=lambda frame: ("/w/job.py", 7))
    board = Board(rank)
    return board, programs.Programs(board, locator, strict)


def test_each_group_counts_its_main_threads_programs_once_each():
    board, check = checker(rank=1)
    made_and_ran(check, given([0, 1, 2, 3]), COLLECTIVE)
    made_and_ran(check, given([0, 1, 2, 3]), COLLECTIVE)  # the same program again (a new jit of it): once
    made_and_ran(check, given([0, 1], op="multiply"), Executable("all-gather-start"))
    made_and_ran(check, given([0, 1, 2, 3], op="subtract"), Executable("add"))  # no collective: no one waits
    made_and_ran(check, given([0, 1, 2, 3], op="multiply"), Executable("collective-permute"))
    made_and_ran(check, given([1]), COLLECTIVE)  # process-local: nobody to agree with
    made_and_ran(check, given([2, 3]), COLLECTIVE)  # not this process's
    assert [(topic, among) for topic, _, among, _, _ in board.posts] == [
        ("programs/0-3/m/1", [0, 1, 2, 3]), ("programs/0,1/m/1", [0, 1]), ("programs/0-3/m/2", [0, 1, 2, 3])]
    topic, posted, _, _, same = board.posts[0]
    collectives = ["all-reduce f32[] replica_groups={}"]
    devices = given([0, 1, 2, 3])["device_list"]
    assert posted == {"h": program_text.program_hash(MODULE.format(name="y", op="add")),
                      "c": program_text.program_hash(program_text.collectives_key(collectives, devices)),
                      "cs": "all-reduce f32[]", "fn": "step", "in": "f32[8,4]", "sh": "", "at": "/w/job.py:7"}
    # By default the collectives decide: a body of its own (a per-process constant) is the same program.
    assert same(posted, dict(posted, at="/elsewhere/job.py:99", fn="other", h="z"))
    assert not same(posted, dict(posted, c="z"))
    board, check = checker(rank=1, strict=True)
    made_and_ran(check, given([0, 1, 2, 3]), COLLECTIVE)
    assert not board.posts[0][4](posted, dict(posted, h="z"))  # strict: the body too


def test_a_compile_alone_posts_nothing_and_a_first_run_posts_and_meets_once():
    met = []
    board, check = checker(rank=0)
    check.meetings = type("Meetings", (), {"meet": lambda self, e, ranks, main: met.append((e["fn"], ranks, main))})()
    ahead = Executable()
    check.got(given([0, 1]), ahead)  # lower().compile(): its analysis, a warm-up
    check.got(given([0, 1, 2, 3]), COLLECTIVE)
    assert board.posts == [] and met == []
    check.ran(COLLECTIVE.xla_executable)
    check.ran(COLLECTIVE.xla_executable)  # a later run (JAX's Python path): nothing more
    assert [topic for topic, *_ in board.posts] == ["programs/0-3/m/1"]
    assert met == [("step", [0, 1, 2, 3], True)]
    check.ran(ahead.xla_executable)  # run at last, after another: the next position, met then
    assert [topic for topic, *_ in board.posts] == ["programs/0-3/m/1", "programs/0,1/m/1"]
    assert len(met) == 2 and not check.pending


def test_a_first_runs_post_waits_for_its_meeting_and_is_taken_back_where_every_body_was_alike():
    """The post of a first run is held for the meeting (``HOLD``); the
    meeting that found every process's body alike takes it back, one that
    did not (a body that differs, a slow peer, no store) leaves it to be
    judged."""
    for alike in (True, False):
        board, check = checker(rank=0)
        check.meetings = type("Meetings", (), {"meet": lambda self, e, ranks, main, alike=alike: alike})()
        check.got(given([0, 1, 2, 3]), COLLECTIVE)
        check.ran(COLLECTIVE.xla_executable)
        assert board.held == [programs.HOLD] and programs.HOLD > 0
        assert board.withdrawn == (["programs/0-3/m/1"] if alike else []), alike
        assert board.released == ([] if alike else ["programs/0-3/m/1"]), alike  # out now, not at the hold's end
    board, check = checker(rank=0)  # no meetings: nothing to wait for
    check.meetings = None
    check.got(given([0, 1, 2, 3]), COLLECTIVE)
    check.ran(COLLECTIVE.xla_executable)
    assert board.held == [0.0] and board.withdrawn == [] and board.released == ["programs/0-3/m/1"]


def made_on_threads(rank, names, ops):
    """The programs ``ops`` made in this order, each on its own thread of ``names``."""
    board, check = checker(rank)
    for name, op in zip(names, ops):
        thread = threading.Thread(target=made_and_ran, args=(check, given([0, 1], op=op, name=f"jit({op})")),
                                  name=name)
        thread.start()
        thread.join()
    return board


def test_programs_made_off_the_main_thread_are_keyed_by_what_they_are_not_by_who_made_them_when():
    """Two processes whose pools compiled the same two programs in the other
    order, on threads named otherwise (one named "1", which once fell under
    the main thread's topics), post the same topics; the board's own thread's
    programs, and the account's probe's (child.watch.backlog), are not posted."""
    one = made_on_threads(0, ["ThreadPoolExecutor-0_0", "ThreadPoolExecutor-0_1"], ["add", "multiply"])
    two = made_on_threads(1, ["1", programs.agreement.THREAD, "ThreadPoolExecutor-0_0", programs.backlog.THREAD],
                          ["multiply", "add", "add", "subtract"])
    assert sorted(topic for topic, *_ in one.posts) == sorted(topic for topic, *_ in two.posts)
    assert all(re.fullmatch(r"programs/0,1/t[0-9a-f]{16}/1", topic) for topic, *_ in one.posts), one.posts
    _, check = checker(rank=0)
    made_and_ran(check, given([0, 1]), COLLECTIVE)
    assert check.board.posts[0][0] == "programs/0,1/m/1"


def test_a_body_that_differs_where_the_collectives_agree_is_one_warning_and_stops_only_strict(monkeypatch, capsys):
    stopped = []
    monkeypatch.setattr(programs.agreement, "stop", lambda error, lines: stopped.append((error, lines)))
    monkeypatch.setattr(programs.time, "sleep", lambda s: None)
    constant = {0: entry("a", c="x"), 1: entry("b", c="x")}  # x * (process_index() + 1)
    board, check = checker(rank=0)
    made_and_ran(check, given([0, 1]), COLLECTIVE)
    for _ in range(2):
        board.posts[0][3]("programs/0,1/m/1", constant, set())
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert stopped == [] and len(warned) == 1, warned
    assert warned[0].startswith("jaxrun: warning: program 1 of processes 0,1 differs in its body only"), warned
    board, check = checker(rank=0, strict=True)
    made_and_ran(check, given([0, 1]), COLLECTIVE)
    board.posts[0][3]("programs/0,1/m/1", constant, set())
    (error, lines), = stopped
    assert str(error).startswith("program 1 of processes 0,1 differs (body): process 0 made matmul"), error
    assert "stopping the job (--checks strict)" in lines[-1]


def test_off_the_main_thread_a_key_with_two_programs_is_not_judged(monkeypatch, capsys):
    """Two programs under one key (the same line, function and inputs): which
    of them another process paired with its own, its threads' order decided."""
    stopped = []
    monkeypatch.setattr(programs.agreement, "stop", lambda error, lines: stopped.append((error, lines)))
    board = made_on_threads(0, ["pool-0", "pool-1"], ["add", "add"])
    assert len(board.posts) == 1
    settled = board.posts[0][3]
    settled(board.posts[0][0], {0: dict(entry("a", c="x"), n=1), 1: dict(entry("b", c="x"), n=2)}, set())
    assert stopped == [] and "warning" not in capsys.readouterr().err
    settled(board.posts[0][0], {0: dict(entry("a", c="x"), n=1), 1: dict(entry("b", c="x"), n=1)}, set())
    assert "run off the main thread differs in its body only" in capsys.readouterr().err


@pytest.mark.parametrize("rank, waits", [(3, []), (0, [programs.LATER])])
def test_the_odd_side_stops_at_once_and_the_others_later(monkeypatch, rank, waits):
    stopped, slept = [], []
    monkeypatch.setattr(programs.agreement, "stop", lambda error, lines: stopped.append((error, lines)))
    monkeypatch.setattr(programs.time, "sleep", slept.append)
    board, check = checker(rank)
    made_and_ran(check, given([0, 1, 2, 3]), COLLECTIVE)
    settled = board.posts[0][3]
    settled("programs/0-3/m/1", {0: entry("a"), 1: entry("a"), 2: entry("a"), 3: entry("b")}, set())
    assert slept == waits
    (error, lines), = stopped
    assert type(error).__name__ == "ProgramMismatchError" and str(error).startswith("program 1 of processes 0-3")
    stopped.clear()
    settled("programs/0-3/m/1", {0: entry("a"), 1: entry("a"), 2: entry("a")}, {3})  # agreed; 3 finished
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
