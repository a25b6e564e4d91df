"""Training state that survives membership changes: committed in memory every step,
restored on a rollback, broadcast to newcomers, optionally checkpointed to disk."""

from __future__ import annotations

import copy
import io
import os
from typing import Any, Callable, Dict, List, Optional

from .sampler import ElasticSampler

_OWN = {"model", "optimizer", "sampler", "checkpoint_dir", "checkpoint_every"}
_CHECKPOINT = "bftrainer-state.pt"


class State:
    """Model, optimizer, sampler position, step counter and user extras.

    Extras are keyword arguments that become attributes (``state.epoch``,
    ``state.best_loss``...) and are committed, restored and broadcast with the rest.
    Call ``commit()`` at the end of every step (or every few steps: a rollback goes back
    to the last commit).
    """

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        sampler: Optional[ElasticSampler] = None,
        checkpoint_dir: Optional[str] = None,
        checkpoint_every: int = 0,
        **extras: Any,
    ) -> None:
        bad = sorted(k for k in extras if k.startswith("_") or k in ("step", "samples"))
        if bad:
            raise ValueError(f"state extras may not be named {bad}: those names are taken")
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be 0 (off) or positive, got {checkpoint_every}")
        if checkpoint_every and not checkpoint_dir:
            raise ValueError("checkpoint_every needs checkpoint_dir")
        self.model = model
        self.optimizer = optimizer
        self.sampler = sampler
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.step = 0
        self._extras = list(extras)
        for k, v in extras.items():
            setattr(self, k, v)
        # -1: never committed nor received (a newcomer); the sync after a membership
        # change takes the state of the lowest rank with the highest commit.
        self.committed_step = -1
        self._saved: Optional[Dict[str, Any]] = None
        self._reset_callbacks: List[Callable[[], None]] = []

    @property
    def samples(self) -> int:
        """Samples taken since the start of training (all ranks, all epochs)."""
        return self.sampler.total if self.sampler is not None else 0

    # -- what is committed -------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "step": self.step,
            "extras": {k: getattr(self, k) for k in self._extras},
        }
        if self.model is not None:
            d["model"] = self.model.state_dict()
        if self.optimizer is not None:
            d["optimizer"] = self.optimizer.state_dict()
        if self.sampler is not None:
            d["sampler"] = self.sampler.state_dict()
        return d

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        self.step = int(d["step"])
        for k, v in d["extras"].items():
            setattr(self, k, copy.deepcopy(v))
        if self.model is not None:
            self.model.load_state_dict(d["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(d["optimizer"]))
        if self.sampler is not None:
            self.sampler.load_state_dict(d["sampler"])

    def save(self) -> None:
        """Keep a copy of the current state in memory (what a rollback returns to)."""
        self._saved = _snapshot(self.state_dict())
        self.committed_step = self.step

    def restore(self) -> None:
        """Go back to the last commit (or receive state at the next sync, if none)."""
        if self._saved is not None:
            self.load_state_dict(self._saved)
            self.committed_step = self.step
        else:
            self.committed_step = -1

    def committed(self) -> Optional[Dict[str, Any]]:
        return self._saved

    def commit(self) -> None:
        """End of a step: count it, save the state in memory, write a checkpoint every
        ``checkpoint_every`` commits, and switch to a new world if one was announced
        (all ranks switch at the same step)."""
        from . import elastic

        self.step += 1
        self.save()
        if self.checkpoint_every and self.step % self.checkpoint_every == 0 and elastic.rank() == 0:
            self.write_checkpoint()
        elastic._after_commit(self)

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

    def write_checkpoint(self) -> None:
        import torch

        path = self.checkpoint_path()
        assert path is not None
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(self._saved if self._saved is not None else self.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def load_checkpoint(self) -> bool:
        """Load the checkpoint on disk if there is one (a requeued job resumes)."""
        path = self.checkpoint_path()
        if not path or not os.path.exists(path):
            return False
        import torch

        with open(path, "rb") as f:
            d = torch.load(f, map_location="cpu", weights_only=False)
        self.load_state_dict(d)
        self.save()
        return True


def _snapshot(d: Dict[str, Any]) -> Dict[str, Any]:
    """A deep copy that does not share tensor storage with the live model."""
    try:
        import torch
    except ImportError:  # pragma: no cover - no torch: plain objects only
        return copy.deepcopy(d)

    def clone(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().clone()
        if isinstance(x, dict):
            return {k: clone(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clone(v) for v in x]
        if isinstance(x, tuple):
            return tuple(clone(v) for v in x)
        return copy.deepcopy(x)

    return clone(d)


def to_bytes(d: Dict[str, Any]) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(d, buf)
    return buf.getvalue()


def from_bytes(b: bytes) -> Dict[str, Any]:
    import torch

    return torch.load(io.BytesIO(b), map_location="cpu", weights_only=False)
