"""What the launching shell carries to processes elsewhere: one rule, for
SSH's processes and the engines' far ends (mpirun -x, Ray's actors)."""

from __future__ import annotations

from jaxrun.backends.ray.backend import sent_env
from jaxrun.backends.scheduler.mpirun import mpi_forwards
from jaxrun.core import forward

SHELL = {"JAX_PLATFORMS": "cuda", "XLA_FLAGS": "--xla_gpu_autotune_level=0", "NCCL_DEBUG": "INFO",
         "TF_CPP_MIN_LOG_LEVEL": "0", "CUDA_MODULE_LOADING": "LAZY", "LD_LIBRARY_PATH": "/opt/cuda/lib64",
         "CUDA_VISIBLE_DEVICES": "0,1", "JAX_LOCAL_DEVICE_IDS": "3", "JAX_COMPILATION_CACHE_DIR": "/here",
         "PATH": "/usr/bin", "VIRTUAL_ENV": "/venv", "HOME": "/root", "NCCLX": "no"}
TRAVELS = ("JAX_PLATFORMS", "XLA_FLAGS", "NCCL_DEBUG", "TF_CPP_MIN_LOG_LEVEL", "CUDA_MODULE_LOADING", "LD_LIBRARY_PATH")


def test_the_jax_settings_travel_and_this_machines_own_stay():
    assert forward.forwarded(SHELL) == {name: SHELL[name] for name in TRAVELS}
    # An engine's far end, with no login environment, gets the interpreter's too.
    assert forward.forwarded(SHELL, engine=True) == {name: SHELL[name] for name in (*TRAVELS, "PATH", "VIRTUAL_ENV")}


def test_mpirun_and_ray_carry_what_the_rule_says_and_jaxruns_own():
    for name in (*TRAVELS, "PATH", "VIRTUAL_ENV", "JAXRUN_RUN_ID"):
        assert mpi_forwards(name), name
    assert not any(mpi_forwards(name) for name in ("HOME", "NCCLX", "CUDA_VISIBLE_DEVICES"))
    sent = sent_env(SHELL, {"JAXRUN_PROCESS_ID": "1"})
    assert set(TRAVELS) <= set(sent) and "HOME" not in sent and "CUDA_VISIBLE_DEVICES" not in sent
