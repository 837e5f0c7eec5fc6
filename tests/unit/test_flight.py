"""The pure parts of --flight-recorder and --check-divergence: the block's
format, lining the records up, the processes' states, the strict check's
message, what an execution is called, and the options."""

import sys
import types

import pytest

from jaxrun import cli, contract
from jaxrun.child.checks import divergence, flight, flight_text
from jaxrun.launcher.setup import plan as planning
from jaxrun.reporting import summary

E = contract.FlightEntry


def entry(seq, call, function, occurrence, fp, line=10, file="/w/train.py", inputs="f32[4,8]"):
    return E(seq, call, function, occurrence, fp, inputs, file, line)


def record(rank, entries, state=contract.IN_SCRIPT, runs=None):
    return contract.FlightLog(rank, runs or len(entries), state, tuple(entries))


# -- the block ------------------------------------------------------------------------------

def test_block_round_trips_through_a_log_with_other_writers_lines():
    entries = [entry(1, 1, "train_step", 1, "aa11", file="/a dir/with spaces/train.py"),
               entry(2, None, "add", 1, "bb22", inputs=""),
               entry(3, 2, "<lambda>", 1, "cc33", inputs="f32[8],int,+3")]
    block = contract.flight_block(2, 40, contract.IN_SHUTDOWN, entries)
    lines = block.splitlines()
    text = "\n".join(["old output", lines[0], "[Gloo] noise", *lines[1:]]) + "\nlater output\n"
    log = contract.parse_flight_block(text)
    assert log == contract.FlightLog(2, 40, contract.IN_SHUTDOWN, tuple(entries))


def test_the_last_block_wins_and_a_log_without_one_has_none():
    first = contract.flight_block(0, 1, contract.IN_SCRIPT, [entry(1, 1, "f", 1, "aa")])
    second = contract.flight_block(0, 2, contract.IN_SHUTDOWN, [entry(1, 1, "f", 1, "aa"), entry(2, 2, "g", 1, "bb")])
    assert contract.parse_flight_block(first + "x\n" + second).runs == 2
    assert contract.parse_flight_block("Traceback (most recent call last):\n") is None


def test_a_block_cut_short_keeps_the_entries_it_has():
    block = contract.flight_block(1, 5, contract.IN_SCRIPT, [entry(i, i, "f", i, "aa") for i in range(1, 6)])
    log = contract.parse_flight_block(block[: block.index("#4")])
    assert [e.seq for e in log.entries] == [1, 2, 3]


# -- lining up -----------------------------------------------------------------------------

def detour_records(state_of_others=contract.IN_SHUTDOWN):
    """Process 2 ran eval_step once at call 3; the others went on with train_step."""
    others = [entry(c, c, "train_step", c, "t1", line=49) for c in range(1, 7)]
    odd = [entry(1, 1, "train_step", 1, "t1", line=49), entry(2, 2, "train_step", 2, "t1", line=49),
           entry(3, 3, "eval_step", 1, "e1", line=48), entry(4, 4, "train_step", 3, "t1", line=49)]
    logs = {r: record(r, others, state_of_others) for r in (0, 1, 3)}
    logs[2] = record(2, odd)
    return logs


def test_line_up_names_the_call_where_the_processes_parted_and_each_side():
    lines = summary.line_up(detour_records())
    assert lines == [
        "jaxrun: the processes parted at call 3: process 2 ran eval_step#1 (train.py:48); "
        "processes 0, 1, 3 ran train_step#3 (train.py:49)",
        "jaxrun: process 2 last ran call 4 train_step#3 (train.py:49); "
        "processes 0, 1, 3 last ran call 6 train_step#6 (train.py:49)",
    ]


def test_line_up_counts_a_process_that_stopped_early_as_a_side():
    logs = {0: record(0, [entry(c, c, "f", c, "aa") for c in (1, 2, 3)]),
            1: record(1, [entry(c, c, "f", c, "aa") for c in (1, 2)])}
    assert summary.line_up(logs)[0] == \
        "jaxrun: the processes parted at call 3: process 0 ran f#3 (train.py:10); process 1 was done after call 2"


def test_line_up_says_when_the_records_do_not_reach_back_to_the_start():
    logs = {0: record(0, [entry(c, c, "f", c, "aa") for c in (7, 8, 9)], runs=9),
            1: record(1, [entry(c, c, "f" if c < 9 else "g", c, "aa" if c < 9 else "bb") for c in (8, 9)], runs=9)}
    assert summary.line_up(logs)[0].startswith(
        "jaxrun: the processes first differ at call 9 of the calls their records hold (from call 8 on): ")


def test_line_up_of_agreeing_records_names_the_common_last_program_only():
    logs = {r: record(r, [entry(1, None, "add", 1, "l1"), entry(2, 1, "f", 1, "aa")]) for r in (0, 1)}
    assert summary.line_up(logs) == ["jaxrun: processes 0, 1 last ran call 1 f#1 (train.py:10)"]
    local_only = {0: record(0, [entry(1, None, "add", 1, "l1")])}
    assert summary.line_up(local_only) == ["jaxrun: process 0 last ran a local program add#1 (train.py:10)"]
    assert summary.line_up({}) == []


def test_state_line_tells_finished_processes_from_those_still_in_the_script():
    states = {0: contract.IN_SHUTDOWN, 1: contract.IN_SHUTDOWN, 2: contract.IN_SCRIPT, 3: contract.IN_SHUTDOWN}
    assert summary.state_lines(states) == [
        "jaxrun: processes 0, 1, 3 had finished the script and were waiting in JAX's shutdown; "
        "process 2 was still in the script"]
    assert summary.state_lines({0: contract.IN_SCRIPT, 1: contract.IN_SCRIPT}) == []  # nothing new to say
    assert summary.state_lines({0: contract.SCRIPT_RETURNED}) == ["jaxrun: process 0 had finished the script"]


DUMP = """\
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/site/jaxrun/child/shim.py", line 47 in wait_for_eof

Current thread 0x00007f0000000002 (most recent call first):
{frames}
"""


@pytest.mark.parametrize("frames, state", [
    ('  File "/site/jax/_src/interpreters/pxla.py", line 395 in __call__\n'
     '  File "/w/train.py", line 49 in <module>\n'
     '  File "/site/jaxrun/child/shim.py", line 167 in run_script', contract.IN_SCRIPT),
    ('  File "/site/jax/_src/distributed.py", line 199 in shutdown\n'
     '  File "/site/jax/_src/api.py", line 2582 in clean_up\n'
     '  File "/site/jaxrun/backends/forkserver/server.py", line 166 in become_controller', contract.IN_SHUTDOWN),
    ('  File "/usr/lib/python3.11/threading.py", line 362 in wait_for\n'  # the checks' wait for their peers, at exit
     '  File "/site/jaxrun/child/checks/agreement.py", line 135 in settle\n'
     '  File "/site/jaxrun/backends/forkserver/server.py", line 202 in become_controller', contract.IN_SHUTDOWN),
    ('  File "/w/pytest_runner.py", line 3 in run', None),
    ('  File "/site/jaxrun/child/shim.py", line 47 in wait_for_eof', None),  # the lifeline thread, not the script
])
def test_state_from_the_main_threads_stack_in_the_last_dump(frames, state):
    assert summary.dumped_state("earlier\n" + DUMP.format(frames=frames)) == state
    assert summary.dumped_state("no dump at all\n") is None


# -- the strict check's message ---------------------------------------------------------------

def test_the_strict_check_names_the_call_each_side_and_its_processes():
    train = {"fn": "train_step", "n": 6, "fp": "t1", "in": "f32[8]", "at": "/w/train.py:49"}
    evals = {"fn": "eval_step", "n": 1, "fp": "e1", "in": "f32[4,8]", "at": "/w/train.py:48"}
    headline, lines = divergence.describe_difference(6, {0: train, 1: train, 2: evals, 3: train}, {}, 4)
    assert headline == ("call 6 differs across processes: process 2 runs eval_step#1 [program e1] at train.py:48; "
                        "processes 0, 1, 3 run train_step#6 [program t1] at train.py:49")
    assert "  process 2: eval_step#1, program e1, inputs f32[4,8], called at /w/train.py:48" in lines


def test_the_strict_check_names_processes_that_finished_or_had_not_arrived():
    extra = {"fn": "train_step", "n": 21, "fp": "t1", "in": "", "at": "/w/train.py:54"}
    headline, _ = divergence.describe_difference(24, {2: extra}, {0: 23, 1: 23}, 4)
    assert headline == ("call 24 differs across processes: process 2 runs train_step#21 [program t1] at train.py:54; "
                        "process 3 was not at this call yet; processes 0, 1 had finished the script after 23 calls")


# -- describing an execution -----------------------------------------------------------------

def test_function_names_lose_jits_wrapper_and_spaces():
    assert flight_text.function_name("jit(train_step)") == "train_step"
    assert flight_text.function_name("jit(<lambda>)") == "<lambda>"
    assert flight_text.function_name("pmap(a b)") == "a_b"
    assert flight_text.function_name("") == "?"


class Aval:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def test_inputs_are_short_dtypes_and_shapes_then_a_count():
    assert flight_text.input_text([Aval((8, 4), "float32"), Aval((), "int32"), 3, Aval((2,), "bfloat16")]) == \
        "f32[8,4],i32[],int,bf16[2]"
    assert flight_text.input_text([Aval((1,), "uint8")] * 11) == ",".join(["u8[1]"] * 8) + ",+3"


class Sharding:
    def __init__(self, local):
        self.is_fully_addressable = local


def handlers(ins, outs):
    return types.SimpleNamespace(in_handler=types.SimpleNamespace(in_shardings=ins),
                                 out_handler=types.SimpleNamespace(out_shardings=outs))


def test_only_programs_over_other_processes_devices_are_checked():
    assert flight_text.spans_processes(handlers([Sharding(True)], [Sharding(False)]))
    assert not flight_text.spans_processes(handlers([Sharding(True)], [Sharding(True)]))
    assert flight_text.spans_processes(handlers([object()], []))  # unknown: checked
    assert flight_text.spans_processes(object())


def test_missing_hook_points_are_named():
    pxla = types.SimpleNamespace(ExecuteReplicated=type("ER", (), {"__call__": lambda self: None}),
                                 MeshExecutable=type("ME", (), {}))
    modules = {"jax._src.pjit": types.SimpleNamespace(_get_fastpath_data=lambda: None),
               "jax._src.interpreters.pxla": pxla}
    assert flight.missing_hook_points(modules) == ["jax._src.interpreters.pxla.MeshExecutable.create_cpp_call"]
    assert len(flight.missing_hook_points({})) == len(flight.HOOK_POINTS)


def test_the_user_frame_is_the_innermost_outside_jax_jaxrun_and_the_stdlib(tmp_path):
    fake_jax = types.SimpleNamespace(__file__=str(tmp_path / "jax" / "__init__.py"))
    recorder = flight.Flight(0, 2, 4, None)
    recorder.describe_paths(fake_jax)
    assert recorder.user_frame(sys._getframe()) == (__file__, sys._getframe().f_lineno)
    assert recorder.kind(str(tmp_path / "jax" / "_src" / "pjit.py")) == flight._SKIP
    assert recorder.kind(flight.__file__) == flight._SKIP
    assert recorder.kind("/venv/lib/python3.11/site-packages/flax/core.py") == flight._LIBRARY
    assert recorder.kind("<frozen runpy>") == flight._SKIP


class Executable:
    """What the hook reads of pxla.ExecuteReplicated (no program: fingerprint "?")."""

    def __init__(self, name):
        self.name = name


def test_the_hook_counts_per_function_and_forgets_programs_jax_let_go_of(tmp_path):
    import gc

    recorder = flight.Flight(0, 1, 3, None)
    recorder.describe_paths(types.SimpleNamespace(__file__=str(tmp_path / "jax" / "__init__.py")))
    small, large, other = Executable("jit(step)"), Executable("jit(step)"), Executable("jit(eval)")

    def execute(executable):  # as the hook's wrapper of ExecuteReplicated.__call__ does
        recorder.before_execution(executable, (Aval((2,), "float32"),))

    for executable in (small, large, small, other, small):
        execute(executable)
    here = sys._getframe().f_lineno - 1
    assert [(seq, call, p.function, n, line) for seq, call, p, n, _, line in recorder.ring] == [
        (3, None, "step", 3, here), (4, None, "eval", 1, here), (5, None, "step", 4, here)]
    assert recorder.ring[-1][4] == __file__ and recorder.runs == 5 and recorder.calls == 0
    # The block is made from the ring only when it is written.
    assert recorder.block().splitlines()[-2] == f"jaxrun: flight[0] #5 local step#4 fp=? in=f32[2] at {__file__}:{here}"
    del large, other
    gc.collect()
    assert [p.function for _, p in recorder.programs.values()] == ["step"]  # small's only
    assert recorder.ring[-2][2].function == "eval"  # the ring keeps what it recorded


# -- the options ---------------------------------------------------------------------------

def parse(*args):
    return cli.main.make_context("jaxrun", list(args)).params


@pytest.mark.parametrize("args, depth, rest", [
    (["--flight-recorder", "train.py", "--lr", "1"], 64, ("train.py", "--lr", "1")),
    (["--flight-recorder", "128", "train.py"], 128, ("train.py",)),
    (["--flight-recorder=8", "train.py"], 8, ("train.py",)),
    (["--flight-recorder", "--check-divergence", "train.py"], 64, ("train.py",)),
    (["--flight-recorder", "-m", "pkg.train"], 64, ("-m", "pkg.train")),
    (["train.py", "--flight-recorder"], None, ("train.py", "--flight-recorder")),  # the script's own
])
def test_flight_recorder_takes_its_count_only_when_one_is_given(args, depth, rest):
    params = parse(*args)
    assert params["flight_recorder"] == depth
    assert params["args"] == rest


def test_flight_recorder_count_is_bounded():
    with pytest.raises(Exception, match="1<=x<=4096"):
        parse("--flight-recorder", "0", "train.py")


def test_the_modes_reach_every_process_through_the_environment_and_are_off_by_default():
    opts = planning.LaunchOptions(target=planning.Target("t.py"), num_processes=2, coordinator="h:1", run_id="r")
    for spec in planning.plan(opts):
        assert contract.FLIGHT_RECORDER not in spec.env and contract.CHECK_DIVERGENCE not in spec.env
    on = planning.LaunchOptions(target=planning.Target("t.py"), num_processes=2, coordinator="h:1", run_id="r",
                                flight_recorder=32, check_divergence=True)
    for spec in planning.plan(on):
        assert spec.env[contract.FLIGHT_RECORDER] == "32" and spec.env[contract.CHECK_DIVERGENCE] == "1"


def test_with_both_modes_off_nothing_is_hooked(monkeypatch):
    monkeypatch.setattr(flight, "_flight", None)
    flight.prepare({}, 0, 2)
    flight.prepare({contract.CHECK_DIVERGENCE: "1"}, 0, 1)  # one process has nothing to agree with
    assert flight._flight is None
    flight.script_returned()  # and the shim's word costs nothing


class FakeStore:
    """The coordination service's key-value calls the check makes, in memory."""

    def __init__(self):
        self.data: dict[str, str] = {}
        self.changed = __import__("threading").Condition()
        self.most = 0

    def key_value_set(self, key, value):
        with self.changed:
            assert key not in self.data, key
            self.data[key] = value
            self.most = max(self.most, len(self.data))
            self.changed.notify_all()

    def blocking_key_value_get(self, key, timeout_ms):
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.data, timeout_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")
            return self.data[key]

    def key_value_increment(self, key, by):
        with self.changed:
            self.data[key] = str(int(self.data.get(key, "0")) + by)
            return int(self.data[key])

    def key_value_delete(self, key):
        with self.changed:
            for k in [k for k in self.data if k == key or k.startswith(key + "/")]:
                del self.data[k]

    def key_value_dir_get(self, prefix):
        with self.changed:
            return [(k, v) for k, v in self.data.items() if k.startswith(prefix)]


def test_agreeing_processes_pass_every_call_and_the_store_stays_small():
    import threading

    store, calls = FakeStore(), 2 * divergence.Checker.BLOCK + 500
    program = flight.Program("train_step", "t1", "f32[8]", True)
    done = []

    def process(rank):
        checker = divergence.Checker(rank, 3)
        checker.client = store
        for call in range(1, calls + 1):
            checker.agree(call, program, call, "/w/train.py", 49)
        done.append(rank)

    threads = [threading.Thread(target=process, args=(r,), daemon=True) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(done) == [0, 1, 2]
    # Three processes' entries for at most about two folders of calls, never the whole run.
    assert store.most <= 3 * 2 * divergence.Checker.BLOCK + 10
    assert not [k for k in store.data if k.startswith(f"{divergence.Checker.PREFIX}/calls/0/")]


def test_a_programs_fingerprint_ignores_where_it_was_called_from(tmp_path):
    """XLA's own fingerprint covers source locations: the same program called
    from another line, or a script at another path on another host, must
    still agree."""
    import subprocess

    script = ("import sys, jax, jax.numpy as jnp\n"
              "from jaxrun.child.checks import flight_text\n"
              "def f(x): return jnp.sin(x) * 2\n"
              "def g(x): return jnp.cos(x) * 2\n"
              "def fp(h):\n"
              "    return flight_text.fingerprint(jax.jit(h).lower(jnp.ones(4)).compile()._executable.xla_executable)\n"
              "if sys.argv[1] == 'a':\n    print(fp(f), fp(g))\nelse:\n    print(fp(f), fp(g))\n")
    prints = []
    for folder, arg in (("one", "a"), ("two", "b")):
        (tmp_path / folder).mkdir()
        path = tmp_path / folder / "fp.py"
        path.write_text(script)
        prints.append(subprocess.run([sys.executable, str(path), arg], capture_output=True, text=True, check=True,
                                     timeout=120).stdout.split())
    (f_one, g_one), (f_two, g_two) = prints
    assert f_one == f_two and g_one == g_two
    assert f_one != g_one


def test_the_accounts_probe_of_its_device_is_no_run_of_the_scripts(tmp_path):
    """child.watch.backlog's program runs on one device of one process, at random
    instants: the ring and the counters (the divergence check's calls) leave it out."""
    from jaxrun.child.watch import backlog

    recorder = flight.Flight(0, 1, 3, None)
    recorder.describe_paths(types.SimpleNamespace(__file__=str(tmp_path / "jax" / "__init__.py")))
    step, probe = Executable("jit(step)"), Executable(f"jit({backlog.PROGRAM})")
    for executable in (step, probe, probe, step):
        recorder.before_execution(executable, (Aval((2,), "float32"),))
    assert [p.function for _, _, p, *_ in recorder.ring] == ["step", "step"]
    assert recorder.runs == 2 and recorder.calls == 0
