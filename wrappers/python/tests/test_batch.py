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


# -- restarting modes (bft-run --mode torchrun / mpi): the decision in BFT_GLOBAL_BATCH --


def world_env(monkeypatch, batch, lo="64", hi="1024"):
    for k, v in ((B.ENV_BATCH, batch), (B.ENV_MIN, lo), (B.ENV_MAX, hi)):
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)


def restarted_world(ckpt, rule="linear"):
    """What a torchrun script does at each start: build, restore, apply the world's batch."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = ElasticSampler(10_000, global_batch=256, seed=3, world=lambda: (0, 2))
    if ckpt is not None:
        s.load_state_dict(ckpt["sampler"])
        opt.load_state_dict(ckpt["opt"])
    g = bftrainer.apply_world_batch(s, opt, lr_rule=rule)
    return s, opt, g


def test_each_restarted_world_runs_at_the_decision_with_the_lr_rule(monkeypatch):
    world_env(monkeypatch, None)
    s, opt, g = restarted_world(None)
    assert g == 256 and opt.param_groups[0]["lr"] == 0.1  # no decision: the script's own
    consumed = 0
    for decided, want in (("1024", 1024), ("512", 512), (None, 256), ("64", 64)):
        s.take()
        consumed += s.global_batch
        ckpt = {"sampler": s.state_dict(), "opt": opt.state_dict()}
        world_env(monkeypatch, decided)
        s, opt, g = restarted_world(ckpt)
        assert g == want and s.global_batch == want and s.base_batch == 256
        # The lr is the base lr times the rule's factor of this batch, however many
        # worlds (and batches) the checkpoint went through.
        assert math.isclose(opt.param_groups[0]["lr"], 0.1 * want / 256), decided
        assert s.consumed == consumed  # the epoch goes on where the last world stopped
        assert len(s.take()) == want // 2  # rank 0 of 2 takes half of the decided batch
        s.consumed -= want  # (the probe's step is not part of the run)
        s.total -= want


def test_a_callback_gets_the_worlds_change(monkeypatch):
    seen = []
    bftrainer.on_batch_change(lambda st, old, new: seen.append((old, new, st.optimizer is not None)))
    world_env(monkeypatch, "512")
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = ElasticSampler(10_000, global_batch=256, world=lambda: (0, 1))
    assert bftrainer.apply_world_batch(s, opt) == 512
    assert seen == [(256, 512, True)]
    assert opt.param_groups[0]["lr"] == 0.1  # the callback replaced the rule


@pytest.mark.parametrize(
    "batch,lo,hi,match",
    [
        ("2048", "64", "1024", r"BFT_GLOBAL_BATCH=2048 is outside the job's declared batch=64:1024"),
        ("32", "64", "1024", r"BFT_GLOBAL_BATCH=32 is outside the job's declared batch=64:1024"),
        ("512", None, None, r"the job declared no batch range"),
        ("512", "64", None, r"the job declared no batch range"),
        ("5e2", "64", "1024", r"BFT_GLOBAL_BATCH='5e2' is not a global batch"),
        ("-1", "64", "1024", r"is not a global batch: expected a whole number from 1 to 16777216"),
        ("0", "64", "1024", r"is not a global batch"),
        ("16777217", "1", "16777216", r"is not a global batch"),
        ("512", "x", "1024", r"BFT_BATCH_MIN='x' is not a global batch"),
    ],
)
def test_a_forged_or_bad_world_batch_is_refused(monkeypatch, batch, lo, hi, match):
    world_env(monkeypatch, batch, lo, hi)
    s = ElasticSampler(10_000, global_batch=256, world=lambda: (0, 1))
    with pytest.raises(ValueError, match=match):
        bftrainer.apply_world_batch(s)
    assert s.global_batch == 256  # nothing applied


def test_a_per_rank_sampler_ignores_the_worlds_decision(monkeypatch, capsys):
    monkeypatch.setattr(B, "_warned", False)
    world_env(monkeypatch, "512")
    s = ElasticSampler(10_000, batch_size=32, world=lambda: (0, 1))
    assert bftrainer.apply_world_batch(s) is None
    assert "the decision is ignored" in capsys.readouterr().err


def test_report_progress_writes_rank_0s_counts_for_bft_run(monkeypatch, tmp_path, capsys):
    import json

    path = tmp_path / "progress"
    monkeypatch.setattr(B, "_last_report", [float("-inf")])
    # Outside bft-run's torchrun mode: nothing.
    monkeypatch.delenv("BFT_PROGRESS_FILE", raising=False)
    assert not bftrainer.report_progress(10, 1)
    monkeypatch.setenv("BFT_PROGRESS_FILE", str(path))
    monkeypatch.setenv("BFT_GENERATION", "4")
    monkeypatch.setenv("RANK", "1")
    assert not bftrainer.report_progress(10, 1) and not path.exists()  # rank 0 only
    # Under mpirun (no RANK): the MPI library's rank, rank 0 only.
    monkeypatch.delenv("RANK")
    for k in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        monkeypatch.delenv(k, raising=False)
    for k in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        monkeypatch.setenv(k, "2")
        assert not bftrainer.report_progress(10, 1) and not path.exists(), k
        monkeypatch.delenv(k)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert bftrainer.report_progress(10, 1, every=0) and path.exists()
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    monkeypatch.setattr(B, "_last_report", [float("-inf")])
    monkeypatch.setenv("RANK", "0")
    assert bftrainer.report_progress(4096, 16, batch=256)
    assert json.loads(path.read_text()) == {"gen": 4, "samples": 4096, "steps": 16, "batch": 256}
    # At most every `every` seconds.
    assert not bftrainer.report_progress(8192, 32, batch=256)
    assert json.loads(path.read_text())["samples"] == 4096
    assert bftrainer.report_progress(8192, 32, every=0)
    assert json.loads(path.read_text())["samples"] == 8192
    for bad in (dict(samples=-1), dict(samples=1.5), dict(samples=True), dict(samples=1, steps=-2),
                dict(samples=1, batch=0), dict(samples=1, batch=1 << 30)):
        with pytest.raises(ValueError, match="report_progress"):
            bftrainer.report_progress(every=0, **bad)
    # A write that fails is said once and never raised.
    monkeypatch.setenv("BFT_PROGRESS_FILE", str(tmp_path / "gone" / "progress"))
    monkeypatch.setattr(B, "_said_report", [])
    assert not bftrainer.report_progress(1, every=0)
    assert not bftrainer.report_progress(2, every=0)
    assert capsys.readouterr().err.count("report_progress cannot write") == 1
