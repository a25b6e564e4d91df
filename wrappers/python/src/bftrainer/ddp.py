"""torch's own DistributedDataParallel on the elastic group: built once, valid in every
generation; gradients weighted by each rank's samples; a peer's failure fails the step.

Each bucket's reduction is a comm hook on ``bftrainer.process_group()``: the bucket is
scaled by this rank's share of the step's samples and all-reduced (SUM), so the result
is the mean over the whole step's samples for any split of it. The first bucket of a
step also all-reduces the runtime's float64 pair (samples, "switch generation"), read
at a later commit without a device sync (elastic._Meta). At each generation the reducer
is rebuilt, on every member at once, so that old members and newcomers have the same
buckets (torch rebuilds buckets in gradient order after a reducer's first step).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

from . import elastic

_OWN = ("process_group", "device_mesh", "init_sync")


class DistributedDataParallel(_TorchDDP):
    """``torch.nn.parallel.DistributedDataParallel(module, **ddp_kwargs)`` for elastic
    jobs: build it once, before ``@bftrainer.run``; buckets, overlap with backward,
    ``no_sync()``, ``static_graph`` and the other keyword arguments are torch's.

    Weighting: each rank computes the mean loss over its own samples, as under plain
    DDP. The reduction weights rank r by n_r / N (its samples over the whole step's),
    which ``ElasticSampler`` counts as its slices are taken (summed over the
    micro-batches of a ``no_sync()`` accumulation). Without the sampler, say it per
    step with ``set_samples(n_local)``; the whole step's count then travels beside the
    gradients. With neither, ranks weigh equally, as plain DDP does.
    """

    def __init__(self, module: torch.nn.Module, **kwargs: Any) -> None:
        for key in _OWN:
            if key in kwargs:
                raise ValueError(
                    f"bftrainer.DistributedDataParallel sets {key} itself (the elastic group); leave it out"
                )
        rt = elastic._rt()
        super().__init__(module, process_group=rt.group(), init_sync=False, **kwargs)
        self._bft_rt = rt
        self._bft_entries = rt.entries
        self._bft_explicit: Optional[int] = None
        self._bft_reset()

    def set_samples(self, n_local: int) -> None:
        """This rank's samples in the coming reduction (for data not taken from an
        ``ElasticSampler``); may be 0 on a rank whose slice of the step is empty."""
        if n_local < 0:
            raise ValueError(f"n_local must be 0 or more, got {n_local}")
        self._bft_explicit = int(n_local)

    def _bft_reset(self) -> None:
        """A fresh reducer with the initial buckets and our hook (every member does
        this at the same generation, so all agree on the buckets)."""
        if self._bft_entries != self._bft_rt.entries:
            parameters, expect_sparse_gradient = self._build_params_for_reducer()
            names = self._build_debug_param_to_name_mapping(parameters)
            self._ddp_init_helper(parameters, expect_sparse_gradient, names, self.static_graph)
            if self.static_graph:
                self._static_graph_delay_allreduce_enqueued = False
                self.reducer._set_static_graph()
                self.logger._set_static_graph()
            self._has_rebuilt_buckets = False
            self._bft_entries = self._bft_rt.entries
        self._comm_hooks = []
        self.register_comm_hook(self, _reduce_bucket)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self._bft_entries != self._bft_rt.entries:
            self._bft_reset()
        return super().forward(*inputs, **kwargs)


# Unannotated: torch checks a comm hook's annotations against its own types.
def _reduce_bucket(ddp, bucket):  # type: ignore[no-untyped-def]
    rt = ddp._bft_rt
    grp = rt.group()
    buf = bucket.buffer()
    if bucket.index() == 0:
        elastic.trace("step")
        # The step's first bucket: this rank's weight, and the metadata beside it.
        explicit = ddp._bft_explicit
        n_local = explicit if explicit is not None else rt.samples_local
        total = 0 if explicit is not None else rt.samples_total
        ddp._bft_explicit = None
        rt.samples_local = rt.samples_total = 0
        meta = elastic._Meta(rt, n_local, buf.device)
        rt._meta_cur = meta
        if total > 0:
            ddp._bft_scale = (n_local / total, None)
        elif explicit is not None:
            ddp._bft_scale = (float(n_local), meta)
        else:
            ddp._bft_scale = (1.0 / max(grp.size(), 1), None)
    scale, meta = ddp._bft_scale
    buf.mul_(scale)
    fut = grp.allreduce_future(buf)
    if meta is None:
        return fut.then(lambda f: _done(rt, f.value()))
    both = torch.futures.collect_all([meta.future, fut])

    def divide(f: Any) -> torch.Tensor:
        f.value()
        total = meta.tensor[0]
        # 0 samples in the whole step: every gradient is 0 already.
        return _done(rt, buf.div_(torch.clamp(total, min=1.0).to(buf.dtype)))

    return both.then(divide)


def _done(rt: Any, t: torch.Tensor) -> torch.Tensor:
    # A reduction of this step succeeded: the optimizer may step before the next
    # commit, so a failure from here on rolls back the whole state (State.restore).
    rt.dirty = True
    return t


__all__ = ["DistributedDataParallel"]
