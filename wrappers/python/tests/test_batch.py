"""The global batch bftrainerd decides, applied at a step boundary (bftrainer.batch)."""

import math

import pytest
import torch

import bftrainer
from bftrainer import batch as B
from bftrainer.sampler import ElasticSampler
from bftrainer.state import State


@pytest.fixture(autouse=True)
def no_callbacks(monkeypatch):
    monkeypatch.setattr(B, "_callbacks", [])
    monkeypatch.delenv(B.ENV_RULE, raising=False)


def make(rule=None, g=256, sched=False):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = ElasticSampler(10_000, global_batch=g, seed=3, world=lambda: (0, 1))
    kw = {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0)} if sched else {}
    return State(model=model, optimizer=opt, sampler=s, lr_rule=rule, **kw)


def lr(st):
    return st.optimizer.param_groups[0]["lr"]


def test_lr_factors():
    assert B.lr_factor("linear", 512, 256) == 2.0
    assert B.lr_factor("sqrt", 1024, 256) == 2.0
    assert B.lr_factor("none", 1024, 256) == 1.0
    with pytest.raises(ValueError, match="unknown learning-rate rule 'cubic'"):
        B.lr_factor("cubic", 1, 1)


@pytest.mark.parametrize("rule,f", [("linear", 4.0), ("sqrt", 2.0), ("none", 1.0)])
def test_rule_scales_lr_and_comes_back(rule, f):
    st = make(rule)
    assert B.apply(st, 1024)
    assert st.sampler.global_batch == 1024 and st.sampler.base_batch == 256
    assert math.isclose(lr(st), 0.1 * f)
    assert not B.apply(st, 1024)  # unchanged: nothing to do
    assert B.apply(st, 512)
    assert math.isclose(lr(st), 0.1 * B.lr_factor(rule, 512, 256))
    assert B.apply(st, None)  # no decision: the script's own batch and lr
    assert st.sampler.global_batch == 256 and math.isclose(lr(st), 0.1)


def test_rule_from_the_job_and_a_scheduler_keeps_the_factor(monkeypatch):
    monkeypatch.setenv(B.ENV_RULE, "linear")
    st = make(None, sched=True)
    B.apply(st, 512)
    assert math.isclose(lr(st), 0.2)
    st.optimizer.step()
    st.scheduler.step()  # LambdaLR recomputes lr from its bases
    assert math.isclose(lr(st), 0.2)
    monkeypatch.setenv(B.ENV_RULE, "cubic")
    with pytest.raises(ValueError, match="unknown learning-rate rule"):
        B.apply(st, 1024)
    with pytest.raises(ValueError, match="lr_rule must be"):
        make("cubic")


def test_a_callback_replaces_the_rule():
    seen = []

    @bftrainer.on_batch_change
    def cb(state, old, new):
        seen.append((old, new, state.sampler.global_batch))

    st = make("linear")
    B.apply(st, 2048)
    assert seen == [(256, 2048, 2048)] and math.isclose(lr(st), 0.1)
    with pytest.raises(TypeError):
        bftrainer.on_batch_change(3)


def test_per_rank_batches_ignore_the_decision(capsys):
    st = State(sampler=ElasticSampler(100, batch_size=8, world=lambda: (0, 1)))
    assert not B.apply(st, 64)
    assert st.sampler.batch_size == 8 and st.sampler.global_batch is None
    assert "the decision is ignored" in capsys.readouterr().err


def test_every_sample_once_when_the_batch_changes_mid_epoch():
    n = 2000
    world = {"w": 2}
    ranks = [ElasticSampler(n, global_batch=64, seed=5, world=lambda r=r: (r, world["w"])) for r in range(4)]
    used, sizes, step = [], [], 0
    while ranks[0].epoch == 0:
        if step == 3:
            world["w"] = 3
        g = {5: 200, 9: 32}.get(step)
        saved = ranks[0].state_dict()
        for s in ranks:
            s.load_state_dict(saved)
            if g is not None:
                s.global_batch = g  # what apply does on every rank at one boundary
        if ranks[0].consumed >= n:
            break
        took = [ranks[r].take() for r in range(world["w"])]
        sizes.append(sum(map(len, took)))
        for t in took:
            used.extend(t)
        for s in ranks[world["w"] :]:
            s.load_state_dict(ranks[0].state_dict())
        step += 1
    assert sorted(used) == list(range(n))
    assert sizes[:5] == [64] * 5 and sizes[5:9] == [200] * 4 and set(sizes[9:-1]) == {32}


def test_the_decided_batch_is_saved_restored_and_checked_against_the_base():
    st = make("linear")
    st.save()
    B.apply(st, 512)
    st.save()  # what enter() does after applying: the change is committed
    d = st.sampler.state_dict()
    assert (d["global_batch"], d["batch_now"]) == (256, 512)
    fresh = ElasticSampler(10_000, global_batch=256, seed=3, world=lambda: (0, 1))
    fresh.load_state_dict(d)
    assert (fresh.global_batch, fresh.base_batch) == (512, 256)
    # A rollback returns to the commit, batch and learning rate together.
    B.apply(st, 1024)
    st.restore()
    assert st.sampler.global_batch == 512 and math.isclose(lr(st), 0.2)
    # A script written for another base batch is refused, as before.
    other = ElasticSampler(10_000, global_batch=128, seed=3, world=lambda: (0, 1))
    with pytest.raises(ValueError, match="global_batch=256"):
        other.load_state_dict(d)
    # A checkpoint from before batch decisions: the current batch is its global_batch.
    old = dict(d)
    del old["batch_now"]
    fresh.load_state_dict(old)
    assert fresh.global_batch == 256
    bad = dict(d, batch_now=0)
    with pytest.raises(ValueError, match="batch_now must be a positive whole number"):
        fresh.load_state_dict(bad)
