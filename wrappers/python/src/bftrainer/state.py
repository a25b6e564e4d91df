"""Training state that survives membership changes: committed at every step, restored
on a rollback, sent to newcomers (transfer.py), optionally checkpointed to disk."""

from __future__ import annotations

import os
import random
import sys
import threading
from copy import deepcopy
from typing import Any, Callable, Dict, List, Optional

from .sampler import ElasticSampler
from .transfer import copy_tree, walk

_CHECKPOINT = "bftrainer-state.pt"
_SHARDED = "sharded"  # the directory of a torch.distributed.checkpoint of sharded state
# A checkpoint is {"bftrainer": _FORMAT, "job": BFT_JOB or None, "state": state_dict()}.
_FORMAT = 2
# What a commit keeps besides model and optimizer (the "small parts").
_SMALL = ("sampler", "scheduler", "scaler")


class CheckpointError(ValueError):
    """A checkpoint on disk that this job must not, or cannot, load."""


def _has_state_dict(x: Any) -> bool:
    return callable(getattr(x, "state_dict", None)) and callable(getattr(x, "load_state_dict", None))


def _job(job: Optional[str]) -> str:
    return repr(job) if job is not None else "none (BFT_JOB is not set: a standalone run)"


def _reset_fsdp(model: Any) -> None:
    """FSDP2's per-iteration state after a forward or backward that a failure cut short
    (unsharded parameters, the reduce-scatters and all-reduces in flight, which groups
    ran): undefined, and a step run on it issues other collectives than its peers'
    (gloo: "Received data size doesn't match expected size"). torch's own
    ``reset_iter_state`` puts it back and drops the failed step's gradients. Called
    after the runtime let go of the generation's groups: every collective of ours has
    ended then (failed), and an all-gather's failure is taken here, not raised by the
    reset."""
    if model is None or "torch.distributed.fsdp" not in sys.modules:
        return
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule) or not hasattr(model, "reset_iter_state"):
        return
    fsdp = model._get_fsdp_state()
    for st in fsdp._state_ctx.all_states:
        for group in st._fsdp_param_groups:
            res = getattr(group, "_all_gather_result", None)
            if res is not None and getattr(res, "all_gather_work", None) is not None:
                try:
                    res.all_gather_work.wait()
                except Exception:  # noqa: BLE001 - the failure this rollback is for
                    pass
                group._all_gather_result = res._replace(all_gather_work=None)
    model.reset_iter_state()


class State:
    """Model, optimizer, sampler position, step counter, LR scheduler, gradient scaler,
    random number generators and user extras.

    Call ``commit()`` at the end of every step (or every few steps: a rollback goes back
    to the last commit). A commit is cheap: it keeps the step, the sampler position, the
    extras, the scheduler's and the scaler's state, the optimizer's hyperparameters
    (learning rates...) and the RNG states, not the model and the optimizer, because in
    the documented loop::

        loss.backward()
        bftrainer.allreduce_gradients(model, n)   # the step's only collective
        opt.step()
        sched.step()
        state.commit()

    model and optimizer change only after the step's last collective, and a peer's
    failure surfaces only in a collective: when one fails, model and optimizer still
    are the last commit. (Buffers that the forward pass updates, such as BatchNorm's
    running statistics, are not rolled back: a retaken step updates them once more.)

    ``copy=True`` keeps a copy of model and optimizer on the CPU (never on the GPU),
    refreshed by every commit: a device-to-host copy per commit and their size in host
    memory. Use it when a failure can come after model or optimizer changed within a
    step: gradient accumulation with an all-reduce and an optimizer step per
    micro-batch, collectives of your own after ``opt.step()`` (an all-reduce of the
    loss or of metrics before ``commit()``), anything that steps the optimizer and then
    communicates. Without the copy such a worker cannot roll back in place: it says so
    and receives the state from a peer at the next sync.

    ``lr_rule`` (``"linear"``, ``"sqrt"`` or ``"none"``) says how the learning rate
    follows a global batch that bftrainerd decides (a job with
    ``--elastic=...,batch=MIN:MAX``); without it the job's ``lr=`` applies, else none.
    ``bftrainer.on_batch_change(fn)`` replaces the rule with your own.

    ``scheduler`` and ``scaler`` (an LR scheduler, a ``torch.amp.GradScaler``) are
    committed, rolled back, checkpointed and sent to newcomers through their
    ``state_dict()``. ``rng=True`` (the default) also commits this worker's random
    number generators (torch's CPU and, once initialised, CUDA generators, Python's
    ``random``, numpy's global one if numpy is loaded) and restores them on a rollback,
    so a retaken step draws the same numbers. RNG state is per rank: it is neither sent
    to newcomers nor written to checkpoints.

    Extras are keyword arguments that become attributes (``state.epoch``,
    ``state.best_loss``...) and are committed, restored, checkpointed and sent with the
    rest. An extra is a plain value (None, bool, int, float, str, tensors, and lists,
    tuples and dicts with str or int keys of these), or an object with ``state_dict()``
    and ``load_state_dict()`` (another scheduler, an EMA helper), which goes through
    those: the object itself is kept and loaded in place. Anything else is refused at
    the first commit, naming the extra.

    Checkpoints record the job (``BFT_JOB``, set by bft-run) and ``load_checkpoint()``
    refuses another job's unless ``resume_any_job=True``. Nothing from disk or from
    peers executes code: checkpoints load with ``torch.load(weights_only=True)`` and
    newcomers receive a JSON header and raw tensors.
    """

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        sampler: Optional[ElasticSampler] = None,
        checkpoint_dir: Optional[str] = None,
        checkpoint_every: int = 0,
        *,
        scheduler: Any = None,
        scaler: Any = None,
        rng: bool = True,
        copy: bool = False,
        resume_any_job: bool = False,
        lr_rule: Optional[str] = None,
        **extras: Any,
    ) -> None:
        bad = sorted(
            k for k in extras if k.startswith("_") or k in ("step", "samples", "committed_step") or hasattr(State, k)
        )
        if bad:
            raise ValueError(f"state extras may not be named {bad}: those names are taken")
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be 0 (off) or positive, got {checkpoint_every}")
        if checkpoint_every and not checkpoint_dir:
            raise ValueError("checkpoint_every needs checkpoint_dir")
        for name, obj in (("scheduler", scheduler), ("scaler", scaler)):
            if obj is not None and not _has_state_dict(obj):
                raise TypeError(f"{name} must have state_dict() and load_state_dict(), got a {type(obj).__name__}")
        for k, v in extras.items():
            if not _has_state_dict(v):
                walk(v, f"state extra {k!r}", lambda t, _: t)
        self.model = model
        self.optimizer = optimizer
        self.sampler = sampler
        self.scheduler = scheduler
        self.scaler = scaler
        self.rng = rng
        self.copy = copy
        self.resume_any_job = resume_any_job
        if lr_rule is not None and lr_rule not in ("none", "linear", "sqrt"):
            raise ValueError(f"lr_rule must be 'linear', 'sqrt' or 'none', got {lr_rule!r}")
        # How the learning rate follows a global batch bftrainerd decides (bftrainer.batch);
        # None: the job's lr= (BFT_LR_RULE), else none.
        self.lr_rule = lr_rule
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.step = 0
        self._extras = list(extras)
        for k, v in extras.items():
            setattr(self, k, v)
        # -1: no commit to offer (a newcomer, or a worker that could not roll back in
        # place); the sync after a membership change sends it the newest commit.
        self.committed_step = -1
        self._snap: Optional[Dict[str, Any]] = None  # the small parts of the last commit
        self._copy: Optional[Dict[str, Any]] = None  # copy=True: model and optimizer, on the CPU
        self._copy_bufs: Dict[Any, Any] = {}  # (part, path) -> CPU tensor, reused by the next copy
        self._clean = True  # model and optimizer equal the last commit (or nothing was committed)
        self._intact = True  # model and optimizer are whole (not half-received)
        # The optimizer stepped since the last commit: a rollback must put model and
        # optimizer back too, whatever the failed collective was (under HSDP nothing
        # else tells: FSDP's reductions end inside backward, and a failure in a
        # collective of the script's own between opt.step() and commit() left the
        # stepped model in place, to be stepped again by the rerun).
        self._stepped = False
        hook = getattr(optimizer, "register_step_post_hook", None)
        if hook is not None:
            hook(self._on_optimizer_step)
        # Sharded (HSDP) steps commit on all of a node's workers or on none: a vote
        # before the optimizer steps (elastic._Runtime.vote; nothing without a mesh).
        pre = getattr(optimizer, "register_step_pre_hook", None)
        if pre is not None:
            pre(self._before_optimizer_step)
        self._reset_callbacks: List[Callable[[], None]] = []
        self._writer: Optional[threading.Thread] = None
        self._write_error: Optional[BaseException] = None
        self._said_skip = False

    def _on_optimizer_step(self, *_: Any) -> None:
        self._stepped = True

    def _before_optimizer_step(self, *_: Any) -> None:
        from . import elastic

        elastic._before_optimizer_step()

    @property
    def samples(self) -> int:
        """Samples taken since the start of training (all ranks, all epochs)."""
        return self.sampler.total if self.sampler is not None else 0

    # -- what is committed -------------------------------------------------------

    def _extra_state(self, k: str) -> Any:
        v = getattr(self, k)
        if _has_state_dict(v):
            return walk(v.state_dict(), f"state extra {k!r} (its state_dict())", lambda t, _: t)
        return walk(v, f"state extra {k!r}", lambda t, _: t)

    def _small_state(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"step": self.step, "extras": {k: self._extra_state(k) for k in self._extras}}
        for name in _SMALL:
            obj = getattr(self, name)
            if obj is not None:
                d[name] = obj.state_dict()
        return d

    def state_dict(self) -> Dict[str, Any]:
        """The state as plain data: step, model, optimizer, sampler, scheduler, scaler
        (each as its ``state_dict()``: live tensors, not copies) and extras. It holds
        only tensors and plain containers, which ``torch.load(weights_only=True)``
        reads back. RNG state is not part of it (it is per rank)."""
        d = self._small_state()
        if self.model is not None:
            d["model"] = self.model.state_dict()
        if self.optimizer is not None:
            d["optimizer"] = self.optimizer.state_dict()
        return d

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        """Load ``d`` (a ``state_dict()``); ``d`` is copied, not kept."""
        d = dict(d)
        if "optimizer" in d:
            d["optimizer"] = copy_tree(d["optimizer"], "optimizer state")
        self._load(d, model_loaded=False)

    def _load(self, d: Dict[str, Any], model_loaded: bool) -> None:
        """Load ``d``, whose optimizer tensors may become the optimizer's (``d`` comes
        from a checkpoint or a transfer); ``model_loaded``: the model already holds it."""
        parts = [n for n in ("model", "optimizer") + _SMALL if getattr(self, n) is not None]
        missing = [n for n in parts if n not in d and not (n == "model" and model_loaded)]
        if missing:
            raise ValueError(f"the state loaded has no {missing}, which this State has")
        extras = d.get("extras", {})
        if set(extras) != set(self._extras):
            raise ValueError(
                f"the state loaded has the extras {sorted(extras)}, this State has {sorted(self._extras)}"
            )
        self.step = int(d["step"])
        if self.model is not None and not model_loaded:
            self.model.load_state_dict(d["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(d["optimizer"])
        for name in _SMALL:
            obj = getattr(self, name)
            if obj is not None:
                obj.load_state_dict(copy_tree(d[name], f"{name} state"))
        for k, v in extras.items():
            value = copy_tree(v, f"state extra {k!r}")
            target = getattr(self, k)
            if _has_state_dict(target):
                target.load_state_dict(value)
            else:
                setattr(self, k, value)

    def save(self) -> None:
        """Commit the current state in memory: what a rollback returns to."""
        snap = copy_tree(self._small_state(), "state")
        if self.optimizer is not None:
            snap["groups"] = [{k: _dup(v) for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        if self.rng:
            snap["rng"] = _rng_state()
        if self.copy:
            self._copy = self._cpu_copy()
        self._snap = snap
        self.committed_step = self.step
        self._clean = self._intact = True
        self._stepped = False

    def _cpu_copy(self) -> Dict[str, Any]:
        """Model and optimizer copied to the CPU, into the previous copy's tensors where
        they still fit (no new allocation per commit)."""
        import torch

        bufs: Dict[Any, Any] = {}

        def into(part: str) -> Callable[[Any, Any], Any]:
            def tensor(t: Any, path: Any) -> Any:
                old = self._copy_bufs.get((part, path))
                if old is not None and old.dtype == t.dtype and old.shape == t.shape:
                    old.copy_(t.detach())
                else:
                    old = t.detach().to("cpu", copy=True)
                bufs[(part, path)] = old
                return old

            return tensor

        out: Dict[str, Any] = {}
        with torch.no_grad():
            if self.model is not None:
                out["model"] = walk(self.model.state_dict(), "model state", into("model"))
            if self.optimizer is not None:
                out["optimizer"] = walk(self.optimizer.state_dict(), "optimizer state", into("optimizer"))
        self._copy_bufs = bufs
        return out

    def restore(self, dirty: bool = False) -> None:
        """Go back to the last commit after a failure. ``dirty``: the failure came after
        model or optimizer may have changed in this step (after a successful
        ``allreduce_gradients`` of the step; the optimizer stepping since the commit counts
        as dirty whatever the caller says). Not dirty, only the small parts are put
        back (model and optimizer are the commit). Dirty, model and optimizer come back
        from the CPU copy (``copy=True``); without a copy this worker cannot roll back:
        it keeps ``committed_step = -1`` and receives the state from a peer at the next
        sync. With no commit at all it receives one likewise."""
        _reset_fsdp(self.model)
        snap = self._snap
        if dirty or self._stepped:
            self._clean = False
        self._stepped = False
        if snap is None:
            self.committed_step = -1
            return
        if not self._clean and self._copy is not None:
            import torch

            with torch.no_grad():
                if self.model is not None:
                    self.model.load_state_dict(self._copy["model"])
                if self.optimizer is not None:
                    # A copy: load_state_dict keeps CPU tensors as they are, and the
                    # optimizer's next step would write into the saved copy.
                    self.optimizer.load_state_dict(copy_tree(self._copy["optimizer"], "optimizer state"))
            self._clean = self._intact = True
        self._load_small(snap)
        if self._clean:
            self.committed_step = int(snap["step"])
            return
        if self.committed_step != -1 or dirty:
            print(
                f"bftrainer: this worker cannot roll back to step {snap['step']} in place: model and optimizer "
                "changed after that commit and State(copy=False) keeps no copy of them; it receives the state "
                "of a peer at the next sync",
                file=sys.stderr,
                flush=True,
            )
        self.committed_step = -1

    def _load_small(self, snap: Dict[str, Any]) -> None:
        self.step = int(snap["step"])
        for name in _SMALL:
            obj = getattr(self, name)
            if obj is not None:
                obj.load_state_dict(copy_tree(snap[name], f"{name} state"))
        for k, v in snap["extras"].items():
            target = getattr(self, k)
            if _has_state_dict(target):
                target.load_state_dict(copy_tree(v, f"state extra {k!r}"))
            else:
                setattr(self, k, copy_tree(v, f"state extra {k!r}"))
        if self.optimizer is not None and "groups" in snap:
            for g, saved in zip(self.optimizer.param_groups, snap["groups"]):
                for k, v in saved.items():
                    if _is_tensor(v) and _is_tensor(g.get(k)):
                        g[k].copy_(v)
                    else:
                        g[k] = _dup(v)
        if "rng" in snap:
            _set_rng_state(snap["rng"])

    def commit(self) -> None:
        """End of a step: count it, commit the state in memory, start a checkpoint every
        ``checkpoint_every`` commits, and switch to a new world if one was announced
        (all ranks switch at the same step)."""
        from . import elastic

        self.step += 1
        self.save()
        if self.checkpoint_every and self.step % self.checkpoint_every == 0 and elastic.rank() == 0:
            self.write_checkpoint()
        elastic._after_commit(self)

    # -- for transfer.sync -------------------------------------------------------

    def _payload(self) -> Dict[str, Any]:
        """What a sync sends: model and optimizer as they are (at a sync they equal the
        commit) and the small parts as committed (as they are, before any commit)."""
        d = self.state_dict()
        if self._snap is not None:
            d.update({k: v for k, v in self._snap.items() if k not in ("groups", "rng")})
        return d

    def _receiving(self) -> None:
        """A transfer into this state begins: until it completes there is no commit."""
        self.committed_step = -1
        self._clean = self._intact = False

    # -- reset callbacks ---------------------------------------------------------

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Called after every change of world (new ranks, after a rollback or a
        switch): rebuild what depends on the world (DDP wrappers, learning rate...)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for cb in self._reset_callbacks:
            cb()

    # -- disk checkpoints --------------------------------------------------------

    def checkpoint_path(self) -> Optional[str]:
        if not self.checkpoint_dir:
            return None
        return os.path.join(self.checkpoint_dir, _CHECKPOINT)

    def write_checkpoint(self) -> bool:
        """Write the last commit to ``checkpoint_path()`` in a background thread: a
        consistent copy on the CPU is taken now, written to a temporary file, synced
        and renamed over the checkpoint. At most one write is in flight: if the
        previous one still runs, this one is skipped (said once) and False returned.
        A failed write is reported on stderr when it fails and raised by the next
        ``wait_checkpoint()``."""
        path = self.checkpoint_path()
        if path is None:
            raise ValueError("write_checkpoint needs checkpoint_dir")
        if self._writer is not None and self._writer.is_alive():
            if not self._said_skip:
                print(
                    f"bftrainer: checkpoint of step {self.step} skipped: the previous one is still being written "
                    f"(checkpoint_every={self.checkpoint_every} commits take less time than a write; "
                    "said once, later skips are silent)",
                    file=sys.stderr,
                    flush=True,
                )
                self._said_skip = True
            return False
        data = {
            "bftrainer": _FORMAT,
            "job": os.environ.get("BFT_JOB"),
            "state": copy_tree(self._committed(), "state", device="cpu"),
        }
        self._write_error = None
        self._writer = threading.Thread(
            target=self._write, args=(path, data), name="bftrainer-checkpoint", daemon=False
        )
        self._writer.start()
        return True

    def _committed(self) -> Dict[str, Any]:
        d = self._payload()
        if self._copy is not None and self._clean:
            d.update(self._copy)
        return d

    def _write(self, path: str, data: Dict[str, Any]) -> None:
        tmp = f"{path}.tmp.{os.getpid()}"
        try:
            import torch

            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                torch.save(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fd = os.open(os.path.dirname(path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException as e:  # reported here and raised by wait_checkpoint()
            self._write_error = e
            print(
                f"bftrainer: writing checkpoint {path} (step {data['state']['step']}) failed: {e!r}",
                file=sys.stderr,
                flush=True,
            )
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def wait_checkpoint(self) -> None:
        """Wait for the checkpoint being written, if any; raise the error of the last
        write if it failed."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        err, self._write_error = self._write_error, None
        if err is not None:
            raise err

    # -- sharded checkpoints (FSDP2: DTensor parameters) ----------------------------

    def sharded(self) -> bool:
        """Whether the model holds DTensors (FSDP2): its checkpoints are then written by
        every rank with torch.distributed.checkpoint."""
        if self.model is None or "torch.distributed.tensor" not in sys.modules:
            return False
        from torch.distributed.tensor import DTensor

        return any(isinstance(p, DTensor) for p in self.model.parameters())

    def sharded_checkpoint_path(self) -> Optional[str]:
        return os.path.join(self.checkpoint_dir, _SHARDED) if self.checkpoint_dir else None

    def write_checkpoint_sharded(self, path: Optional[str] = None) -> None:
        """Write the last commit with torch.distributed.checkpoint: every rank of the
        generation calls it (it is collective) and writes its own shards, replicas
        are written once; rank 0 adds the small parts (``small.pt``) and moves the
        finished directory over ``path`` (default: ``checkpoint_dir``/sharded). It
        loads under any world size and any number of workers per node
        (``load_checkpoint_sharded``). Synchronous: the step waits for the write."""
        import shutil

        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        path = path or self.sharded_checkpoint_path()
        if path is None:
            raise ValueError("write_checkpoint_sharded needs a path or checkpoint_dir")
        committed = self._committed()
        if self._copy is not None and self._clean:
            # copy=True: the commit is the CPU copy (model and optimizer may have moved on).
            self.model.load_state_dict(self._copy["model"])
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer if self.optimizer is not None else [])
        tmp = f"{path}.tmp"
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank == 0 and os.path.exists(tmp):
            shutil.rmtree(tmp)
        if dist.is_initialized():
            dist.barrier()
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp)
        if rank == 0:
            small = {k: v for k, v in committed.items() if k not in ("model", "optimizer")}
            data = {"bftrainer": _FORMAT, "job": os.environ.get("BFT_JOB"), "state": copy_tree(small, "state", "cpu")}
            with open(os.path.join(tmp, "small.pt"), "wb") as f:
                torch.save(data, f)
                f.flush()
                os.fsync(f.fileno())
            old = f"{path}.old"
            if os.path.exists(path):
                os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        if dist.is_initialized():
            dist.barrier()

    def load_checkpoint_sharded(self, path: Optional[str] = None) -> bool:
        """Load a checkpoint of ``write_checkpoint_sharded`` (every rank calls it, with
        its model already ``fully_shard``-ed on the current mesh): each rank reads the
        pieces of its own shards, whatever world size wrote them."""
        import pickle

        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        path = path or self.sharded_checkpoint_path()
        if not path or not os.path.exists(os.path.join(path, "small.pt")):
            return False
        try:
            with open(os.path.join(path, "small.pt"), "rb") as f:
                ck = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise CheckpointError(f"checkpoint {path}/small.pt holds objects that a weights-only load refuses") from e
        here = os.environ.get("BFT_JOB")
        if not isinstance(ck, dict) or ck.get("bftrainer") != _FORMAT:
            raise CheckpointError(f"checkpoint {path} was not written by this bftrainer (format {_FORMAT})")
        if ck.get("job") != here and not self.resume_any_job:
            raise CheckpointError(
                f"checkpoint {path} belongs to job {_job(ck.get('job'))}, this is job {_job(here)}: refusing to "
                "resume another job's training; pass State(..., resume_any_job=True) to resume from it on purpose"
            )
        optim = self.optimizer if self.optimizer is not None else []
        model_sd, optim_sd = get_state_dict(self.model, optim)
        sd = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(sd, checkpoint_id=path)
        set_state_dict(self.model, optim, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
        self._load_small(ck["state"])
        self.save()
        return True

    def load_checkpoint(self) -> bool:
        """Load the checkpoint on disk if there is one (a requeued job keeps its id and
        resumes). A checkpoint of another job (``BFT_JOB``) is refused unless
        ``resume_any_job=True``."""
        path = self.checkpoint_path()
        if not path or not os.path.exists(path):
            return False
        import pickle

        import torch

        try:
            with open(path, "rb") as f:
                ck = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise CheckpointError(
                f"checkpoint {path} holds objects that a weights-only load refuses (nothing from disk executes "
                f"code): {str(e).splitlines()[0]}"
            ) from e
        here = os.environ.get("BFT_JOB")
        if isinstance(ck, dict) and ck.get("bftrainer") == _FORMAT:
            same, owner, state = ck.get("job") == here, f"job {_job(ck.get('job'))}", ck["state"]
        else:
            same, owner, state = False, "an unknown job (it was written by an older bftrainer)", ck
        if not same:
            if not self.resume_any_job:
                raise CheckpointError(
                    f"checkpoint {path} belongs to {owner}, this is job {_job(here)}: refusing to resume "
                    "another job's training. Use another checkpoint_dir, remove the file, or pass "
                    "State(..., resume_any_job=True) to resume from it on purpose"
                )
            print(
                f"bftrainer: job {_job(here)} resumes from the checkpoint {path} of {owner} (resume_any_job=True)",
                file=sys.stderr,
                flush=True,
            )
        self._load(state, model_loaded=False)
        self.save()
        return True


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _dup(v: Any) -> Any:
    """A copy of an optimizer hyperparameter (a float, a tuple, a tensor...)."""
    if _is_tensor(v):
        return v.detach().clone()
    return v if isinstance(v, (int, float, str, type(None))) else deepcopy(v)


def _rng_state() -> Dict[str, Any]:
    """This process's generators, those of the libraries it loaded."""
    s: Dict[str, Any] = {"python": random.getstate()}
    torch = sys.modules.get("torch")
    if torch is not None:
        s["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            s["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        s["numpy"] = np.random.get_state()
    return s


def _set_rng_state(s: Dict[str, Any]) -> None:
    random.setstate(s["python"])
    if "torch" in s:
        import torch

        torch.set_rng_state(s["torch"])
        if "cuda" in s:
            torch.cuda.set_rng_state_all(s["cuda"])
    if "numpy" in s:
        import numpy

        numpy.random.set_state(s["numpy"])
