import random

import pytest

from bftrainer.sampler import ElasticSampler


def run_epochs(n, batch, epochs, world_at, rollback_at=()):
    """Drive a sampler through epochs with the world size changing per step;
    return the samples each epoch used (committed lineage)."""
    world = {"w": 1}
    samplers = {}

    def make(rank):
        return ElasticSampler(n, batch, seed=7, world=lambda: (rank, world["w"]))

    lead = make(0)
    used = [[] for _ in range(epochs)]
    step = 0
    while lead.epoch < epochs:
        world["w"] = world_at(step)
        saved = lead.state_dict()
        if lead.consumed >= n:
            lead.epoch, lead.consumed = lead.epoch + 1, 0
            continue
        taken = []
        for r in range(world["w"]):
            s = samplers.setdefault(r, make(r))
            s.load_state_dict(saved)
            taken.append(s.take())
        lead.load_state_dict(samplers[0].state_dict())
        if step in rollback_at:
            lead.load_state_dict(saved)  # the step is lost: taken again
        else:
            for t in taken:
                used[saved["epoch"]].extend(t)
        step += 1
    return used


@pytest.mark.parametrize("seed", range(20))
def test_exactly_once_per_epoch_whatever_the_world_does(seed):
    rng = random.Random(seed)
    n, batch, epochs = rng.randint(1, 500), rng.randint(1, 17), 3
    sizes = [rng.randint(1, 6) for _ in range(10_000)]
    rollbacks = {s for s in range(10_000) if rng.random() < 0.1}
    used = run_epochs(n, batch, epochs, lambda s: sizes[s], rollbacks)
    for e in range(epochs):
        assert sorted(used[e]) == list(range(n)), f"epoch {e}"


def test_order_depends_on_seed_and_epoch_only():
    a = ElasticSampler(100, 10, seed=1, world=lambda: (0, 1))
    b = ElasticSampler(100, 10, seed=1, world=lambda: (0, 3))
    assert a.permutation(0) == b.permutation(0)
    assert a.permutation(0) != a.permutation(1)
    assert ElasticSampler(10, 2, shuffle=False, world=lambda: (0, 1)).permutation() == list(range(10))


def test_ranks_split_a_step_and_the_tail_may_be_empty():
    n = 10
    takes = [ElasticSampler(n, 3, shuffle=False, world=lambda r=r: (r, 4)).take() for r in range(4)]
    assert takes == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    s = ElasticSampler(n, 3, shuffle=False, world=lambda: (3, 4))
    s.consumed = 9
    assert s.take() == []  # rank 3's slice of the last step is empty
    assert s.consumed == 10 and s.total == 1


def test_epoch_flips_after_the_last_step_and_state_round_trips():
    s = ElasticSampler(5, 2, world=lambda: (0, 1))
    batches = list(s)
    assert sum(map(len, batches)) == 5 and s.epoch == 1 and s.consumed == 0
    d = s.state_dict()
    t = ElasticSampler(5, 2, world=lambda: (0, 1))
    t.load_state_dict(d)
    assert t.state_dict() == d


def test_bad_arguments_and_mismatched_state_are_refused():
    with pytest.raises(ValueError, match="num_samples must be positive"):
        ElasticSampler(0, 1)
    with pytest.raises(ValueError, match="batch_size"):
        ElasticSampler(10, 0)
    d = ElasticSampler(10, 2).state_dict()
    with pytest.raises(ValueError, match="batch_size=2.*has 3"):
        ElasticSampler(10, 3).load_state_dict(d)
