"""bftrainer: the worker library of elastic jobs run by ``bft-run``.

    import bftrainer

    state = bftrainer.State(model=model, optimizer=opt,
                            sampler=bftrainer.ElasticSampler(len(data), batch_size=32))

    @bftrainer.run
    def train(state):
        while state.sampler.epoch < EPOCHS:
            for idx in state.sampler:
                ... forward/backward on data[idx] ...
                bftrainer.allreduce_gradients(model, len(idx))
                opt.step()
                state.commit()

    train(state)

See docs/user.md for the complete example and what happens on grow, shrink and
preemption.
"""

from ._agent import AgentError, JobEnded
from ._mesh import device_mesh
from .elastic import (
    DeviceChoice,
    PeerFailure,
    allreduce_gradients,
    backend,
    choose_device,
    device,
    generation,
    process_group,
    rank,
    run,
    worker_id,
    world_size,
)
from .batch import apply_world_batch, on_batch_change, report_progress, world_batch
from .data import ElasticDataLoader
from .sampler import ElasticSampler
from .state import State

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # torch is imported only by programs that use the DDP wrapper.
    if name == "DistributedDataParallel":
        from .ddp import DistributedDataParallel

        return DistributedDataParallel
    raise AttributeError(f"module 'bftrainer' has no attribute {name!r}")


__all__ = [
    "AgentError",
    "DeviceChoice",
    "DistributedDataParallel",
    "ElasticDataLoader",
    "ElasticSampler",
    "JobEnded",
    "PeerFailure",
    "State",
    "allreduce_gradients",
    "apply_world_batch",
    "backend",
    "choose_device",
    "device",
    "device_mesh",
    "generation",
    "on_batch_change",
    "process_group",
    "rank",
    "report_progress",
    "run",
    "worker_id",
    "world_batch",
    "world_size",
]
