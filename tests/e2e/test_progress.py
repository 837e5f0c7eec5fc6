"""Start-up progress on a real terminal: the joined count rises to N, a late
process is named while the others wait for it, and the live line leaves the
screen clean.  (Off a terminal, the one final line is checked in
test_local.py's toy run, so no extra JAX job is spent on it.)"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time

import pytest
from fixtures.jobs import JAXRUN

pytestmark = pytest.mark.timeout(120)

LATE = 7.0  # seconds process 1 sleeps before touching jax: past JOIN_NAMING_AFTER

SCRIPT = f"""
import os, time
if os.environ["JAXRUN_PROCESS_ID"] == "1":
    time.sleep({LATE})
import jax
print("devices", jax.device_count())
"""


def on_a_terminal(args, timeout: float) -> tuple[int, bytes]:
    """Run jaxrun with stdout and stderr on a new pty; (exit code, every byte
    the terminal received).  The job's group is killed whatever happens."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(JAXRUN + [str(a) for a in args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=dict(os.environ, TERM="xterm"), start_new_session=True)
    os.close(slave)
    screen = bytearray()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: every writer of the pty is gone
                    data = b""
                if not data:
                    break
                screen += data
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=10), bytes(screen)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)


def rendered(raw: bytes) -> list[str]:
    """The lines a terminal shows in the end: ``\\r`` returns to the start of
    the line, ``ESC [ K`` erases to its end, ``\\n`` starts a new one."""
    lines, line, col = [], [], 0
    for token in re.findall(rb"\x1b\[K|\r|\n|[^\r\n\x1b]+|\x1b", raw):
        if token == b"\r":
            col = 0
        elif token == b"\n":
            lines.append("".join(line))
            line, col = [], 0
        elif token == b"\x1b[K":
            del line[col:]
        else:
            for ch in token.decode(errors="replace"):
                line[col:col + 1] = [ch]
                col += 1
    if line:
        lines.append("".join(line))
    return lines


def test_the_count_rises_to_n_and_a_late_process_is_named(launch_mode, tmp_path):
    script = tmp_path / "late.py"
    script.write_text(SCRIPT)
    code, raw = on_a_terminal(["-n", 3, "--cpu-devices", 1, "--log-dir", tmp_path / "logs", script], timeout=90)
    text = raw.decode(errors="replace")
    assert code == 0, text
    counts = [int(n) for n in re.findall(r"jaxrun: (\d)/3 processes joined", text)]
    assert counts == sorted(counts) and counts[-1] == 3, counts  # never goes back
    assert any(n < 3 for n in counts), counts  # and it was seen below 3, live
    waiting = re.findall(r"processes joined; waiting \d+ s for ([^\r\n\x1b]*)", text)
    assert waiting and all(w == "process 1" for w in waiting), waiting  # the late one, alone
    # What stays on the screen: the output and jaxrun's lines, each whole,
    # and one final progress line where the live one was.
    screen = [line for line in rendered(raw) if line]
    assert [line for line in screen if "processes joined" in line] == \
        [re.search(r"jaxrun: 3/3 processes joined in [\d.]+ s", text).group(0)]
    assert sorted(line for line in screen if line.startswith("[")) == [f"[{r}] devices 3" for r in range(3)]
    assert screen[-1].startswith("jaxrun: logs in")
    assert not list((tmp_path / "logs").glob("*.joined"))  # seen, then removed
