"""An exact elastic sampler: within an epoch every sample is used once, whatever the
world size does between steps.

Per epoch the order is a permutation seeded by (seed, epoch). The sampler remembers
``consumed``, the samples of the epoch already taken; a step with world size W and
per-rank batch B takes ``perm[consumed : consumed + W*B]`` and rank r gets its r-th
slice of B (shorter, or empty, at the end of the epoch). The position is part of the
state that ``State.commit()`` saves and a rollback restores, so a step that is rolled
back is taken again, by the new world.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple


def _world() -> Tuple[int, int]:
    from . import elastic

    return elastic.rank(), elastic.world_size()


class ElasticSampler:
    """Deterministic, resumable, world-size-independent batches of sample indices.

    ``for indices in sampler:`` yields this rank's indices for one step until the epoch
    is used up, then moves to the next epoch (``sampler.epoch`` += 1) and stops.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        world: Optional[Callable[[], Tuple[int, int]]] = None,
    ) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        if batch_size <= 0:
            raise ValueError(f"batch_size (per rank) must be positive, got {batch_size}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.consumed = 0
        self.total = 0
        self._world = world or _world
        self._perm: Optional[List[int]] = None
        self._perm_epoch = -1

    def permutation(self, epoch: Optional[int] = None) -> List[int]:
        """The order of the samples in ``epoch`` (default: the current one)."""
        e = self.epoch if epoch is None else epoch
        if e == self._perm_epoch and self._perm is not None:
            return self._perm
        order = list(range(self.num_samples))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + e).shuffle(order)
        if epoch is None or e == self.epoch:
            self._perm, self._perm_epoch = order, e
        return order

    def remaining(self) -> int:
        """Samples of the current epoch not taken yet."""
        return self.num_samples - self.consumed

    def take(self) -> List[int]:
        """This rank's indices for the next step; advances the position by the whole
        world's batch. Every rank must call it once per step."""
        rank, world = self._world()
        start = self.consumed
        step = min(world * self.batch_size, self.num_samples - start)
        lo = start + min(rank * self.batch_size, step)
        hi = start + min((rank + 1) * self.batch_size, step)
        self.consumed = start + step
        self.total += step
        return self.permutation()[lo:hi]

    def __iter__(self) -> Iterator[List[int]]:
        while self.consumed < self.num_samples:
            yield self.take()
        self.epoch += 1
        self.consumed = 0

    def state_dict(self) -> Dict[str, Any]:
        return {
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "total": self.total,
        }

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        for key in ("num_samples", "batch_size", "seed", "shuffle"):
            if d[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state was saved with {key}={d[key]!r}, this sampler has "
                    f"{getattr(self, key)!r}: the dataset or batch size changed"
                )
        self.epoch = int(d["epoch"])
        self.consumed = int(d["consumed"])
        self.total = int(d["total"])
