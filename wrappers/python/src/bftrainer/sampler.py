"""An exact elastic sampler: within an epoch every sample is used once, whatever the
world size does between steps.

Per epoch the order is a keyed bijection over ``[0, n)`` (a Feistel network over the
smallest power-of-four domain that holds ``n``, walked until it lands inside the range),
keyed by (seed, epoch): position ``i`` of the epoch is sample ``order(i)``, computed
when it is needed, so nothing of size ``n`` is ever built and a data set of 2^40
samples costs what one of 1,000 does. The sampler remembers ``consumed``, the samples
of the epoch already taken; a step takes the next positions and splits them over the
ranks of the generation. The position is part of the state that ``State.commit()``
saves and a rollback restores, so a step that is rolled back is taken again, by the new
world.

Two forms of a step:
- ``global_batch=G``: every step takes G samples (fewer only at the end of an epoch),
  split as evenly as the world allows (ranks differ by at most one sample). The
  training then does not depend on how many nodes the job holds: with each rank's loss
  the mean over its own samples and the gradients averaged weighted by each rank's
  count (``allreduce_gradients`` does that), a step's gradient is the gradient of the
  whole global batch, whatever the world and the split.
- ``batch_size=B`` (per rank): a step takes ``world_size x B`` samples, so the global
  batch, and with it the training's result, changes with every grow and shrink.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

_M64 = (1 << 64) - 1
# The Feistel network's rounds: 6 keyed rounds of a 64-bit mixer are far more than a
# shuffle's statistics need, and cost about 1 us per index in numpy.
_ROUNDS = 6
# The largest data set the order covers (positions and samples fit in 2 x 32-bit halves).
MAX_SAMPLES = 1 << 62
# The order's version, saved in the state: a checkpoint made with another order (the
# list shuffle of older releases, version 1) resumes in that order.
_ORDER = 2


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit mixer."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class KeyedOrder:
    """A bijection of ``[0, n)`` chosen by ``key``: ``order[i]`` is the sample at
    position ``i``. Constant memory; ``order.take(lo, hi)`` gives positions
    ``lo..hi-1`` at once (vectorised with numpy where it is installed)."""

    def __init__(self, n: int, key: int) -> None:
        if not 0 < n <= MAX_SAMPLES:
            raise ValueError(f"an order covers 1 to 2^62 samples, got {n}")
        bits = max(2, (n - 1).bit_length())
        bits += bits & 1  # two equal halves: the domain is 4^k >= n, so < 4n
        self.n = n
        self.half = bits // 2
        self.mask = (1 << self.half) - 1
        self.keys = [_mix((key ^ _mix(r + 1)) & _M64) for r in range(_ROUNDS)]

    def _encrypt(self, x: int) -> int:
        half, mask = self.half, self.mask
        left, right = x >> half, x & mask
        for k in self.keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << half) | right

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"position {i} is outside 0..{self.n - 1}")
        # Cycle walking: the network permutes the whole domain; following it from i
        # until it lands inside [0, n) permutes [0, n) (each walk is a piece of one
        # cycle, and distinct starts end at distinct points).
        x = self._encrypt(i)
        while x >= self.n:
            x = self._encrypt(x)
        return x

    def _decrypt(self, x: int) -> int:
        half, mask = self.half, self.mask
        left, right = x >> half, x & mask
        for k in reversed(self.keys):
            left, right = right ^ (_mix(left ^ k) & mask), left
        return (left << half) | right

    def position(self, sample: int) -> int:
        """The inverse: the position at which ``sample`` comes."""
        if not 0 <= sample < self.n:
            raise IndexError(f"sample {sample} is outside 0..{self.n - 1}")
        x = self._decrypt(sample)
        while x >= self.n:
            x = self._decrypt(x)
        return x

    def take(self, lo: int, hi: int) -> List[int]:
        """The samples at positions ``lo..hi-1``."""
        if hi - lo < 64:
            return [self[i] for i in range(lo, hi)]
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - numpy comes with torch
            return [self[i] for i in range(lo, hi)]
        if not 0 <= lo <= hi <= self.n:
            raise IndexError(f"positions {lo}..{hi - 1} are outside 0..{self.n - 1}")
        out = self._encrypt_array(np.arange(lo, hi, dtype=np.uint64))
        todo = out >= self.n
        while todo.any():
            out[todo] = self._encrypt_array(out[todo])
            todo = out >= self.n
        return [int(v) for v in out]

    def _encrypt_array(self, x: Any) -> Any:
        import numpy as np

        u = np.uint64
        half, mask = u(self.half), u(self.mask)
        left, right = x >> half, x & mask
        with np.errstate(over="ignore"):
            for k in self.keys:
                f = right ^ u(k)
                f = f + u(0x9E3779B97F4A7C15)
                f = (f ^ (f >> u(30))) * u(0xBF58476D1CE4E5B9)
                f = (f ^ (f >> u(27))) * u(0x94D049BB133111EB)
                f = f ^ (f >> u(31))
                left, right = right, left ^ (f & mask)
        return (left << half) | right


def _world() -> Tuple[int, int]:
    from . import elastic

    return elastic.rank(), elastic.world_size()


def _positive(name: str, value: Optional[int]) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return value


class ElasticSampler:
    """Deterministic, resumable, world-size-independent batches of sample indices.

    ``for indices in sampler:`` yields this rank's indices for one step until the epoch
    is used up, then moves to the next epoch (``sampler.epoch`` += 1) and stops.

    Give either ``global_batch`` (samples per step, whatever the world: results do not
    depend on the nodes lent) or ``batch_size`` (samples per rank and step: the global
    batch grows and shrinks with the job). ``micro_batch`` bounds what one forward pass
    of a rank takes: ``sampler.micro_batches(indices)`` splits the rank's share of a
    step into pieces of at most that many samples, for gradient accumulation.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: Optional[int] = None,
        seed: int = 0,
        shuffle: bool = True,
        world: Optional[Callable[[], Tuple[int, int]]] = None,
        *,
        global_batch: Optional[int] = None,
        micro_batch: Optional[int] = None,
    ) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples!r}")
        if num_samples > MAX_SAMPLES:
            raise ValueError(f"num_samples may be at most 2^62, got {num_samples}")
        if (batch_size is None) == (global_batch is None):
            raise ValueError(
                "give either batch_size= (samples per rank and step) or global_batch= "
                "(samples per step, split over the ranks), not both and not neither"
            )
        self.num_samples = num_samples
        self.batch_size = _positive("batch_size (per rank)", batch_size)
        self.global_batch = _positive("global_batch", global_batch)
        # The script's own global batch: what a batch bftrainerd decides (a job with
        # --elastic=...,batch=MIN:MAX) replaces in global_batch, and the base of the
        # learning-rate rule.
        self.base_batch = self.global_batch
        self.micro_batch = _positive("micro_batch", micro_batch)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.consumed = 0
        self.total = 0
        self.order_version = _ORDER
        self._world = world or _world
        self._order: Any = None
        self._order_key: Tuple[int, int] = (-1, -1)

    # -- the epoch's order -------------------------------------------------------------

    def _order_of(self, epoch: int) -> Any:
        key = (epoch, self.order_version)
        if self._order_key != key:
            if self.order_version == 1:
                # A checkpoint of an older release: its list shuffle, so that an epoch
                # begun before the upgrade ends in the same order.
                order: Any = list(range(self.num_samples))
                if self.shuffle:
                    random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            elif self.shuffle:
                order = KeyedOrder(self.num_samples, _mix(_mix(self.seed & _M64) ^ epoch))
            else:
                order = None
            self._order, self._order_key = order, key
        return self._order

    def indices(self, lo: int, hi: int, epoch: Optional[int] = None) -> List[int]:
        """The samples at positions ``lo..hi-1`` of ``epoch`` (default: the current)."""
        order = self._order_of(self.epoch if epoch is None else epoch)
        if order is None:
            return list(range(lo, hi))
        if isinstance(order, list):
            return order[lo:hi]
        return order.take(lo, hi)

    def permutation(self, epoch: Optional[int] = None) -> List[int]:
        """The whole order of ``epoch`` as a list: for tests and small data sets only
        (the sampler itself never builds it)."""
        return self.indices(0, self.num_samples, epoch)

    def seed_of(self, sample: int, epoch: Optional[int] = None) -> int:
        """A seed for ``sample``'s random stream in ``epoch`` (default: the current),
        from the sampler's seed: key dropout masks, augmentation and noise of a sample
        with it (``torch.Generator().manual_seed(sampler.seed_of(i))``), never with the
        rank, so that they do not change when the sample lands on another rank."""
        e = self.epoch if epoch is None else epoch
        return _mix(_mix(_mix(self.seed & _M64) ^ e) ^ (sample & _M64)) >> 1  # torch takes < 2^63

    def remaining(self) -> int:
        """Samples of the current epoch not taken yet."""
        return self.num_samples - self.consumed

    # -- steps -------------------------------------------------------------------------

    def step_size(self, world: int, start: Optional[int] = None) -> int:
        """Samples the step from position ``start`` (default: the sampler's) takes
        with ``world`` ranks."""
        start = self.consumed if start is None else start
        per_step = self.global_batch if self.global_batch is not None else world * (self.batch_size or 0)
        return min(per_step, self.num_samples - start)

    def share(self, rank: int, world: int, start: int, step: int) -> Tuple[int, int]:
        """The positions ``[lo, hi)`` of ``rank``'s share of the step of ``step``
        samples from ``start``."""
        if self.global_batch is not None:
            # Even split: rank r takes [r*step/W, (r+1)*step/W); sizes differ by <= 1.
            return start + rank * step // world, start + (rank + 1) * step // world
        assert self.batch_size is not None
        return start + min(rank * self.batch_size, step), start + min((rank + 1) * self.batch_size, step)

    def take(self) -> List[int]:
        """This rank's indices for the next step; advances the position by the whole
        world's step. Every rank must call it once per step."""
        rank, world = self._world()
        start = self.consumed
        step = self.step_size(world)
        lo, hi = self.share(rank, world, start, step)
        self._advance(step, hi - lo)
        return self.indices(lo, hi)

    def _advance(self, step: int, mine: int) -> None:
        """The training takes a step of ``step`` samples, ``mine`` of them this rank's."""
        self.consumed += step
        self.total += step
        if self._world is _world:
            # The step's split, for the weighting of a DDP comm hook.
            from . import elastic

            elastic._count_samples(mine, step)

    def next_epoch(self) -> None:
        """The epoch is used up: the next one starts (in this release's order)."""
        self.epoch += 1
        self.consumed = 0
        self.order_version = _ORDER

    def micro_batches(self, indices: Sequence[int]) -> Iterator[Tuple[Sequence[int], float]]:
        """Split this rank's share of a step into pieces of at most ``micro_batch``
        samples (the whole share without it), each with its weight ``len(piece) /
        len(indices)``: scale each piece's mean loss by its weight before backward, and
        the accumulated gradient is that of the mean over the rank's samples."""
        n = len(indices)
        size = self.micro_batch or max(n, 1)
        for lo in range(0, n, size):
            piece = indices[lo : lo + size]
            yield piece, len(piece) / n

    def __iter__(self) -> Iterator[List[int]]:
        while self.consumed < self.num_samples:
            yield self.take()
        self.next_epoch()

    # -- state -------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        return {
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "global_batch": self.base_batch,
            "batch_now": self.global_batch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "total": self.total,
            "order": self.order_version,
        }

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        for key in ("num_samples", "batch_size", "global_batch", "seed", "shuffle"):
            saved = d.get(key)  # global_batch is absent from older checkpoints: None
            mine = self.base_batch if key == "global_batch" else getattr(self, key)
            if saved != mine:
                raise ValueError(
                    f"sampler state was saved with {key}={saved!r}, this sampler has "
                    f"{mine!r}: the dataset or batch size changed"
                )
        order = int(d.get("order", 1))
        if order not in (1, _ORDER):
            raise ValueError(f"sampler state has order version {order}; this release knows 1 and {_ORDER}")
        # The batch bftrainerd had decided (absent from older checkpoints: the base).
        now = d.get("batch_now", self.base_batch)
        self.global_batch = _positive("batch_now", now)
        self.epoch = int(d["epoch"])
        self.consumed = int(d["consumed"])
        self.total = int(d["total"])
        # An older checkpoint's epoch ends in its own order; the next epoch uses ours.
        self.order_version = order if self.consumed > 0 else _ORDER
