import random

import pytest

from bftrainer.sampler import ElasticSampler


def run_epochs(n, batch, epochs, world_at, rollback_at=(), global_batch=None):
    """Drive a sampler through epochs with the world size changing per step;
    return the samples each epoch used (committed lineage). With ``global_batch`` each
    step's split is checked too (G samples, sizes differing by at most one)."""
    world = {"w": 1}
    samplers = {}
    form = {"global_batch": global_batch} if global_batch else {"batch_size": batch}

    def make(rank):
        return ElasticSampler(n, seed=7, world=lambda: (rank, world["w"]), **form)

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
        if global_batch:
            sizes = [len(t) for t in taken]
            assert sum(sizes) == min(global_batch, n - saved["consumed"]) and max(sizes) - min(sizes) <= 1
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


# -- the keyed order and the global-batch form ------------------------------------------

from bftrainer.sampler import KeyedOrder  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 255, 1000, 4097])
def test_the_keyed_order_is_a_bijection_and_take_agrees_with_indexing(n):
    for key in range(4):
        o = KeyedOrder(n, key)
        one_by_one = [o[i] for i in range(n)]
        assert sorted(one_by_one) == list(range(n))
        assert o.take(0, n) == one_by_one  # the numpy path from 64 positions up
        assert all(o.position(s) == i for i, s in enumerate(one_by_one))


@pytest.mark.parametrize("n", [10**3, 10**6, 10**10, 2**40])
def test_large_orders_stay_inside_the_range_and_invert(n):
    rng = random.Random(n)
    o = KeyedOrder(n, 12345)
    lo = rng.randrange(n - 300) if n > 300 else 0
    window = o.take(lo, min(lo + 300, n))
    assert len(set(window)) == len(window) and all(0 <= s < n for s in window)
    for i in [0, n - 1] + [rng.randrange(n) for _ in range(200)]:
        assert o.position(o[i]) == i


@pytest.mark.parametrize("seed", range(10))
def test_a_global_batch_takes_exactly_once_per_epoch_whatever_the_world_does(seed):
    rng = random.Random(seed)
    n, g, epochs = rng.randint(1, 3000), rng.randint(1, 97), 2
    sizes = [rng.randint(1, 9) for _ in range(10_000)]
    rollbacks = {s for s in range(10_000) if rng.random() < 0.1}
    used = run_epochs(n, None, epochs, lambda s: sizes[s], rollbacks, global_batch=g)
    for e in range(epochs):
        assert sorted(used[e]) == list(range(n)), f"epoch {e}"


def test_a_global_batch_step_is_the_same_samples_whatever_the_world():
    def step_samples(world, n=10**10):
        out = []
        for r in range(world):
            s = ElasticSampler(n, global_batch=1000, seed=5, world=lambda r=r: (r, world))
            s.consumed = 123_456_789
            out.extend(s.take())
        return out

    one = step_samples(1)
    assert len(one) == 1000 and len(set(one)) == 1000
    for w in (2, 3, 7, 16):
        assert step_samples(w) == one


def test_micro_batches_cover_the_share_with_weights_summing_to_one():
    s = ElasticSampler(100, global_batch=10, micro_batch=3, world=lambda: (0, 1))
    idx = s.take()
    pieces = list(s.micro_batches(idx))
    assert [len(p) for p, _ in pieces] == [3, 3, 3, 1]
    assert [i for p, _ in pieces for i in p] == idx
    assert sum(w for _, w in pieces) == pytest.approx(1.0)
    assert list(s.micro_batches([])) == []


def test_forms_are_exclusive_and_a_changed_global_batch_is_refused():
    with pytest.raises(ValueError, match="either batch_size"):
        ElasticSampler(10)
    with pytest.raises(ValueError, match="either batch_size"):
        ElasticSampler(10, 2, global_batch=4)
    with pytest.raises(ValueError, match="global_batch must be a positive"):
        ElasticSampler(10, global_batch=0)
    with pytest.raises(ValueError, match="micro_batch must be a positive"):
        ElasticSampler(10, global_batch=4, micro_batch=-1)
    d = ElasticSampler(10, global_batch=4).state_dict()
    with pytest.raises(ValueError, match="global_batch=4.*has 8"):
        ElasticSampler(10, global_batch=8).load_state_dict(d)
    with pytest.raises(ValueError, match="batch_size=None.*has 4"):
        ElasticSampler(10, 4).load_state_dict(d)


def test_an_older_checkpoint_ends_its_epoch_in_its_own_order():
    n = 50
    legacy = list(range(n))
    random.Random(3 * 1_000_003 + 0).shuffle(legacy)  # the order of release <= 0.1 (seed 3, epoch 0)
    old_state = {"num_samples": n, "batch_size": 5, "seed": 3, "shuffle": True, "epoch": 0, "consumed": 20, "total": 20}
    s = ElasticSampler(n, 5, seed=3, world=lambda: (0, 1))
    s.load_state_dict(old_state)
    rest = [i for b in s for i in b]
    assert rest == legacy[20:]
    assert s.epoch == 1 and s.state_dict()["order"] == 2
    legacy_next = list(range(n))
    random.Random(3 * 1_000_003 + 1).shuffle(legacy_next)
    assert sorted(s.permutation()) == list(range(n)) and s.permutation() != legacy_next


def test_the_loss_comparison_of_the_runtime_tests_catches_a_difference(tmp_path):
    import sys as _sys

    _sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from check_samples import compare_losses, step_losses

    (tmp_path / "a.log").write_text("L 1 1 0 2.0 2\nL 1 1 1 4.0 2\nL 1 2 0 9.0 3\nL 2 2 0 3.0 3\n")
    losses = step_losses(str(tmp_path))
    assert losses == {1: 1.5, 2: 1.0}  # step 2: the later generation's run counts
    assert compare_losses(losses, {1: 1.5, 2: 1.00005}, 1e-4)["steps"] == 2
    with pytest.raises(AssertionError, match="step 2: loss"):
        compare_losses(losses, {1: 1.5, 2: 1.001}, 1e-4)
    with pytest.raises(AssertionError, match="missing"):
        compare_losses(losses, {3: 1.0}, 1e-4)
    # Near convergence a difference counts against a thousandth of the first loss
    # (here 0.01): 5e-7 apart at a loss of 0.001 passes (5e-5 against 0.01, though 5e-4
    # of the loss itself), 1e-5 apart does not.
    assert compare_losses({1: 10.0, 2: 0.0010005}, {1: 10.0, 2: 0.001}, 1e-4)["steps"] == 2
    with pytest.raises(AssertionError, match="step 2: loss"):
        compare_losses({1: 10.0, 2: 0.00101}, {1: 10.0, 2: 0.001}, 1e-4)
    # After `until` (the world no longer changed) the bound is rtol_after.
    far = ({1: 10.0, 2: 0.00101, 3: 2.0}, {1: 10.0, 2: 0.001, 3: 2.0})
    assert compare_losses(*far, 1e-4, until=1)["steps"] == 3
    with pytest.raises(AssertionError, match="over 1e-02"):
        compare_losses({1: 10.0, 2: 0.0011}, {1: 10.0, 2: 0.001}, 1e-4, until=1)
    # More than `window` steps after it, by the mean: one step 5% apart passes, a mean
    # 20% apart does not.
    late = {1: 10.0, 2: 1.0, 3: 1.05, 4: 1.0}
    assert compare_losses(late, {1: 10.0, 2: 1.0, 3: 1.0, 4: 1.0}, 1e-4, until=1, window=1)["steps"] == 4
    with pytest.raises(AssertionError, match="mean loss"):
        compare_losses({1: 10.0, 2: 1.0, 3: 1.2, 4: 1.2}, {1: 10.0, 2: 1.0, 3: 1.0, 4: 1.0}, 1e-4,
                       until=1, window=1)


def test_two_runs_compare_by_the_samples_and_the_losses_of_their_committed_steps(tmp_path):
    import sys as _sys

    _sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from check_samples import compare_runs

    elastic, static = tmp_path / "elastic", tmp_path / "static"
    elastic.mkdir()
    static.mkdir()
    # Elastic: step 2 ran in generation 1 on one rank, was rolled back, and ran again in
    # generation 2 on two ranks; static: one generation of two ranks.
    (elastic / "a.log").write_text(
        "S 1 1 0 0 3 1\nL 1 1 0 4.0 2\nS 1 2 0 0 0 2\nL 1 2 0 9.0 2\nS 2 2 0 0 2\nL 2 2 0 1.0 1\n"
    )
    (elastic / "b.log").write_text("S 2 2 0 1 0\nL 2 2 1 1.0 1\n")
    (static / "a.log").write_text("S 1 1 0 0 1\nL 1 1 0 1.0 1\nS 1 2 0 0 0\nL 1 2 0 1.0 1\n")
    (static / "b.log").write_text("S 1 1 0 1 3\nL 1 1 1 3.0 1\nS 1 2 0 1 2\nL 1 2 1 1.0 1\n")
    assert compare_runs(str(elastic), str(static))["steps"] == 2
    # The static run may stop early (a prefix of the steps), not skip one.
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    (prefix / "a.log").write_text("S 1 1 0 0 1 3\nL 1 1 0 4.0 2\n")
    assert compare_runs(str(elastic), str(prefix))["steps"] == 1
    (prefix / "a.log").write_text("S 1 2 0 0 0 2\nL 1 2 0 2.0 2\n")
    with pytest.raises(AssertionError, match="not a prefix"):
        compare_runs(str(elastic), str(prefix))
    # A sample of another step, or a loss 1% apart, is caught.
    (static / "b.log").write_text("S 1 1 0 1 4\nL 1 1 1 3.0 1\nS 1 2 0 1 2\nL 1 2 1 1.0 1\n")
    with pytest.raises(AssertionError, match=r"step 1: 2 samples .* differing in \[3, 4\]"):
        compare_runs(str(elastic), str(static))
    (static / "b.log").write_text("S 1 1 0 1 3\nL 1 1 1 3.0 1\nS 1 2 0 1 2\nL 1 2 1 1.02 1\n")
    with pytest.raises(AssertionError, match="step 2: loss"):
        compare_runs(str(elastic), str(static))
    # A bound of its own (float64) holds at every step: 1e-9 apart passes 1e-8, 1e-7 not.
    (static / "b.log").write_text("S 1 1 0 1 3\nL 1 1 1 3.0 1\nS 1 2 0 1 2\nL 1 2 1 1.000000002 1\n")
    assert compare_runs(str(elastic), str(static), 1e-8)["steps"] == 2
    (static / "b.log").write_text("S 1 1 0 1 3\nL 1 1 1 3.0 1\nS 1 2 0 1 2\nL 1 2 1 1.0000002 1\n")
    with pytest.raises(AssertionError, match="step 2: loss .* over 1e-08"):
        compare_runs(str(elastic), str(static), 1e-8)


def test_a_samples_random_stream_is_keyed_by_sample_and_epoch_not_by_rank():
    a = ElasticSampler(100, global_batch=10, seed=4, world=lambda: (0, 1))
    b = ElasticSampler(100, global_batch=10, seed=4, world=lambda: (3, 4))
    assert a.seed_of(17) == b.seed_of(17) and 0 <= a.seed_of(17) < 2**63
    assert a.seed_of(17) != a.seed_of(18) and a.seed_of(17) != a.seed_of(17, epoch=1)
    assert a.seed_of(17) != ElasticSampler(100, global_batch=10, seed=5).seed_of(17)
