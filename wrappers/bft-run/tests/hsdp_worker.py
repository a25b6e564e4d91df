"""examples/train_hsdp.py (argv[1], its options after) with one fault point of
tests/hsdp.py's: a worker of local rank 0 whose agent the file $BFT_TEST_DIE_AT names
("A." for agent A) kills itself with SIGKILL at the entry of its next step's last
all-reduce on the mesh's replicate dimension, once its node mate of local rank 1 has
ended that step's reductions (it reached the optimizer). The other node's local rank 1
ends the step too, its local rank 0 fails it: the case of a shard that ends a step
while another fails it."""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time

import bftrainer
from bftrainer import _mesh
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

DIE_AT = os.environ.get("BFT_TEST_DIE_AT", "")
MATE = DIE_AT + ".mate"
ME = os.environ.get("BFT_WORKER_ID", "")
LOCAL = os.environ.get("LOCAL_RANK", os.environ.get("BFT_LOCAL_RANK", "0"))
# Replicate all-reduces in this step and in the step before (a step after a change
# of generation may have one more); the first step to die in.
calls, per_step, target = 0, 0, -1
STATES = []  # the script's State: its step is the last commit (the step taken is one more)


def mine() -> bool:
    try:
        return bool(DIE_AT) and ME.startswith(open(DIE_AT).read().strip())
    except OSError:
        return False


init = bftrainer.State.__init__


def init_and_keep(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    init(self, *args, **kwargs)
    STATES.append(self)


def committed() -> int:
    return STATES[0].step if STATES else -10


def before_step(*_: object) -> None:
    if LOCAL == "1" and mine():
        with open(MATE + ".tmp", "w") as f:
            f.write(str(committed() + 1))
        os.replace(MATE + ".tmp", MATE)


def after_step(*_: object) -> None:
    global calls, per_step, target
    per_step, calls = calls, 0
    if LOCAL == "0" and target < 0 and mine():
        target = committed() + 2


def allreduce_or_die(self, tensors, opts=None):  # type: ignore[no-untyped-def]
    global calls
    if self.group_name == "bftrainer:replicate":
        calls += 1
        if 0 <= target <= committed() + 1 and per_step and calls == per_step:
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
    return allreduce(self, tensors, opts)


bftrainer.State.__init__ = init_and_keep
register_optimizer_step_pre_hook(before_step)
register_optimizer_step_post_hook(after_step)
allreduce = _mesh._MeshGroup.allreduce
_mesh._MeshGroup.allreduce = allreduce_or_die
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
