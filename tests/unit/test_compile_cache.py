"""The compile cache the attempts of a run share (docs/restarts.md, "Attempts
share a compile cache"): which processes are told of one, where it lies on
their host, and how each process makes it, or keeps out of the user's way."""

from __future__ import annotations

import os
import stat

import pytest

from jaxrun import cli, contract
from jaxrun.backends import BACKENDS
from jaxrun.backends.ssh.commands import process_env
from jaxrun.child.join import compile_cache
from jaxrun.launcher.setup import plan as planning
from jaxrun.launcher.setup.configure import System, config_from_args

CACHE, JAX_DIR = contract.COMPILE_CACHE, contract.JAX_COMPILATION_CACHE_DIR


class Machine(System):
    """This machine with a given environment, every engine on PATH, no GPU."""

    def which(self, program):
        return f"/usr/bin/{program}"

    def local_gpus(self):
        return None


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def planned(script, *args, environ=None):
    """The dry run's specs for this command line, and its options."""
    params = cli.main.make_context("jaxrun", ["--dry-run", *args, script]).params
    config = config_from_args(params, BACKENDS, Machine(dict(environ or {})))
    return config.options, planning.plan(dict_coordinator(config.options))


def dict_coordinator(opts):
    import dataclasses

    return dataclasses.replace(opts, coordinator="127.0.0.1:1234")


def cache_values(specs):
    return [spec.env.get(CACHE) for spec in specs]


def test_restarts_share_a_folder_in_the_run_s_log_folder(script, tmp_path):
    opts, specs = planned(script, "-n", "3", "--cpu-devices", "1", "--max-restarts", "2",
                          "--log-dir", str(tmp_path / "logs"))
    assert cache_values(specs) == [str(tmp_path / "logs" / "compile-cache")] * 3
    assert all(JAX_DIR not in spec.env for spec in specs)  # each process sets JAX's variable itself


def test_the_default_log_folder_holds_it_too(script):
    opts, specs = planned(script, "-n", "2", "--cpu-devices", "1", "--max-restarts", "1")
    assert cache_values(specs) == [os.path.join(contract_default_folder(opts.run_id), "compile-cache")] * 2


def contract_default_folder(run_id):
    from jaxrun.launcher.setup.configure import default_log_dir

    return default_log_dir(run_id)


def test_no_restarts_no_cache(script):
    _, specs = planned(script, "-n", "2", "--cpu-devices", "1")
    assert cache_values(specs) == [None, None]
    _, specs = planned(script, "-n", "2", "--cpu-devices", "1", "--max-restarts", "0")
    assert cache_values(specs) == [None, None]


@pytest.mark.parametrize("args, environ", [
    (("--env", "JAX_COMPILATION_CACHE_DIR=/mine"), {}),
    (("--env", "JAX_COMPILATION_CACHE_DIR="), {}),  # JAX's own way of "no cache"
    (("--env", "JAX_ENABLE_COMPILATION_CACHE=false"), {}),
    (("-x", "JAX_COMPILATION_CACHE_DIR"), {"JAX_COMPILATION_CACHE_DIR": "/mine"}),
    ((), {"JAX_COMPILATION_CACHE_DIR": "/mine"}),  # local processes inherit it
    ((), {"JAX_ENABLE_COMPILATION_CACHE": "0"}),
], ids=["env", "env-empty", "env-off", "export", "inherited", "inherited-off"])
def test_a_cache_of_the_user_s_own_is_left_alone(script, args, environ):
    _, specs = planned(script, "-n", "2", "--cpu-devices", "1", "--max-restarts", "1", *args, environ=environ)
    assert cache_values(specs) == [None, None]


def test_the_plan_alone_keeps_out_of_an_env_cache_too():
    opts = planning.LaunchOptions(target=planning.Target("t.py"), num_processes=2, coordinator="h:1", run_id="r",
                                  compile_cache="/logs/compile-cache", extra_env={JAX_DIR: "/mine"})
    assert cache_values(planning.plan(opts)) == [None, None]
    opts = planning.LaunchOptions(target=planning.Target("t.py"), num_processes=2, coordinator="h:1", run_id="r",
                                  compile_cache="/logs/compile-cache", extra_env={"JAX_ENABLE_COMPILATION_CACHE": "1"})
    assert cache_values(planning.plan(opts)) == ["/logs/compile-cache"] * 2


@pytest.mark.parametrize("args", [("-H", "hostA:2,hostB"), ("--launcher", "slurm"), ("--launcher", "mpirun")],
                         ids=["ssh", "slurm", "mpirun"])
def test_elsewhere_each_host_gets_a_folder_named_after_the_run(script, args):
    opts, specs = planned(script, "-n", "3", "--max-restarts", "1", *args)
    assert cache_values(specs) == [opts.run_id] * 3  # a name, resolved on the host: no path of this machine
    assert not os.path.isabs(opts.run_id) and os.sep not in opts.run_id


def test_over_ssh_the_launcher_s_own_cache_stays_here_and_the_name_travels(script):
    opts, specs = planned(script, "-n", "2", "--max-restarts", "1", "-H", "hostA,hostB",
                          environ={JAX_DIR: "/launcher/only"})
    remote = process_env(specs[1], {contract.ERROR_FILE: "/here/process-1.error.json"})
    assert remote[CACHE] == opts.run_id and JAX_DIR not in remote
    _, specs = planned(script, "-n", "2", "--max-restarts", "1", "-H", "hostA,hostB",
                       "--env", "JAX_COMPILATION_CACHE_DIR=/shared/cache")
    remote = process_env(specs[0], {})
    assert CACHE not in remote and remote[JAX_DIR] == "/shared/cache"


# -- each process, on its host -------------------------------------------------------


def private(path):
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()


def test_a_run_s_name_becomes_a_private_folder_in_the_host_s_per_user_base(tmp_path):
    env = {CACHE: "20261202-120000-abcdef"}
    folder = compile_cache.apply(env, tmpdir=str(tmp_path))
    base = tmp_path / f"jaxrun-cache-{os.geteuid()}"
    assert folder == str(base / "20261202-120000-abcdef") == env[JAX_DIR]
    assert private(base) and private(folder)
    again = {CACHE: "20261202-120000-abcdef"}  # another process of the run, or the next attempt
    assert compile_cache.apply(again, tmpdir=str(tmp_path)) == folder


def test_a_path_is_made_where_it_is(tmp_path):
    env = {CACHE: str(tmp_path / "compile-cache")}
    assert compile_cache.apply(env) == str(tmp_path / "compile-cache") == env[JAX_DIR]
    assert private(tmp_path / "compile-cache")


@pytest.mark.parametrize("own", [{JAX_DIR: "/mine"}, {JAX_DIR: ""}, {"JAX_ENABLE_COMPILATION_CACHE": "false"}])
def test_a_process_with_a_cache_of_its_own_makes_nothing(tmp_path, own):
    env = {CACHE: str(tmp_path / "compile-cache"), **own}
    assert compile_cache.apply(env) is None
    assert env == {CACHE: str(tmp_path / "compile-cache"), **own}
    assert not (tmp_path / "compile-cache").exists()


def test_no_variable_no_folder(tmp_path):
    env = {}
    assert compile_cache.apply(env, tmpdir=str(tmp_path)) is None and env == {}
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("plant", ["link", "open", "file"])
def test_a_folder_not_the_user_s_alone_is_refused_in_one_line(tmp_path, capsys, plant):
    target = tmp_path / "compile-cache"
    if plant == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "elsewhere")
    elif plant == "open":
        target.mkdir()
        target.chmod(0o755)
    else:
        target.write_text("")
    env = {CACHE: str(target)}
    assert compile_cache.apply(env) is None and JAX_DIR not in env
    err = capsys.readouterr().err
    assert err.startswith(f"jaxrun: no shared compile cache: {target} ") and err.count("\n") == 1, err
    assert stat.S_IMODE(os.lstat(target).st_mode) != 0o700 or plant == "link"  # never repaired


@pytest.mark.parametrize("name", ["../up", "a/b", ".."])
def test_a_name_that_is_not_a_run_s_is_refused(tmp_path, capsys, name):
    env = {CACHE: name}
    assert compile_cache.apply(env, tmpdir=str(tmp_path)) is None and JAX_DIR not in env
    assert "is neither a path nor a run's name" in capsys.readouterr().err
