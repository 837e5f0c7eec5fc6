"""The one restart policy, as a table: each kind of end, on each kind of
engine, gets one answer (``launcher.restarts.policy``).

The engines differ in two ways only: whether one process of a running job
can start again alone (local, SSH: yes; Slurm, Open MPI and Ray start a
gang: no), and whether restarts are placed anew (--min-hosts,
--hosts-command).  Every row below says what each of the four kinds
answers; a policy that swapped two answers fails a row.
"""

from __future__ import annotations

import pytest

from jaxrun.core.outcome import StopReason
from jaxrun.launcher.restarts.policy import Answer, AttemptEnd, Decision, Engine, ProcessEnd, RestartPolicy

GO_ON, ALONE, JOB, ELASTIC, STOP = (Answer.GO_ON, Answer.START_ALONE, Answer.RESTART_JOB, Answer.RESTART_ELASTIC,
                                    Answer.STOP)
ENGINES = {
    "local": Engine("local", starts_one_again=True),
    "ssh-elastic": Engine("SSH", starts_one_again=True, elastic=True),
    "slurm": Engine("Slurm", starts_one_again=False),
    "slurm-elastic": Engine("Slurm", starts_one_again=False, elastic=True),
}
CRASH = AttemptEnd(StopReason.FAILURE, ("ValueError", "train.py", 12), "ValueError: bad shard at train.py:12")
OTHER_CRASH = AttemptEnd(StopReason.FAILURE, ("KeyError", "train.py", 40), "KeyError: 'x' at train.py:40")
STALL = AttemptEnd(StopReason.STALL, ("stall", "train.py:30"), "the job stalled")
LOST_HOST = AttemptEnd(StopReason.FAILURE, None, None)  # a host gone: no fingerprint, never "the same"
SIGNAL = AttemptEnd(StopReason.SIGNAL)
TIMEOUT = AttemptEnd(StopReason.TIMEOUT)
INTERNAL = AttemptEnd(StopReason.INTERNAL)
NOT_STARTED = AttemptEnd(StopReason.NOT_STARTED)
SUCCESS = AttemptEnd(None)
# Every script had returned; then process 1 aborted in an exit hook.
AT_TEARDOWN = AttemptEnd(StopReason.FAILURE, ("crash", "SIGABRT", 1, "teardown"), "killed by SIGABRT",
                         finished="process 1 on hostB")
ABORT_IN_WORK = AttemptEnd(StopReason.FAILURE, ("crash", "SIGABRT", 1, "work"), "killed by SIGABRT")
RAN_OUT = AttemptEnd(StopReason.FAILURE, ("ValueError", "train.py", 12), "ValueError", ran_out=True)


def process_end(rank: int, fingerprint=("OSError", "io.py", 3)) -> ProcessEnd:
    return ProcessEnd(rank, fingerprint, "OSError: gone at io.py:3", f"process {rank}", "exit code 1")


def play(engine: str, ends, budget: int = 2, recoverable: bool | None = None, total: int = 4) -> list[Answer]:
    """Every answer, in order, to a run that meets ``ends``; "join" joins
    every process announcing recoverability, ``A`` begins another attempt."""
    policy = RestartPolicy(budget, ENGINES[engine], recoverable)
    policy.begin_attempt(total)
    answers = []
    for end in ends:
        if end == "join":
            for rank in range(total):
                policy.joined(rank, True)
        elif end == A:
            policy.begin_attempt(total)
        else:
            answers.append(policy.decide(end).answer)
    return answers


P0, P1, P2, P3 = (process_end(rank) for rank in range(4))
P2X, P3Y, P2U = process_end(2, ("x",)), process_end(3, ("y",)), process_end(2, None)
A = "attempt"

# row: the ends, in order, then the last one's answer on local, ssh-elastic, slurm, slurm-elastic
TABLE = [
    ("a crash", [CRASH], [JOB, ELASTIC, JOB, ELASTIC]),
    ("the same crash again", [CRASH, A, CRASH], [STOP, STOP, STOP, STOP]),
    ("another crash after a crash", [CRASH, A, OTHER_CRASH], [JOB, ELASTIC, JOB, ELASTIC]),
    ("a stall", [STALL], [JOB, ELASTIC, JOB, ELASTIC]),
    ("the same stall again", [STALL, A, STALL], [STOP, STOP, STOP, STOP]),
    ("a lost host, twice", [LOST_HOST, A, LOST_HOST], [JOB, ELASTIC, JOB, ELASTIC]),
    ("a failure in a job that is not recoverable", [P2], [STOP, STOP, STOP, STOP]),
    ("a failure in a recoverable job", ["join", P2], [ALONE, ALONE, GO_ON, GO_ON]),
    ("the same failure of one process again", ["join", P2, P2], [GO_ON, GO_ON, GO_ON, GO_ON]),
    ("an unknown failure of one process, twice", ["join", P2U, P2U], [ALONE, ALONE, GO_ON, GO_ON]),
    ("process 0's failure in a recoverable job", ["join", P0], [STOP, STOP, STOP, STOP]),
    ("a recoverable job that ran to its end failed", ["join", RAN_OUT], [STOP, STOP, JOB, ELASTIC]),
    ("a signal to jaxrun", [SIGNAL], [STOP, STOP, STOP, STOP]),
    ("--timeout", [TIMEOUT], [STOP, STOP, STOP, STOP]),
    ("jaxrun's own fault", [INTERNAL], [STOP, STOP, STOP, STOP]),
    ("a restart that could not start", [CRASH, A, NOT_STARTED], [STOP, STOP, STOP, STOP]),
    ("every process exited 0", [SUCCESS], [STOP, STOP, STOP, STOP]),
    ("a failure at teardown, once every script had returned", [AT_TEARDOWN], [STOP, STOP, STOP, STOP]),
    ("the same abort in the work", [ABORT_IN_WORK], [JOB, ELASTIC, JOB, ELASTIC]),
    ("the same crash signal in the same process and phase again", [ABORT_IN_WORK, A, ABORT_IN_WORK],
     [STOP, STOP, STOP, STOP]),
    ("the budget spent on whole jobs", [CRASH, A, OTHER_CRASH, A, LOST_HOST], [STOP, STOP, STOP, STOP]),
    ("the budget spent by processes alone", ["join", P1, P2X, P3Y], [GO_ON, GO_ON, GO_ON, GO_ON]),
    ("then a whole restart has no budget left", ["join", P1, P2X, CRASH], [STOP, STOP, JOB, ELASTIC]),
]


@pytest.mark.parametrize("engine_index, engine", list(enumerate(ENGINES)))
@pytest.mark.parametrize("row, ends, answers", TABLE, ids=[row for row, _, _ in TABLE])
def test_each_end_gets_its_answer_on_each_engine(row, ends, answers, engine_index, engine):
    assert play(engine, ends)[-1] is answers[engine_index]


def test_without_a_budget_nothing_restarts_and_a_recoverable_job_goes_on():
    for engine in ENGINES:
        assert play(engine, [CRASH], budget=0) == [STOP]
        assert play(engine, ["join", process_end(2)], budget=0) == [GO_ON]


def test_one_budget_for_the_run_counts_every_restart_and_says_which():
    policy = RestartPolicy(3, ENGINES["local"])
    policy.begin_attempt(4)
    for rank in range(4):
        policy.joined(rank, True)
    first = policy.decide(process_end(2))
    assert first.answer is ALONE and first.why.endswith("starting process 2 again alone (restart 1 of 3)")
    again = policy.decide(CRASH)
    assert again.answer is JOB and again.why == "restarting the whole job (restart 2 of 3)"
    assert policy.spent == 2 and policy.left == 1


def test_recoverable_is_decided_once_from_every_announcement_and_the_flags():
    policy = RestartPolicy(1, ENGINES["local"])
    policy.begin_attempt(3)
    policy.joined(0, True)
    policy.joined(1, True)
    assert not policy.recoverable
    assert policy.joined(2, True).turned and policy.recoverable  # the far ends are told, once
    assert not policy.joined(2, True).turned
    policy.begin_attempt(3)  # a new attempt: its processes announce again
    assert not policy.recoverable
    forced, refused = RestartPolicy(1, ENGINES["local"], True), RestartPolicy(1, ENGINES["local"], False)
    turned = []
    for policy in (forced, refused):
        policy.begin_attempt(3)
        turned += [policy.joined(rank, True).turned for rank in range(3)]
    assert forced.recoverable and not refused.recoverable
    assert turned == [False] * 6  # with either flag the far ends knew from the start
    alone = RestartPolicy(1, ENGINES["local"], True)
    alone.begin_attempt(1)
    assert not alone.recoverable  # one process has nobody to spare


def test_the_same_failure_lines_name_what_repeats():
    policy = RestartPolicy(5, ENGINES["local"])
    policy.begin_attempt(4)
    for rank in range(4):
        policy.joined(rank, True)
    policy.decide(process_end(2))
    repeated = policy.decide(process_end(2))
    assert repeated.why == ("process 2 failed (exit code 1); the others go on (the job is recoverable: every process "
                            "enabled jax_enable_recoverability); not starting it again: the same failure as its life 1 "
                            "(OSError: gone at io.py:3)")
    assert policy.failed == [2]
    policy.decide(CRASH)
    policy.begin_attempt(4)
    assert policy.decide(CRASH).why == ("not restarting: the same failure as attempt 1 "
                                        "(ValueError: bad shard at train.py:12)")


def test_a_gang_says_once_an_attempt_that_only_whole_jobs_restart():
    policy = RestartPolicy(1, ENGINES["slurm"])
    assert policy.begin_attempt(2) is None
    assert policy.joined(0, True).line is None
    line = policy.joined(1, True).line
    assert line.startswith("jaxrun: the job is recoverable: every process enabled jax_enable_recoverability; Slurm "
                           "starts the processes as one gang")
    assert policy.joined(1, True).line is None
    forced = RestartPolicy(1, ENGINES["slurm"], True)
    assert forced.begin_attempt(2).startswith("jaxrun: the job is recoverable (--recoverable); Slurm")
    assert RestartPolicy(1, ENGINES["local"], True).begin_attempt(2) is None


def test_a_finished_run_says_why_it_is_not_restarted():
    policy = RestartPolicy(2, ENGINES["local"])
    policy.begin_attempt(3)
    decision = policy.decide(AT_TEARDOWN)
    assert decision == Decision(STOP, "not restarting: the work finished (every process's script returned) before "
                                      "process 1 on hostB failed at teardown")
    assert policy.spent == 0
