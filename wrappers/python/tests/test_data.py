"""ElasticDataLoader: real torch DataLoaders (worker processes, prefetch) for every rank
of a world that changes, with steps rolled back; every sample once per epoch, each
batch the data of its indices, and prefetched batches of a void plan thrown away."""

import random

import pytest

torch = pytest.importorskip("torch")

from bftrainer.data import ElasticDataLoader  # noqa: E402
from bftrainer.sampler import ElasticSampler  # noqa: E402


class Rows(torch.utils.data.Dataset):
    """Sample i is the tensor [i, 2i]: a batch shows which samples it holds."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i, 2 * i])


@pytest.mark.parametrize("form", ["global", "per_rank"])
def test_every_sample_once_through_world_changes_and_rollbacks_with_prefetching_workers(form):
    rng = random.Random(3)
    n, epochs = 157, 2
    world = {"size": 2, "gen": 1}
    kw = {"global_batch": 12} if form == "global" else {"batch_size": 5}
    ranks = {}  # rank -> (sampler, loader, iterator)

    def join(r, state):
        s = ElasticSampler(n, seed=9, world=lambda r=r: (r, world["size"]), **kw)
        if state is not None:
            s.load_state_dict(state)
        loader = ElasticDataLoader(Rows(n), s, generation=lambda: world["gen"], num_workers=2, prefetch_factor=3)
        ranks[r] = (s, loader, iter(loader))

    for r in range(world["size"]):
        join(r, None)
    used = {e: [] for e in range(epochs)}
    replans = 0
    while ranks[0][0].epoch < epochs:
        lead = ranks[0][0]
        saved, epoch = lead.state_dict(), lead.epoch
        taken = []
        for r in range(world["size"]):
            s, loader, it = ranks[r]
            indices, batch = next(it)
            if batch is None:
                assert indices == []
            else:
                assert batch[:, 0].tolist() == indices and batch[:, 1].tolist() == [2 * i for i in indices]
            taken.append(indices)
        assert len({ranks[r][0].consumed for r in ranks}) == 1
        roll = rng.random()
        if roll < 0.1:  # the step is lost: every rank back to the commit, in a new generation
            for r in ranks:
                ranks[r][0].load_state_dict(saved)
            world["gen"] += 1
        else:
            for t in taken:
                used[epoch].extend(t)
        if roll > 0.85:  # a new world at this step boundary: ranks join or leave
            world["size"], world["gen"] = rng.randint(1, 4), world["gen"] + 1
        state = ranks[0][0].state_dict()
        for r in list(ranks):
            if r >= world["size"]:
                ranks[r][2].close()
                replans += ranks.pop(r)[1].replans
        for r in range(world["size"]):
            if r not in ranks:
                join(r, state)
        # The epoch ends for every rank at the same step: the next step starts a new
        # iteration of each loader (as `for ... in loader` once per epoch does).
        if ranks[0][0].state_dict()["consumed"] >= n:
            for r in ranks:
                s, loader, it = ranks[r]
                with pytest.raises(StopIteration):
                    next(it)
                ranks[r] = (s, loader, iter(loader))
    replans += sum(v[1].replans for v in ranks.values())
    for e in range(epochs):
        assert sorted(used[e]) == list(range(n)), f"epoch {e}"
    assert replans > 0


def test_dataloader_arguments_that_the_sampler_decides_are_refused():
    s = ElasticSampler(10, global_batch=4, world=lambda: (0, 1))
    with pytest.raises(ValueError, match="do not give batch_size, shuffle"):
        ElasticDataLoader(Rows(10), s, batch_size=4, shuffle=True)


def test_a_sigterm_to_the_process_group_leaves_the_loader_running():
    """bft-run asks a leaving worker to leave with SIGTERM to its process group; the
    DataLoader's processes must not die of it mid-step."""
    import multiprocessing
    import os
    import signal

    n = 64
    s = ElasticSampler(n, global_batch=4, seed=1, world=lambda: (0, 1))
    loader = ElasticDataLoader(Rows(n), s, generation=lambda: 1, num_workers=2, prefetch_factor=2)
    old = signal.signal(signal.SIGTERM, lambda *a: None)  # the library's leave handler
    try:
        before = {c.pid for c in multiprocessing.active_children()}  # other tests' leftovers
        it = iter(loader)
        next(it)
        children = [c for c in multiprocessing.active_children() if c.pid not in before]
        assert len(children) == 2  # this DataLoader's processes
        for child in children:
            os.kill(child.pid, signal.SIGTERM)
        got = [b for _, b in it]
        assert len(got) == n // 4 - 1
    finally:
        signal.signal(signal.SIGTERM, old)
