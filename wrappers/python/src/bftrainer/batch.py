"""The global batch bftrainerd decides (``--elastic=...,batch=MIN:MAX``), applied at a
step boundary: the sampler's ``global_batch`` changes for all ranks at once, and the
learning rate follows the job's rule or the user's callback.

bft-run reads the decision (the ``batch_now`` of the job's tag) and hands it to the
workers with a new generation, so it takes effect where a change of world does: after
a commit, at the same step on every rank, after the members' states were made equal.
The change is then committed, so that a rollback returns to it and a newcomer receives
it with the rest of the state.

bft-run's restarting modes (``--mode torchrun``, ``--mode mpi``) hand each world they
start the decision as it stands then, in ``BFT_GLOBAL_BATCH``; the script applies it
once per world with :func:`apply_world_batch`, after restoring its checkpoint.
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
#: The decided global batch of a restarting mode's world (bft-run sets it per world).
ENV_BATCH = "BFT_GLOBAL_BATCH"
#: The job's declared ``batch=MIN:MAX`` (spank/bftrainer exports them).
ENV_MIN, ENV_MAX = "BFT_BATCH_MIN", "BFT_BATCH_MAX"
#: The largest global batch ``batch=`` accepts (bftrainer_core::spec::MAX_BATCH).
MAX_BATCH = 1 << 24

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


def _whole(name: str, text: str) -> int:
    """A whole number of samples from 1 to MAX_BATCH, or a ValueError naming it."""
    t = text.strip()
    if not t.isdigit() or not 1 <= int(t) <= MAX_BATCH:
        raise ValueError(f"{name}={text!r} is not a global batch: expected a whole number from 1 to {MAX_BATCH}")
    return int(t)


def world_batch() -> Optional[int]:
    """The global batch bftrainerd decided for this world of a restarting mode
    (``bft-run --mode torchrun`` or ``--mode mpi``): ``BFT_GLOBAL_BATCH``, which bft-run
    sets for each world it starts from the job's tag (where only root and bftrainerd
    write), or ``None`` when there is no decision (use the script's own batch).

    The value is checked against the job's declared range (``BFT_BATCH_MIN`` and
    ``BFT_BATCH_MAX``, from ``--elastic=...,batch=MIN:MAX``): a value that is not a
    whole number, or lies outside the range, or comes without a declared range (bft-run
    sets it only for a job with one: it was put there by hand) raises ValueError saying
    which, rather than training at a batch the job did not declare."""
    raw = os.environ.get(ENV_BATCH)
    if raw is None or raw == "":
        return None
    g = _whole(ENV_BATCH, raw)
    lo_raw, hi_raw = os.environ.get(ENV_MIN), os.environ.get(ENV_MAX)
    if not lo_raw or not hi_raw:
        raise ValueError(
            f"{ENV_BATCH}={raw!r} but the job declared no batch range ({ENV_MIN}/{ENV_MAX} unset): "
            "bft-run hands a decided batch only to jobs submitted with --elastic=...,batch=MIN:MAX; "
            f"refusing a {ENV_BATCH} set by anyone else"
        )
    lo, hi = _whole(ENV_MIN, lo_raw), _whole(ENV_MAX, hi_raw)
    if not lo <= g <= hi:
        raise ValueError(
            f"{ENV_BATCH}={g} is outside the job's declared batch={lo}:{hi}: refused "
            "(bftrainerd decides only inside the range)"
        )
    return g


class _WorldState:
    """What :func:`apply` needs of a State, for a script without one."""

    def __init__(self, sampler: Any, optimizer: Any, scheduler: Any, lr_rule: Optional[str]) -> None:
        self.sampler = sampler
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.lr_rule = lr_rule


def apply_world_batch(
    sampler: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    lr_rule: Optional[str] = None,
    state: Any = None,
) -> Optional[int]:
    """Apply the decided global batch of this world (:func:`world_batch`) in a script
    under ``bft-run --mode torchrun`` or ``--mode mpi``. Call it once per world, after
    restoring the checkpoint (sampler, optimizer, scheduler) and before the first step.

    ``sampler`` is an ``ElasticSampler(..., global_batch=G0)``; its checkpoint holds the
    batch the last world ran at. The batch becomes the decision (``G0`` again without
    one), and the learning rate follows as in native mode: the callbacks of
    :func:`on_batch_change` (given ``state``, or an object with ``sampler``,
    ``optimizer``, ``scheduler``), else the rule (``lr_rule``, else the job's ``lr=``),
    from the batch the checkpoint ran at. Returns the global batch the world runs at
    (``None`` for a per-rank ``batch_size=`` sampler, which ignores the decision)."""
    st = state if state is not None else _WorldState(sampler, optimizer, scheduler, lr_rule)
    apply(st, world_batch())
    return sampler.global_batch


def _global_rank() -> str:
    """This process's rank in a restarting mode's world, as its launcher names it
    (torchrun's RANK; Open MPI's, PMIx's or MPICH's under mpirun); "0" when none does
    (one process)."""
    for k in ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        v = os.environ.get(k)
        if v is not None:
            return v.strip()
    return "0"


#: When report_progress last wrote (time.monotonic()), in this process.
_last_report = [float("-inf")]
_said_report: List[str] = []


def report_progress(samples: int, steps: int = 0, batch: Optional[int] = None, every: float = 1.0) -> bool:
    """Report the training's progress from a script under ``bft-run --mode torchrun``:
    ``samples`` and ``steps`` taken since the script started, over all ranks (the
    counts are cumulative; a restarted world may start from its checkpoint's), and the
    global ``batch`` they were taken at. bft-run measures the job's rate from them, as
    it does for native mode's scripts, and publishes it in the core job's Comment:
    bftrainerd needs it to decide the job's nodes and batch (``batch=MIN:MAX``).

    Call it after each step (or every few), from every rank or from rank 0 alone: only
    rank 0 writes (``RANK`` under torchrun mode; under ``--mode mpi`` the MPI library's
    ``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK`` or ``PMI_RANK``), at most every ``every``
    seconds, into the file bft-run names in ``BFT_PROGRESS_FILE``: its agent's own
    directory on rank 0's node, whichever node that is. Returns whether it wrote.
    Outside bft-run's restarting modes (no ``BFT_PROGRESS_FILE``) it does nothing and
    returns False. A write that fails is said once on stderr and never raised: the
    training goes on."""
    path = os.environ.get("BFT_PROGRESS_FILE")
    if not path or _global_rank() != "0":
        return False
    for name, v in (("samples", samples), ("steps", steps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"report_progress: {name}={v!r} is not a whole number >= 0")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH):
        raise ValueError(f"report_progress: batch={batch!r} is not a global batch from 1 to {MAX_BATCH}")
    import json
    import time

    now = time.monotonic()
    if now - _last_report[0] < every:
        return False
    _last_report[0] = now
    gen = os.environ.get("BFT_GENERATION", "0")
    msg = {"gen": int(gen) if gen.isdigit() else 0, "samples": samples, "steps": steps, "batch": batch}
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(msg, f)
        os.replace(tmp, path)
    except OSError as e:
        if not _said_report:
            _said_report.append(str(e))
            print(f"bftrainer: report_progress cannot write {path}: {e} (said once)", file=sys.stderr, flush=True)
        return False
    return True
