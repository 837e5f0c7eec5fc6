"""jaxrun.backends.shield: helpers start with the stop signals blocked, and
the launcher keeps its own."""

import json
import signal
import subprocess
import sys

from jaxrun.backends.shield import STOP_SIGNALS, shielded

# What a process started with: the stop signals it holds blocked.
SHOW_MASK = ("import json, signal\n"
             "print(json.dumps(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []) "
             "if s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))))\n")


def started_blocked() -> list[int]:
    done = subprocess.run([sys.executable, "-c", SHOW_MASK], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_what_starts_under_the_shield_holds_the_stop_signals_and_the_launcher_does_not():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert started_blocked() == []
    with shielded():
        assert started_blocked() == sorted(STOP_SIGNALS)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    assert started_blocked() == []


def test_a_signal_that_arrives_under_the_shield_reaches_the_launcher_after_it():
    seen = []
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: seen.append(signum))
    try:
        with shielded():
            signal.raise_signal(signal.SIGHUP)
            assert seen == []  # held meanwhile, not lost
        assert seen == [signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, previous)
