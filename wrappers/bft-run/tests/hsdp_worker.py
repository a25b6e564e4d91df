"""examples/train_hsdp.py (argv[1], its options after) with the fault points of
tests/hsdp.py. The test writes "A. WHERE" into the file $BFT_TEST_DIE_AT; the worker of
local rank 0 of agent A then kills itself with SIGKILL, once, in its next step, at
WHERE, when its node mate of local rank 1 has got that far in the same step:

- "allreduce": at the entry of its step's last all-reduce on the mesh's replicate
  dimension, once the mate has ended the step's reductions (it reached the optimizer).
  The other node's local rank 1 ends its reductions too, its local rank 0 fails them.
- "vote": instead of voting on its step's commit (bftrainer's ``_Runtime.vote``), once
  the mate has voted. Every reduction of the step has completed everywhere: the other
  node commits the step, and the mate must roll it back on its node's "no"."""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time

import bftrainer
from bftrainer import _agent, _mesh
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

DIE_AT = os.environ.get("BFT_TEST_DIE_AT", "")
MATE = DIE_AT + ".mate"
ME = os.environ.get("BFT_WORKER_ID", "")
LOCAL = os.environ.get("LOCAL_RANK", os.environ.get("BFT_LOCAL_RANK", "0"))
# Replicate all-reduces in this step and in the step before (a step after a change
# of generation may have one more); the first step to die in, and where.
calls, per_step, target, where = 0, 0, -1, ""
STATES = []  # the script's State: its step is the last commit (the step taken is one more)


def order() -> str:
    """WHERE if the fault file names this worker's agent, else ""."""
    try:
        agent, at = open(DIE_AT).read().split()
    except (OSError, ValueError):
        return ""
    return at if ME.startswith(agent) else ""


def committed() -> int:
    return STATES[0].step if STATES else -10


def mate_got(at: str) -> None:
    """The mate got to ``at`` in the step it takes."""
    if LOCAL == "1" and order() == at:
        with open(MATE + ".tmp", "w") as f:
            f.write(str(committed() + 1))
        os.replace(MATE + ".tmp", MATE)


def die_once_mate_got_here() -> None:
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        try:
            if open(MATE).read() == str(committed() + 1):
                break
        except OSError:
            pass
        time.sleep(0.001)
    os.remove(DIE_AT)
    os.kill(os.getpid(), signal.SIGKILL)


def after_step(*_: object) -> None:
    global calls, per_step, target, where
    per_step, calls = calls, 0
    if LOCAL == "0" and target < 0 and order():
        target, where = committed() + 2, order()


def due(at: str) -> bool:
    return where == at and 0 <= target <= committed() + 1


init = bftrainer.State.__init__


def init_and_keep(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    init(self, *args, **kwargs)
    STATES.append(self)


allreduce = _mesh._MeshGroup.allreduce


def allreduce_or_die(self, tensors, opts=None):  # type: ignore[no-untyped-def]
    global calls
    if self.group_name == "bftrainer:replicate":
        calls += 1
        if due("allreduce") and per_step and calls == per_step:
            die_once_mate_got_here()
    return allreduce(self, tensors, opts)


vote = _agent.AgentClient.vote


def vote_or_die(self, gen, k):  # type: ignore[no-untyped-def]
    mate_got("vote")
    if due("vote"):
        die_once_mate_got_here()
    return vote(self, gen, k)


bftrainer.State.__init__ = init_and_keep
register_optimizer_step_pre_hook(lambda *_: mate_got("allreduce"))
register_optimizer_step_post_hook(after_step)
_mesh._MeshGroup.allreduce = allreduce_or_die
_agent.AgentClient.vote = vote_or_die
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
