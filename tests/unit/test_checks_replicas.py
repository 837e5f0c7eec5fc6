"""The replica check's pure parts: the sample, slices, fingerprints and what is never flagged.

The check itself, across real processes, is tests/e2e/test_checks_replicas.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxrun import contract
from jaxrun.child.checks import replicas, replicas_prints


def test_the_sample_depends_on_the_call_count_alone():
    checked = [n for n in range(1, 70) if replicas_prints.sampled(n)]
    assert checked == [1, 2, 3, 4, 8, 16, 32, 64]


def test_a_slice_is_its_start_and_stop_per_dimension():
    shape = (8, 3)
    assert replicas_prints.key_of((slice(2, 4), slice(None)), shape) == ((2, 4), (0, 3))
    assert replicas_prints.key_of(None, shape) == ((0, 8), (0, 3))
    key = replicas_prints.key_of((slice(None, 2), slice(0, 3)), shape)
    assert replicas_prints.index_text(key) == "[0:2, 0:3]"
    assert replicas_prints.key_text(key) == "0:2,0:3"
    assert replicas_prints.key_text(()) == "all"


def test_host_prints_tell_bytes_dtype_and_shape_apart():
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert replicas_prints.host_print(a) == replicas_prints.host_print(a.copy())
    assert replicas_prints.host_print(a[:, ::-1]) != replicas_prints.host_print(a)  # a strided view hashes its values
    assert replicas_prints.host_print(a[:, ::-1]) == replicas_prints.host_print(np.ascontiguousarray(a[:, ::-1]))
    assert replicas_prints.host_print(a.reshape(3, 4)) != replicas_prints.host_print(a)
    assert replicas_prints.host_print(a.view(np.int32)) != replicas_prints.host_print(a)
    b = a.copy()
    b[3, 2] += 1
    assert replicas_prints.host_print(b) != replicas_prints.host_print(a)


MINE = {((0, 4), (0, 16))}
KEY = next(iter(MINE))


@pytest.mark.parametrize("value", [
    np.full((4, 16), 7, np.int32),  # constant
    np.broadcast_to(np.arange(16, dtype=np.int32), (4, 16)),  # position ids: a range along axis 1
    np.arange(64, dtype=np.float32).reshape(4, 16),  # a range along both
    np.tril(np.ones((4, 16), np.int32)),  # a mask of zeros and ones
    np.tril(np.ones((4, 16), bool)),  # booleans: neither floating nor integer
], ids=["constant", "positions", "ramp", "mask", "bool"])
def test_constants_ranges_and_masks_are_never_flagged(value):
    assert replicas_prints.batch_print({KEY: value}, MINE, {}) is None


def test_a_token_batch_has_a_print_that_follows_its_bytes():
    tokens = np.random.default_rng(0).integers(0, 32000, (4, 16), dtype=np.int32)
    first = replicas_prints.batch_print({KEY: tokens}, MINE, {})
    known = {KEY: replicas_prints.host_print(tokens)}  # taken for the replica check: used again
    assert first is not None and first == replicas_prints.batch_print({KEY: tokens.copy()}, MINE, known)
    assert replicas_prints.batch_print({KEY: tokens + 1}, MINE, {}) != first


def test_capturing_keeps_what_the_callback_returned_by_slice():
    captures: list = []
    data = np.arange(24).reshape(8, 3)
    args, kwargs = replicas_prints.capturing(((8, 3), "sharding", lambda index: data[index]), {}, captures)
    assert args[2]((slice(2, 4), slice(None))).tolist() == data[2:4].tolist()
    assert list(captures[0]) == [((2, 4), (0, 3))]
    args, kwargs = replicas_prints.capturing((), {"shape": (8, 3), "data_callback": lambda i: data[i]}, captures)
    kwargs["data_callback"]((slice(0, 8), slice(0, 3)))
    assert list(captures[1]) == [((0, 8), (0, 3))]


def test_the_checks_wrap_the_calls_jax_binds_and_the_device_checksum_reads_bytes():
    """In a process of its own (it patches jax): after install, ``jax.X`` is
    jaxrun's wrapper of ``jax._src.array.X``, the built array is right, and
    the on-device checksum tells two arrays one bit apart."""
    script = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import jax, numpy as np
        from jax._src import array
        from jaxrun.child.checks import replicas, replicas_prints

        class Board:
            rank = 0
            posts = []
            def post(self, *args, **kw):
                self.posts.append(args)

        replicas.install(Board(), strict=True)
        for name in replicas.CALLS:
            assert getattr(jax, name) is getattr(array, name), name
            assert getattr(jax, name)._jaxrun_checks, name
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
        data = np.arange(8, dtype=np.float32)
        built = jax.make_array_from_callback((8,), sharding, lambda i: data[i])
        assert np.asarray(built).tolist() == data.tolist()
        built = jax.make_array_from_process_local_data(sharding, data)
        assert np.asarray(built).tolist() == data.tolist()
        assert Board.posts == []  # one process: no slice is held by two
        x = jax.device_put(np.arange(6, dtype=np.float32), jax.devices()[0])
        y = jax.device_put(np.arange(6, dtype=np.float32).view(np.int32) ^ np.int32(1 << 5), jax.devices()[0])
        one = replicas_prints.device_print(x, "cpu:0")()
        assert one == replicas_prints.device_print(x + 0, "cpu:0")()
        assert one["fp"] != replicas_prints.device_print(y.view(np.float32), "cpu:0")()["fp"]
        for dtype in (np.int8, np.float16, np.float64, np.complex64, bool):
            assert replicas_prints.device_print(jax.numpy.zeros(3, dtype), "cpu:0")()["fp"]
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_jax_without_the_hook_points_turns_the_check_off_in_one_line(capsys):
    class Board:
        rank = 0

    class Jax:
        __version__ = "0.0.1"

    replicas._missing_hook_points(Board(), False, ["make_array_from_callback"], Jax())
    err = capsys.readouterr().err
    assert err == ("jaxrun: --checks: the replica check is off: this jax (0.0.1) lacks "
                   "jax._src.array.make_array_from_callback\n")
    Board.rank = 1
    replicas._missing_hook_points(Board(), False, ["make_array_from_callback"], Jax())
    assert capsys.readouterr().err == ""  # process 0 says it for all


def test_a_process_restarted_alone_checks_nothing():
    """Its calls count from 1 again while its peers' entries are from their
    first calls: it would compare unlike batches."""
    script = textwrap.dedent("""
        import os
        os.environ["JAXRUN_PROCESS_RESTARTS"] = "1"
        import jax
        from jax._src import array
        from jaxrun.child.checks import replicas

        class Board:
            rank = 2

        real = array.make_array_from_callback
        replicas.install(Board(), strict=False)
        assert array.make_array_from_callback is real and jax.make_array_from_callback is real
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


def test_strict_checks_refuse_a_jax_without_the_hook_points(tmp_path):
    """Under ``--checks strict`` the process ends before the script runs any
    program: one line, an error record, exit 1."""
    record = tmp_path / "error.json"
    script = textwrap.dedent("""
        from jaxrun.child.checks import replicas

        class Board:
            rank = 1

        class Jax:
            __version__ = "0.0.1"

        replicas._missing_hook_points(Board(), True, ["make_array_from_callback"], Jax())
        print("went on")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "JAXRUN_ERROR_FILE": str(record)})
    assert done.returncode == 1 and "went on" not in done.stdout, done.stderr
    # Under the head that leaves every process's copy to its log: the summary says it once (issue 74).
    assert done.stderr == (f"{contract.DIAGNOSIS_HEAD}\n"
                           "jaxrun: --checks strict: this jax (0.0.1) lacks jax._src.array.make_array_from_callback, "
                           "where the replica check hooks in\n")
    assert "RuntimeError: --checks strict: this jax (0.0.1) lacks" in record.read_text()


def test_jaxruns_own_folder_is_the_packages_whose_frames_are_never_the_users():
    """The replicas' and the flight recorder's call site skips jaxrun's own
    frames (jaxrun.make_global_batch in runtime.py): after the child side
    moved a floor down, its own folder was taken for jaxrun's, and the
    mismatch was named at runtime.py:150."""
    import os

    from jaxrun.child import JAXRUN_FOLDER

    assert os.path.isfile(os.path.join(JAXRUN_FOLDER, "runtime.py"))
    assert os.path.isfile(os.path.join(JAXRUN_FOLDER, "child", "shim.py"))
