"""The global batch bftrainerd decides (``--elastic=...,batch=MIN:MAX``), applied at a
step boundary: the sampler's ``global_batch`` changes for all ranks at once, and the
learning rate follows the job's rule or the user's callback.

bft-run reads the decision (the ``batch_now`` of the job's tag) and hands it to the
workers with a new generation, so it takes effect where a change of world does: after
a commit, at the same step on every rank, after the members' states were made equal.
The change is then committed, so that a rollback returns to it and a newcomer receives
it with the rest of the state.
"""

from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, List, Optional

if TYPE_CHECKING:
    from .state import State

#: ``fn(state, old, new)``: the global batch changes from ``old`` to ``new`` samples
#: per step (the sampler already has ``new``); adjust the learning rate or anything
#: else that depends on it. Replaces the ``lr=`` rule.
BatchCallback = Callable[["State", int, int], None]

RULES = ("none", "linear", "sqrt")
ENV_RULE = "BFT_LR_RULE"

_callbacks: List[BatchCallback] = []
_warned = False


def on_batch_change(fn: BatchCallback) -> BatchCallback:
    """Register ``fn(state, old, new)``, called when the global batch changes (usable
    as a decorator). With a callback, the ``lr=`` rule is not applied: the callback
    decides."""
    if not callable(fn):
        raise TypeError(f"on_batch_change needs a callable, got a {type(fn).__name__}")
    _callbacks.append(fn)
    return fn


def lr_factor(rule: str, batch: int, base: int) -> float:
    """The learning rate's factor at global batch ``batch`` for a script written for
    ``base``: ``linear`` batch/base, ``sqrt`` sqrt(batch/base), ``none`` 1."""
    if rule == "linear":
        return batch / base
    if rule == "sqrt":
        return math.sqrt(batch / base)
    if rule == "none":
        return 1.0
    raise ValueError(f"unknown learning-rate rule {rule!r}; expected one of {', '.join(RULES)}")


def rule_of(state: "State") -> str:
    """The rule in force: ``State(lr_rule=...)``, else the job's ``lr=`` (bft-run's
    ``BFT_LR_RULE``), else ``none``."""
    rule = getattr(state, "lr_rule", None) or os.environ.get(ENV_RULE) or "none"
    if rule not in RULES:
        raise ValueError(f"unknown learning-rate rule {rule!r}; expected one of {', '.join(RULES)}")
    return rule


def _scale(state: "State", f: float) -> None:
    """Multiply the optimizer's learning rates by ``f``, and the scheduler's bases
    (``base_lrs``, the groups' ``initial_lr``) with them, so that a scheduler that
    recomputes lr from its bases keeps the factor."""
    if f == 1.0:
        return
    opt = state.optimizer
    if opt is not None:
        for g in opt.param_groups:
            for k in ("lr", "initial_lr"):
                v = g.get(k)
                if v is None:
                    continue
                if hasattr(v, "mul_"):
                    v.mul_(f)
                else:
                    g[k] = v * f
    sched = state.scheduler
    if sched is not None and isinstance(getattr(sched, "base_lrs", None), list):
        sched.base_lrs = [b * f for b in sched.base_lrs]


def apply(state: "State", batch: Optional[int]) -> bool:
    """Take the decided global batch ``batch`` (``None``: the script's own) at this
    step boundary; every rank calls it at the same one. True when it changed."""
    global _warned
    s = state.sampler
    if s is None or s.global_batch is None:
        if batch is not None and not _warned:
            _warned = True
            print(
                "bftrainer: bftrainerd decided a global batch of "
                f"{batch}, but this script's sampler has no global_batch= (per-rank batch_size= "
                "or none): the decision is ignored",
                file=sys.stderr,
                flush=True,
            )
        return False
    new = batch if batch is not None else s.base_batch
    old = s.global_batch
    if new == old:
        return False
    s.global_batch = new
    if _callbacks:
        for fn in _callbacks:
            fn(state, old, new)
    else:
        rule = rule_of(state)
        base = s.base_batch
        _scale(state, lr_factor(rule, new, base) / lr_factor(rule, old, base))
    return True
