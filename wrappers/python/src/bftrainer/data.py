"""A torch DataLoader driven by the elastic sampler: worker processes, prefetch and
pinned memory, with every sample still used exactly once per epoch.

A DataLoader fetches ahead of the training, so its batch sampler cannot be the
sampler itself: that would move the epoch's position past steps not yet trained, and a
rollback or a change of world would lose them. Here the DataLoader reads a *plan*: this
rank's indices for the coming steps, computed from the sampler's position, rank and
world at the time. The sampler's position moves only when the training takes a batch.
When the world changes (a new generation) or the position is not where the plan
expects it (a rollback restored it), the batches fetched for the old plan are thrown
away with the DataLoader's iterator and a new plan starts from the sampler's position.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple

from .sampler import ElasticSampler

# DataLoader arguments that the plan decides: refused, naming the way to get them.
_PLANNED = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


def _ignore_sigterm(user_init: Any) -> Any:
    """The DataLoader workers' init: SIGTERM is ignored there. bft-run tells a leaving
    worker to leave by SIGTERM to its process group, which holds its DataLoader's
    processes too; the worker leaves at its next step boundary, and its loader
    processes end with it (torch's workers exit when their parent is gone). Killed by
    the signal, they would fail the step still in progress instead."""

    def init(worker_id: int) -> None:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked by _start
        if user_init is not None:
            user_init(worker_id)

    return init


def _start(loader: Any) -> Any:
    """``iter(loader)``, which forks the DataLoader's processes, with SIGTERM blocked
    meanwhile: the children start with it blocked (torch's own worker handler dies of
    a SIGTERM not sent by the parent) and unblock it only once their init ignores it; a
    SIGTERM sent meanwhile waits, and reaches this process when the fork is done."""
    import signal

    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _generation() -> int:
    from . import elastic

    return elastic.generation()


def _steps(sampler: ElasticSampler, start: int, rank: int, world: int) -> Iterator[Tuple[int, int, int]]:
    """(step size, lo, hi) of ``rank`` for the steps from position ``start`` to the end
    of the epoch, the world staying ``world``; lazily (an epoch may have 10^9 steps)."""
    pos, n = start, sampler.num_samples
    while pos < n:
        step = sampler.step_size(world, pos)
        yield (step,) + sampler.share(rank, world, pos, step)
        pos += step


class _Plan:
    """The DataLoader's batch sampler: this rank's indices for the steps of a plan
    (steps where the rank's share is empty are left out; the loader knows which)."""

    def __init__(self, sampler: ElasticSampler, epoch: int, start: int, rank: int, world: int) -> None:
        self.sampler, self.epoch, self.start, self.rank, self.world = sampler, epoch, start, rank, world

    def __iter__(self) -> Iterator[List[int]]:
        for _, lo, hi in _steps(self.sampler, self.start, self.rank, self.world):
            if hi > lo:
                yield self.sampler.indices(lo, hi, self.epoch)


class ElasticDataLoader:
    """``for indices, batch in loader:`` yields, for each step of the epoch, this
    rank's sample indices and the DataLoader's collated batch of them (``None`` where
    the rank's share of the step is empty: pass ``len(indices)``, 0, to
    ``allreduce_gradients`` all the same). After the epoch's last step the sampler
    moves to the next epoch, as ``for indices in sampler`` does.

    ``dataloader_kwargs`` go to ``torch.utils.data.DataLoader`` (``num_workers``,
    ``prefetch_factor``, ``pin_memory``, ``collate_fn``, ``persistent_workers``, ...);
    the batches come from the sampler, so ``batch_size``, ``shuffle``, ``sampler``,
    ``batch_sampler`` and ``drop_last`` are refused.
    """

    def __init__(self, dataset: Any, sampler: ElasticSampler, world: Any = None, generation: Any = None,
                 **dataloader_kwargs: Any) -> None:
        bad = [k for k in _PLANNED if k in dataloader_kwargs]
        if bad:
            raise ValueError(
                f"ElasticDataLoader takes its batches from the ElasticSampler; do not give {', '.join(bad)} "
                "(set global_batch= or batch_size= on the sampler)"
            )
        self.dataset = dataset
        self.sampler = sampler
        dataloader_kwargs["worker_init_fn"] = _ignore_sigterm(dataloader_kwargs.get("worker_init_fn"))
        self.kwargs = dataloader_kwargs
        self._world = world or sampler._world
        self._generation = generation or _generation
        # Plans thrown away (a new world, a rollback): for tests and curiosity.
        self.replans = 0

    def __iter__(self) -> Iterator[Tuple[List[int], Optional[Any]]]:
        import torch.utils.data

        s = self.sampler
        epoch = s.epoch
        while s.epoch == epoch and s.consumed < s.num_samples:
            rank, world = self._world()
            gen, start = self._generation(), s.consumed
            # The rest of the epoch, in one plan while the world stays.
            steps = _steps(s, start, rank, world)
            plan = _Plan(s, epoch, start, rank, world)
            loader = torch.utils.data.DataLoader(self.dataset, batch_sampler=plan, **self.kwargs)
            fetched = _start(loader)
            expect = start
            stale = False
            try:
                for step, lo, hi in steps:
                    if s.consumed != expect or s.epoch != epoch or self._generation() != gen:
                        stale = True  # rolled back or a new world: this plan is void
                        break
                    batch = next(fetched) if hi > lo else None
                    indices = s.indices(lo, hi, epoch)
                    s._advance(step, hi - lo)
                    expect = s.consumed
                    yield indices, batch
            finally:
                # Stops the DataLoader's workers and drops what they prefetched.
                del fetched, loader
            if stale:
                self.replans += 1
                if s.epoch != epoch:
                    return
        if s.epoch == epoch and s.consumed >= s.num_samples:
            s.next_epoch()
