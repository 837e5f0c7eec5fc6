"""Which attempts the server started before the plan (the head start) may
serve: a controller forked from it must see what one forked from a server
started for its attempt would (``forkserver.client.serves``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jaxrun.backends.forkserver.client import serves
from jaxrun.backends.forkserver.process import server_env
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec

PYTHON = "/usr/bin/python3"
BASE = {"PATH": "/usr/bin", "HOME": "/root", "OMP_NUM_THREADS": "2"}


def specs(**common: str) -> list[ProcessSpec]:
    env = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2", "JAXRUN_NUM_PROCESSES": "2", **common}
    return [ProcessSpec(rank, rank, LOCAL_HOST, PYTHON, ("--", "job.py"), {**env, "JAXRUN_PROCESS_ID": str(rank)})
            for rank in range(2)]


def early(env: dict, python: str = PYTHON, preload: tuple = ()) -> SimpleNamespace:
    """What ``serves`` reads of a started server: how it was started."""
    return SimpleNamespace(python=python, env=server_env(env, {}), preload=preload)


def test_the_head_start_serves_an_attempt_that_adds_only_jaxruns_and_jaxs_variables():
    assert serves(early(BASE), specs(), (), BASE)


def test_a_jax_value_of_its_own_is_read_again_after_the_fork():
    assert serves(early({**BASE, "JAX_PLATFORMS": "cuda"}), specs(), (), BASE)


@pytest.mark.parametrize("server, wanted, why", [
    ({**BASE, "JAX_ENABLE_X64": "1"}, {}, "a JAX_ variable the processes lack stays set"),
    (BASE, {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}, "XLA_FLAGS is read at import"),
    (BASE, {"OMP_NUM_THREADS": "1"}, "a library's variable, read as numpy loads"),
    (BASE, {"PYTHONPATH": "/src"}, "another sys.path"),
])
def test_any_other_difference_starts_a_server_for_the_attempt(server, wanted, why):
    assert not serves(early(server), specs(**wanted), (), BASE), why


def test_another_interpreter_or_preloaded_module_starts_a_server_for_the_attempt():
    assert not serves(early(BASE, python="/opt/python3.12"), specs(), (), BASE)
    assert not serves(early(BASE), specs(), ("numpy",), BASE)
