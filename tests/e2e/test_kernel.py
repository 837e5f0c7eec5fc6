"""The Jupyter kernel, through real Jupyter clients: jupyter_client starts,
interrupts, restarts and shuts down a kernel that ``jaxrun kernel install
--prefix`` wrote, found through ``JUPYTER_PATH``; nbclient runs the toy's
notebook (examples/toy.ipynb) on it."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
from fixtures.jobs import EXAMPLES, JAXRUN, wait_gone

pytest.importorskip("ipykernel", reason="the jupyter extra: pip install 'jaxrun[jupyter]'")
jupyter_client = pytest.importorskip("jupyter_client")
RESULT = "got result: -0.12398731708526611"


def install(prefix, name, *launch) -> None:
    done = subprocess.run([*JAXRUN, "kernel", "install", "--name", name, "--prefix", str(prefix), "--", *launch],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"jaxrun: installed the kernelspec {name} in {prefix}/share/jupyter/kernels/{name}\n"


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """A prefix that JUPYTER_PATH names, for the kernelspecs of one test."""
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    return tmp_path


@pytest.mark.timeout(60)
def test_kernel_install_with_a_prefix_is_found_through_jupyter_path(kernels):
    from jupyter_client.kernelspec import KernelSpecManager

    install(kernels, "jax2", "-n", "2", "--cpu-devices", "1")
    spec = KernelSpecManager().get_kernel_spec("jax2")
    assert spec.argv[-5:] == ["--", "-n", "2", "--cpu-devices", "1"] and spec.language == "python"
    assert spec.display_name == "jaxrun (-n 2 --cpu-devices 1)" and spec.interrupt_mode == "signal"


def execute(client, code: str, timeout: float = 60) -> tuple[str, list[tuple[str, dict]]]:
    seen: list[tuple[str, dict]] = []
    reply = client.execute_interactive(code, timeout=timeout,
                                       output_hook=lambda m: seen.append((m["msg_type"], m["content"])))
    return reply["content"]["status"], seen


def texts(seen, kind: str, name: str | None = None) -> str:
    return "".join(c.get("text", "") for t, c in seen if t == kind and (name is None or c.get("name") == name))


def values(seen, kind: str = "execute_result") -> list[dict]:
    return [c["data"] for t, c in seen if t == kind]


@pytest.mark.timeout(90)
def test_execute_interrupt_restart_and_shutdown(kernels, no_leftover_processes):
    from jupyter_client.manager import start_new_kernel

    install(kernels, "jax4", "-n", "4", "--cpu-devices", "2")
    started = time.monotonic()
    manager, client = start_new_kernel(kernel_name="jax4", startup_timeout=60)
    try:
        # Stream output merged as in the console; the last value from process 0.
        status, seen = execute(client, "import jax\nprint('count', jax.process_count())\njax.process_index() + 10")
        first = time.monotonic() - started
        # (What the cell showed goes with a failure: one suite run's first cell ended in error, unsaid.)
        assert status == "ok" and texts(seen, "stream", "stdout") == "[0-3] count 4\n", seen
        assert values(seen) == [{"text/plain": "10"}]
        # Rich output comes from process 0 alone.
        status, seen = execute(client, "from IPython.display import HTML, display\n"
                                       "display(HTML(f'<b>from {jax.process_index()}</b>'))")
        assert status == "ok" and [d["text/html"] for d in values(seen, "display_data")] == ["<b>from 0</b>"]
        # An error in some processes ends the cell in error, naming them.
        status, seen = execute(client, "x = 1\nif jax.process_index() in (1, 3):\n    raise KeyError('odd')")
        (error,) = [c for t, c in seen if t == "error"]
        assert status == "error" and error["ename"] == "KeyError"
        assert error["evalue"] == "processes 1,3 raised: KeyError: 'odd'", error
        assert "[1,3] KeyError: 'odd'" in error["traceback"]
        # An interrupt stops a running cell everywhere, and the kernel goes on.
        threading.Timer(1.5, manager.interrupt_kernel).start()
        interrupted = time.monotonic()
        status, seen = execute(client, "import time\ntime.sleep(120)")
        # The interrupt comes 1.5 s in; the cell ends a moment later, where
        # without it it would sleep 120 s.  8 s holds a loaded machine.
        assert status == "error" and time.monotonic() - interrupted < 8
        assert [c["ename"] for t, c in seen if t == "error"] == ["KeyboardInterrupt"]
        assert "processes 0-3 raised" in [c["evalue"] for t, c in seen if t == "error"][0]
        assert values(execute(client, "x")[1]) == [{"text/plain": "1"}]
        # A restart restarts the processes: a fresh __main__ in each.
        manager.restart_kernel(now=False)
        client.wait_for_ready(timeout=60)
        status, seen = execute(client, "import jax\n('x' in globals(), jax.process_count())")
        assert status == "ok" and values(seen) == [{"text/plain": "(False, 4)"}], seen
    finally:
        manager.shutdown_kernel(now=False)
        client.stop_channels()
    # Shutting the kernel down leaves no process of the launch.
    assert wait_gone(no_leftover_processes, within=10) == []
    print(f"kernel start to the first cell's result: {first:.2f} s")


@pytest.mark.timeout(90)
def test_the_toy_notebook_runs_under_nbclient(kernels):
    import nbclient
    import nbformat

    notebook = nbformat.read(EXAMPLES / "toy.ipynb", as_version=4)
    name = notebook.metadata["kernelspec"]["name"]
    install(kernels, name, "-n", "4", "--cpu-devices", "2")
    nbclient.NotebookClient(notebook, timeout=60, kernel_name=name, startup_timeout=60).execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = json.dumps([cell.outputs for cell in code])
    assert all(o["output_type"] != "error" for cell in code for o in cell.outputs), outputs

    def result(cell) -> str:
        (value,) = [o["data"]["text/plain"] for o in cell.outputs if o["output_type"] == "execute_result"]
        return value

    def printed(cell) -> str:
        return "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")

    assert result(code[0]) == "8" and result(code[1]) == "(4, 8)"
    assert "[0] device cpu:0 has local data [[0 1 2 3]]" in printed(code[2])
    assert "[3] device cpu:6145 has local data [[28 29 30 31]]" in printed(code[2])
    assert all(f"[{rank}] process={rank} {RESULT}" in printed(code[3]) for rank in range(4)), outputs
    assert result(code[4]).startswith("-0.1239873"), outputs
