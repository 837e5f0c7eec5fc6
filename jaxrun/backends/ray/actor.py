"""The far end of ``--launcher ray``: a Ray actor's body, and the task agent it starts.

``ControllerHost`` is the actor's class.  Ray pickles it by reference, as
``jaxrun.backends.ray.actor.ControllerHost``, and each worker imports this
module (it imports no ray, and nothing heavy).  Its one call starts
``python -m jaxrun.backends.ray.actor --agent FD -- COMMAND``: the scheduler's task
agent, which dies with the actor that holds the other end of pipe FD, and
from there on all is the scheduler backend's (the task channel).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping

from jaxrun import contract

# What a Ray worker's environment holds for Ray alone (and PYTHONBREAKPOINT=ray.util.rpdb...).
WORKER_ONLY = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_CLIENT_MODE", "RAY_LD_PRELOAD_ON_WORKERS",
               "PYTHONDONTWRITEBYTECODE")
SAID_TAIL = 4000  # characters of what the agent said itself that go back to the driver


def node_env(worker_env: Mapping[str, str], sent: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment: its Ray worker's, less what is Ray's alone, plus ``sent``."""
    env = {k: v for k, v in worker_env.items()
           if k not in WORKER_ONLY and not (k == "PYTHONBREAKPOINT" and v.startswith("ray."))}
    env.update(sent)
    return env


class ControllerHost:
    """A Ray actor's body: it runs one controller's task agent as its child."""

    def run(self, command: list[str], env: dict, cwd: str | None) -> tuple[int, str]:
        """The agent's exit status, and what it said itself (the controller's
        bytes go over the task channel)."""
        lifeline_r, lifeline_w = os.pipe()  # the agent dies with this actor
        argv = [command[0], "-m", contract.RAY_ACTOR_MODULE, "--agent", str(lifeline_r), "--", *command]
        try:
            agent = subprocess.Popen(argv, env=node_env(os.environ, env), cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(lifeline_r,))
        except OSError as e:
            return 127, f"cannot start its task agent on this node (in {cwd}): {e}"
        finally:
            os.close(lifeline_r)
        said = agent.stdout.read()
        code = agent.wait()
        os.close(lifeline_w)
        return contract.exit_status(code), said.decode(errors="replace")[-SAID_TAIL:]


def agent(argv: list[str]) -> int:
    """``FD -- COMMAND``: the task agent, which dies with the actor that holds FD's other end."""
    lifeline = int(argv[0])

    def watch() -> None:  # the controller's lifeline is ours: it goes too
        os.read(lifeline, 1)  # the actor writes nothing: this returns as it ends
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="actor-lifeline", daemon=True).start()
    from jaxrun.backends.scheduler import task_agent

    return task_agent.main(argv[1:])


def main(argv: list[str]) -> int | str:
    if argv[:1] == ["--agent"] and len(argv) > 3 and argv[1].isdigit() and argv[2] == "--":
        return agent(argv[1:])
    return f"usage: python -m {contract.RAY_ACTOR_MODULE} --agent FD -- COMMAND..."  # sys.exit prints it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
