"""Break named behaviours on purpose, in a copy, and see which tests notice.

    python tests/mutations.py             # every mutation
    python tests/mutations.py --list      # their names and what they break
    python tests/mutations.py pump-drops-partial-line sighup-unhandled
    python tests/mutations.py --whole-files   # run each mutation's whole test files, not just -k

Each mutation copies the repository (without .git) to a temporary folder,
edits the copy's package, and runs the tests that claim the behaviour there,
with the copy first on PYTHONPATH (children, scheduler tasks and SSH hosts
inherit it).  A mutation that no test catches is a test that claims more
than it checks.  Run it by hand before a large refactor; CI does not.
A mutation whose text is no longer found is reported, so this file has to
follow the code it mutates.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    breaks: str
    edits: tuple[tuple[str, str, str], ...]  # (file, old text, new text)
    tests: tuple[str, ...]
    keyword: str = ""  # pytest -k, to run only the tests that claim it


MUTATIONS = [
    Mutation(
        "straggler-swapped",
        "the straggler rule names the process that waits most, not the one the others wait for",
        (("jaxrun/launcher/attempt/straggler.py", "    least = min(shares, key=lambda rank: (shares[rank], rank))",
          "    least = max(shares, key=lambda rank: (shares[rank], rank))"),),
        ("tests/unit/test_straggler.py", "tests/e2e/test_straggler.py"),
        "named",
    ),
    Mutation(
        "account-waits-are-programs",
        "the time account counts a wait inside JAX as the process's programs, and its programs as a wait",
        (("jaxrun/child/watch/accounting.py", """            self.parts["programs"] += ran
            self.parts["waiting"] += seconds - ran""", """            self.parts["waiting"] += ran
            self.parts["programs"] += seconds - ran"""),),
        ("tests/unit/test_straggler.py", "tests/e2e/test_straggler.py"),
        "part or local-host",
    ),
    Mutation(
        "scheduler-runs-local",
        "--launcher slurm/mpirun quietly start local processes instead",
        (("jaxrun/backends/__init__.py", "return start(config.backend_options, config.options, console)",
          "return start_local(config, console)"),),
        ("tests/e2e/test_slurm.py", "tests/e2e/test_mpirun.py"),
        "toy or rank",
    ),
    Mutation(
        "scheduler-rank-zero",
        "under a scheduler, {process_id} is always 0 and JAXRUN_PROCESS_ID is unset",
        (
            ("jaxrun/backends/scheduler/task_agent.py", "contract.placeholder_values(rank, count,",
             "contract.placeholder_values(0, count,"),
            ("jaxrun/child/join/bootstrap.py", "    environ[contract.PROCESS_ID] = str(rank)\n",
             "    environ.pop(contract.PROCESS_ID, None)\n"),
        ),
        ("tests/e2e/test_slurm.py", "tests/e2e/test_mpirun.py"),
        "rank",
    ),
    Mutation(
        "pump-drops-partial-line",
        "the pumped log writer (SSH, srun, mpirun) drops an unfinished last line",
        (("jaxrun/launcher/output/pump.py", "        view = memoryview(data)\n",
          "        held = getattr(src, 'held_line', b'') + data\n"
          "        src.held_line = held[held.rfind(b'\\n') + 1:]\n"
          "        view = memoryview(held[:held.rfind(b'\\n') + 1])\n"),),
        ("tests/e2e/test_ssh.py", "tests/e2e/test_slurm.py", "tests/e2e/test_mpirun.py"),
        "every_byte",
    ),
    Mutation(
        "sighup-unhandled",
        "SIGHUP is no longer handled: jaxrun dies of it without a summary",
        (("jaxrun/contract/helpers.py", "STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)",
          "STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)"),),
        ("tests/e2e/test_supervision.py",),
        "forwarded",
    ),
    Mutation(
        "signals-not-forwarded",
        "SIGINT/SIGTERM/SIGHUP stop the job without reaching the children",
        (("jaxrun/launcher/attempt/supervisor.py", "self._begin_stop(StopReason.SIGNAL, self.grace, signum)",
          "self._begin_stop(StopReason.SIGNAL, self.grace, 0)"),),
        ("tests/e2e/test_supervision.py",),
        "forwarded",
    ),
    Mutation(
        "preload-unused",
        "the preloading fork server is never used",
        (("jaxrun/backends/__init__.py", "if config.preload:", "if False:"),),
        ("tests/e2e/test_local.py",),
        "forked",
    ),
    Mutation(
        "inotify-never-armed",
        "quiet log files are never watched with inotify",
        (("jaxrun/launcher/output/filewatch.py", "        if self._init is None:\n            return None",
          "        if True:\n            return None"),),
        ("tests/e2e/test_console.py",),
        "follows",
    ),
    Mutation(
        "shape-check-disabled",
        "make_global_array no longer checks what load() returned",
        (("jaxrun/runtime.py", "if data.shape != want:", "if False:"),),
        ("tests/e2e/test_runtime.py",),
        "general or inferred",
    ),
    Mutation(
        "engine-note-per-process",
        "the console shows a scheduler step's failure once per process again",
        (("jaxrun/launcher/output/printer.py", "if contract.parse_engine_note(",
          "if False and contract.parse_engine_note("),),
        ("tests/e2e/test_mpirun.py", "tests/unit/test_engine_note.py"),
        "named_once or console",
    ),
    Mutation(
        "recovery-stops-the-others",
        "a recoverable job's failed process other than 0 stops every process (fail-fast as before)",
        (("jaxrun/launcher/restarts/policy.py",
          "        return self.recoverable and rank != 0",
          "        return False"),),
        ("tests/unit/test_policy.py", "tests/unit/test_supervisor.py", "tests/e2e/test_recoverable.py"),
        "alone or spared or restarts_alone or ssh or recoverable",
    ),
    Mutation(
        "gang-not-told-recoverable",
        "the launcher decides a job is recoverable but never tells a gang's task agents, so the engine ends the others",
        (("jaxrun/launcher/attempt/supervisor.py",
          "            self.backend.job_is_recoverable()",
          "            pass"),),
        ("tests/e2e/test_recoverable.py",),
        "gang",
    ),
    Mutation(
        "policy-elastic-and-plain-swapped",
        "the restart policy places an elastic job on the same hosts, and a plain one anew",
        (("jaxrun/launcher/restarts/policy.py",
          "        if self.engine.elastic:",
          "        if not self.engine.elastic:"),),
        ("tests/unit/test_policy.py",),
        "",
    ),
    Mutation(
        "policy-alone-and-go-on-swapped",
        "the restart policy lets the others go on where it should start the process again, and the reverse",
        (("jaxrun/launcher/restarts/policy.py",
          "        return Decision(Answer.START_ALONE, f\"{head}; starting process",
          "        return Decision(Answer.GO_ON, f\"{head}; starting process"),
         ("jaxrun/launcher/restarts/policy.py",
          "        return Decision(Answer.GO_ON, line)",
          "        return Decision(Answer.START_ALONE, line)"),),
        ("tests/unit/test_policy.py",),
        "",
    ),
    Mutation(
        "recovery-flag-lost-at-join",
        "a process that enabled recoverability joins as one that did not",
        (("jaxrun/child/join/bootstrap.py",
          "    return bool(holder is not None and holder.value)",
          "    return False"),),
        ("tests/e2e/test_recoverable.py",),
        "restarts_alone",
    ),
    Mutation(
        "joined-when-initialize-returns",
        "a process counts as joined only once initialize() returns (every process at once)",
        (("jaxrun/child/join/bootstrap.py",
          "    contract.mark_joined(_launch.joined_file, recoverable())\n    if _launch.rank != 0:\n",
          "    if _launch.rank != 0:\n"),
         ("jaxrun/child/join/bootstrap.py", "    try:\n        real(**kwargs)\n    finally:\n",
          "    try:\n        real(**kwargs)\n        contract.mark_joined(_launch.joined_file, recoverable())\n"
          "    finally:\n"),),
        ("tests/e2e/test_progress.py",),
        "late",
    ),
    Mutation(
        "far-end-signals-reaped-group",
        "a far end (SSH agents, task agent) still signals its controller's group after reaping it",
        (("jaxrun/backends/far_end.py", "    controller.group.reaped()  #", "    pass  #"),),
        ("tests/unit/test_far_end.py", "tests/e2e/test_agents.py", "tests/e2e/test_ssh.py",
         "tests/e2e/test_slurm.py", "tests/e2e/test_mpirun.py"),
        "reaped or toy or relays",  # the runner's own tests catch it; the rest run it under every agent
    ),
    Mutation(
        "root-cause-arrival-order",
        "the first failure heard is the root cause, whatever the evidence (a fork server reaps in rank order)",
        (("jaxrun/launcher/attempt/supervisor.py",
          "            self.root_cause = causes.settle(self.records, self.heard, self.root_cause)",
          "            pass"),),
        ("tests/unit/test_supervisor.py", "tests/e2e/test_root_cause.py"),
    ),
    Mutation(
        "helper-end-is-a-failure",
        "a helper's end (an ssh client, the fork server) heard just before jaxrun's own SIGTERM becomes the failure",
        (("jaxrun/launcher/attempt/supervisor.py", "if self.reason is None and (end.lost or",
          "if False and (end.lost or"),),
        ("tests/unit/test_supervisor.py",),
        "helper or held",
    ),
    Mutation(
        "ssh-pid-is-the-clients",
        "over SSH the report gives the local client's pid, not the controller's",
        (("jaxrun/backends/ssh/children.py", 'facts.get("pid", pid), lost)', "None, lost)"),),
        ("tests/e2e/test_ssh.py",),
        "own_pids",
    ),
    Mutation(
        "helpers-unshielded",
        "the fork server, ssh clients and mpirun die of a SIGTERM sent to the whole tree",
        (("jaxrun/backends/shield.py",
          "    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)\n    try:\n        yield\n",
          "    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())\n    try:\n        yield\n"),),
        ("tests/e2e/test_tree_sigterm.py",),
        "ssh or mpirun",
    ),
    Mutation(
        "elastic-retries-lost-hosts",
        "an elastic restart checks the hosts lost in the failed attempt again, instead of leaving them out",
        (("jaxrun/launcher/run.py", "candidates = tuple(elastic.candidates(listed, last, lost))",
          "candidates = tuple(elastic.candidates(listed, last, {}))"),),
        ("tests/e2e/test_elastic.py",),
        "spare",
    ),
    Mutation(
        "elastic-without-spares",
        "an elastic restart never brings in a spare host: it shrinks at once",
        (("jaxrun/launcher/restarts/elastic.py", "[h.name for h in last if h.name in by_name] + list(by_name))",
          "[h.name for h in last if h.name in by_name])"),),
        ("tests/e2e/test_elastic.py",),
        "spare or hosts_command",
    ),
    Mutation(
        "slurm-keeps-drained-nodes",
        "an elastic restart under Slurm runs on nodes Slurm drained",
        (("jaxrun/backends/scheduler/slurm.py", '"down", "drain", "drained", "draining", ', '"down", '),),
        ("tests/e2e/test_slurm_elastic.py",),
        "drained",
    ),
    Mutation(
        "ray-driver-outlives-jaxrun",
        "the Ray driver (and so its actors and placement group) stays when jaxrun is gone",
        (("jaxrun/backends/ray/driver.py", "    os._exit(0)  # Ray ends this driver's actors and placement group",
          "    pass"),),
        ("tests/e2e/test_ray.py",),
        "sigkill or waits",
    ),
    Mutation(
        "interactive-output-per-process",
        "jaxrun -i shows output that every process wrote alike once per process, not once with its ranks",
        (("jaxrun/launcher/interactive/merge.py", "            found.setdefault(text, []).append(rank)",
          "            found.setdefault(f\"{rank}\\0{text}\", []).append(rank)"),),
        ("tests/unit/test_interactive.py", "tests/e2e/test_interactive.py"),
        "toy or identical",
    ),
    Mutation(
        "interactive-ctrl-c-not-forwarded",
        "Ctrl-C during a statement of jaxrun -i reaches no process: the statement runs on",
        (("jaxrun/launcher/attempt/supervisor.py",
          "            if self.reason is None:\n                self._send_all(event.signum)", "            pass"),),
        ("tests/e2e/test_interactive.py",),
        "toy or ctrl_c",
    ),
    Mutation(
        "spin-counts-as-work",
        "native threads that spin while the main thread is parked count as work again: a GPU-shaped hang is never "
        "found",
        (("jaxrun/child/watch/activity.py",
          "        return judge_threads(before, self.last_threads, t - t0, work, own, waited,",
          "        return contract.BUSY\n"
          "        return judge_threads(before, self.last_threads, t - t0, work, own, waited,"),),
        ("tests/unit/test_stall.py", "tests/e2e/test_matrix.py"),
        "spin and not (preload or ssh or slurm or mpirun or ray)",
    ),
    Mutation(
        "starved-thread-counts-as-idle",
        "on a loaded machine a helper thread that waits for a CPU more than it gets one is taken for idle: a "
        "working job is warned of, or stopped, as a stall",
        (("jaxrun/child/watch/activity.py",
          "    if any(used[tid] + waited.get(tid, 0.0) >= wanted for tid in work if tid in used):", "    if False:"),),
        ("tests/unit/test_stall.py",),
        "starved or waited",
    ),
    Mutation(
        "main-spin-counts-as-work",
        "a main thread that loops on sched_yield inside a native call counts as work: that hang is never found",
        (("jaxrun/child/watch/activity.py",
          "        elif not main_spins(main_before, self.last_main, enough, self.gil_free):",
          "        elif True:"),),
        ("tests/unit/test_stall.py",),
        "spin",
    ),
    Mutation(
        "starved-spinner-reads-parked",
        "threads that spin on a machine so loaded that they get next to no CPU read parked: the stall's line loses "
        "its spinning threads (CI, stop 78)",
        (("jaxrun/child/watch/activity.py",
          "                             starved_spinners(switches, self.last_wanting))",
          "                             set())"),),
        ("tests/unit/test_stall.py",),
        "starved or spin",
    ),
    Mutation(
        "dump-handler-reads-as-spin",
        "the main thread's runs of jaxrun's signal handler (a stall's probe's dumps) count as its own CPU: a parked "
        "process dumped often reads spinning",
        (("jaxrun/child/watch/activity.py",
          "        if self.last_heard != heard0:",
          "        if False:"),),
        ("tests/unit/test_stall.py",),
        "handler",
    ),
    Mutation(
        "programs-never-compared",
        "--checks: processes that get different programs at one position are never stopped: the guide's parted "
        "matmul hangs again",
        (("jaxrun/child/checks/programs.py",
          "            if len(sides) < 2:\n                sides = sides_of(entries, 'h')",
          "            if True:\n                sides = sides_of(entries, 'h')"),),
        ("tests/unit/test_checks_programs.py", "tests/e2e/test_checks_programs.py"),
        "odd_side or mesh_over_some",
    ),
    Mutation(
        "programs-without-collectives-counted",
        "--checks counts a program with no collective too: process 0 alone logging a replicated mean shifts its "
        "positions, and the job is stopped for nothing",
        (("jaxrun/child/checks/programs.py", "        if not collectives:", "        if False:"),),
        ("tests/e2e/test_checks_programs.py",),
        "agreeing",
    ),
    Mutation(
        "programs-counted-across-threads",
        "--checks counts a thread pool's programs by position, whichever worker compiled them: the order of the "
        "workers stops a healthy job",
        (("jaxrun/child/checks/programs.py", "        main = thread is threading.main_thread()\n",
          "        main = True\n"),),
        ("tests/e2e/test_checks_programs.py",),
        "thread_pool",
    ),
    Mutation(
        "programs-body-stops",
        "--checks stops a program whose body alone differs (a per-process constant): a healthy job is stopped",
        (("jaxrun/child/checks/programs.py", "                if not self.strict:\n                    self._warn",
          "                if False:\n                    self._warn"),),
        ("tests/e2e/test_checks_programs.py",),
        "constant",
    ),
    Mutation(
        "replicas-counted-across-threads",
        "--checks counts a prefetching loader's calls across its threads: the threads' order is named a mismatch",
        (("jaxrun/child/checks/replicas.py", "            if threading.current_thread() is not checker.main:",
          "            if False:"),),
        ("tests/e2e/test_checks_replicas.py",),
        "prefetch",
    ),
    Mutation(
        "replicas-never-compared",
        "--checks: processes that hold one slice with different data are never stopped: the guide's replicas "
        "loaded by process index give two losses again",
        (("jaxrun/child/checks/replicas.py", "            if len({e[\"fp\"] for e in entries.values()}) > 1:",
          "            if False:"),),
        ("tests/e2e/test_checks_replicas.py",),
        "fail_loud",
    ),
    Mutation(
        "replicas-slice-index-off-by-one",
        "--checks: a replica mismatch names the slice one row off",
        (("jaxrun/child/checks/replicas_prints.py", "    return tuple(s.indices(d)[:2] if",
          "    return tuple(tuple(i + 1 for i in s.indices(d)[:2]) if"),),
        ("tests/e2e/test_checks_replicas.py",),
        "fail_loud",
    ),
    Mutation(
        "replicas-sampled-per-process",
        "--checks: each process draws its own sample of the calls, so the processes that share a slice check "
        "different calls and a mismatch goes by",
        (("jaxrun/child/checks/replicas.py", "checker.prints.sampled(n)",
          "checker.prints.sampled(n + checker.board.rank)"),),
        ("tests/e2e/test_checks_replicas.py",),
        "fail_loud",
    ),
    Mutation(
        "coordinator-wildcard",
        "a local job's coordination service binds every interface again (a TCP port, not its private socket)",
        (("jaxrun/backends/local.py",
          "    if path is not None:\n        return contract.unix_address(path), contract.unix_address(path)\n"
          "    address = contract.join_address(\"127.0.0.1\", portable.free_port(\"127.0.0.1\"))\n"
          "    return address, address\n",
          "    address = contract.join_address(\"127.0.0.1\", portable.free_port(\"127.0.0.1\"))\n"
          "    return address, \"[::]:\" + address.rsplit(\":\", 1)[1]\n"),),
        ("tests/unit/test_coordinator_address.py", "tests/e2e/test_security.py"),
        "socket or wildcard or another_user",
    ),
    Mutation(
        "meeting-bodies-apart-unsaid",
        "where the bodies differ no one says so, and the meeting waits for a word that never comes",
        (("jaxrun/child/checks/meeting.py", "if len(bodies) > 1 and sum(int(n) for _, n in bodies) >= count:",
          "if False:"),),
        ("tests/unit/test_meeting.py",),
        "bodies",
    ),
    Mutation(
        "starved-program-taken-for-a-wait",
        "a program that computes on a starved machine, its threads waiting for a CPU, is taken for a wait again",
        (("jaxrun/child/watch/waiting.py", "        return after - before > STARVED_SHARE * (now - since)\n",
          "        return False\n"),),
        ("tests/unit/test_parting.py",),
        "starved",
    ),
]


def copy_repo(dest: str) -> None:
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".pytest_cache"))


def apply(mutation: Mutation, copy: str) -> str | None:
    """Edit the copy; the problem, if an edit's text is not found exactly once."""
    for rel, old, new in mutation.edits:
        path = os.path.join(copy, rel)
        with open(path) as f:
            text = f.read()
        if text.count(old) != 1:
            return f"{rel}: expected text found {text.count(old)} times"
        with open(path, "w") as f:
            f.write(text.replace(old, new))
    return None


def run(mutation: Mutation, whole_files: bool) -> tuple[str, list[str], float]:
    scratch = tempfile.mkdtemp(prefix=f"jaxrun-mutation-{mutation.name}-")
    copy = os.path.join(scratch, "repo")
    start = time.monotonic()
    try:
        copy_repo(copy)
        problem = apply(mutation, copy)
        if problem:
            return f"NOT APPLIED ({problem})", [], 0.0
        cmd = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *mutation.tests]
        if mutation.keyword and not whole_files:
            cmd += ["-k", mutation.keyword]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [copy, os.environ.get("PYTHONPATH")])))
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True)
        failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
        if proc.returncode == 0:
            verdict = "SURVIVED"
        elif failed:
            verdict = "caught"
        else:
            verdict = f"pytest exited {proc.returncode} without a failed test"
        return verdict, failed, time.monotonic() - start
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--whole-files", action="store_true", help="run each mutation's test files whole")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:26} {m.breaks}")
        return 0
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown mutation {unknown[0]!r}; see --list")
    chosen = [by_name[n] for n in args.names] or MUTATIONS
    survived = 0
    for mutation in chosen:
        verdict, failed, seconds = run(mutation, args.whole_files)
        survived += verdict != "caught"
        print(f"{mutation.name}: {verdict} ({seconds:.0f} s)", flush=True)
        for test in failed:
            print(f"    {test}", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
