"""The contract every part of jaxrun agrees on."""

import signal

import pytest

from jaxrun import contract, portable


@pytest.mark.parametrize("returncode, status",
                         [(0, 0), (3, 3), (255, 255), (-signal.SIGKILL, 137), (-signal.SIGTERM, 143)])
def test_exit_status_and_back(returncode, status):
    assert contract.exit_status(returncode) == status
    assert contract.returncode_from_status(status) == returncode


def test_substitute_fills_placeholders_and_leaves_other_braces():
    values = contract.placeholder_values(2, 4, 0, "h:1")
    assert set(values) == set(contract.PLACEHOLDERS)
    text = "{process_id}/{num_processes} {x} {{process_id}} {coordinator}"
    assert contract.substitute(text, values) == "2/4 {x} {2} h:1"


def test_error_record_round_trips_through_a_file(tmp_path):
    path = tmp_path / "e.json"
    try:
        raise KeyError("missing")
    except KeyError as e:
        record = contract.ErrorRecord.of(e, "Traceback\n  KeyError\n")
    record.dump(str(path))
    assert contract.ErrorRecord.load(str(path)) == record
    assert record.headline == "KeyError: 'missing'"


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"type": "X"}'])
def test_a_broken_error_record_reads_as_none(tmp_path, text):
    path = tmp_path / "e.json"
    path.write_text(text)
    assert contract.ErrorRecord.load(str(path)) is None
    assert contract.ErrorRecord.load(str(tmp_path / "absent.json")) is None
    assert contract.ErrorRecord.load(None) is None


@pytest.mark.parametrize("text, pair", [("A=1", ("A", "1")), ("_x=a=b", ("_x", "a=b")), ("K=", ("K", ""))])
def test_env_pairs(text, pair):
    assert contract.parse_env_pair(text) == pair


@pytest.mark.parametrize("text", ["A", "=1", "1A=x", "A-B=x", "é=x", "A B=x"])
def test_bad_env_pairs(text):
    with pytest.raises(ValueError, match="KEY=VALUE"):
        contract.parse_env_pair(text)


def test_process_env_names_every_process_variable():
    env = contract.process_env(coordinator="h:1", num_processes=4, process_id=2, local_process_id=0,
                               local_process_count=1, run_id="r")
    assert env[contract.COORDINATOR_ADDRESS] == env[contract.JAX_COORDINATOR_ADDRESS] == "h:1"
    assert (env[contract.PROCESS_ID], env[contract.NUM_PROCESSES], env[contract.RESTART_COUNT]) == ("2", "4", "0")
    assert all(k.startswith(contract.CONTRACT_PREFIXES) or k == "PYTHONUNBUFFERED" for k in env)


def test_rank_sources_accept_the_older_mpi_name():
    assert contract.RANK_SOURCES["mpi"] == contract.RANK_SOURCES["mpirun"]


def test_free_port_is_on_the_address_asked_for():
    assert 0 < portable.free_port("127.0.0.1") < 65536



@pytest.mark.parametrize("address, loopback", [("127.0.0.2", True), ("::1", True), ("localhost", True),
                                               ("10.0.0.1", False), (None, False), ("", False)])
def test_is_loopback(address, loopback):
    assert contract.is_loopback(address) is loopback


def test_align_columns():
    assert contract.align_columns([("a", "bb"), ("ccc", "d")]) == ["a    bb", "ccc  d"]
