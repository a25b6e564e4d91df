"""transfer.py: the wire format in process, and sync() between three real processes
(gloo on the CPU, a TCPStore on a free port). Run as a script, this file is one of
those processes."""

import datetime
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import bftrainer  # noqa: E402
from bftrainer import transfer  # noqa: E402

WORLD = 3
SCENARIOS = ("newcomer", "lagging", "fresh", "refused")


# -- the wire format, in process -------------------------------------------------------


def adam_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return model, opt


def same(a, b):
    """Equal trees: same container types, same key types, equal tensors (dtype and
    shape included), nan equal to nan."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(
            type(k1) is type(k2) and same(a[k1], b[k2]) for k1, k2 in zip(a, b)
        )
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def test_the_header_keeps_key_types_tuples_and_non_finite_floats():
    model, opt = adam_state()
    tree = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),  # int keys, a tuple (betas), tensors
        "plain": {0: "int key", "0": "str key", "x": [None, True, 3, -2.5, float("nan"), float("inf"), float("-inf")]},
        "odd": (torch.tensor(7, dtype=torch.int64), torch.zeros(0, 3), torch.ones(2, dtype=torch.bfloat16),
                torch.tensor([True, False]), 10**30),
    }
    header, tensors, paths = transfer.encode(tree)
    assert ("optimizer", "state", 0, "exp_avg") in paths
    back = transfer.decode(header, [t.clone() for t in tensors])
    assert same(back["optimizer"], opt.state_dict())
    assert same(back["plain"], tree["plain"]) and same(back["odd"], tree["odd"])
    assert same(dict(back["model"]), dict(model.state_dict()))
    # An optimizer loads it.
    _, other = adam_state()
    other.load_state_dict(back["optimizer"])
    assert other.state_dict()["param_groups"][0]["betas"] == (0.9, 0.999)


def test_a_tensor_shared_by_two_places_is_sent_once():
    w = torch.ones(3, 2)
    header, tensors, _ = transfer.encode({"model": {"embed.weight": w, "head.weight": w}})
    assert len(tensors) == 1
    back = transfer.decode(header, tensors)
    assert back["model"]["embed.weight"] is back["model"]["head.weight"]


class Opaque:
    pass


def test_what_the_format_cannot_carry_is_refused_naming_the_place():
    with pytest.raises(TypeError, match=r"state\['extras'\]\['cfg'\]\['fn'\] is a test_transfer.Opaque.*may hold only"):
        transfer.encode({"extras": {"cfg": {"fn": Opaque()}}})
    with pytest.raises(TypeError, match="a dict with a float key"):
        transfer.encode({"extras": {1.5: 2}})
    with pytest.raises(TypeError, match="state extra 'bad'"):
        bftrainer.State(bad=Opaque())


def test_a_malformed_header_is_refused_without_evaluating_anything():
    with pytest.raises(transfer.StateTransferError, match="unknown dtype 'load'"):
        transfer.parse_header(b'{"format": 1, "tree": null, "tensors": [{"path": [], "dtype": "load", "shape": []}]}')
    with pytest.raises(transfer.StateTransferError, match="not JSON"):
        transfer.parse_header(b"\x80\x04K\x01.")  # a pickle
    with pytest.raises(transfer.StateTransferError, match="unknown node"):
        transfer.decode(b'{"format": 1, "tree": {"__reduce__": 1}, "tensors": []}', [])


# -- sync between three processes -------------------------------------------------------


class Counter:
    """An extra that is an object with state_dict()/load_state_dict()."""

    def __init__(self):
        self.n = 0

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, d):
        self.n = d["n"]


def make_state(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return bftrainer.State(
        model=model,
        optimizer=opt,
        sampler=bftrainer.ElasticSampler(64, 4, seed=3, world=lambda: (0, 1)),
        scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
        scaler=torch.amp.GradScaler("cpu", init_scale=256.0),
        best=1.0,
        hist={},
        ema=torch.zeros(3),
        counter=Counter(),
        obj=None,
    )


def train(state, steps):
    g = torch.Generator().manual_seed(99)
    X, Y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    for _ in range(steps):
        idx = state.sampler.take()
        state.optimizer.zero_grad()
        torch.nn.functional.mse_loss(state.model(X[idx]), Y[idx]).backward()
        state.optimizer.step()
        state.scheduler.step()
        state.best = state.best / 2
        state.hist[state.step] = ("loss", float("nan") if state.step == 1 else state.step * 0.5, None)
        state.ema += 1
        state.counter.n += 10
        state.step += 1
        state.save()  # commit() without the runtime


def snapshot(state):
    return {
        "committed_step": state.committed_step,
        "state": transfer.copy_tree(state.state_dict(), "state"),
        "ptrs": [p.data_ptr() for p in state.model.parameters()],
    }


def worker(rank, port, out):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    results = {}
    for scenario in SCENARIOS:
        if scenario == "newcomer":  # ranks 0 and 1 at step 3, rank 2 new
            state = make_state(0 if rank < 2 else 1)
            if rank < 2:
                train(state, 3)
        elif scenario == "lagging":  # rank 0 at step 4, ranks 1 and 2 at step 5
            state = make_state(0)
            train(state, 4 if rank == 0 else 5)
        else:  # nobody committed: every rank has its own initial model
            state = make_state(10 + rank)
        before = snapshot(state)
        if scenario == "refused" and rank == 0:
            state.obj = Opaque()
        calls = {"payload": 0, "load": 0, "model_load": 0, "wait": 0}
        for name, obj, attr in (("payload", state, "_payload"), ("load", state, "_load"),
                                ("model_load", state.model, "load_state_dict")):
            def counted(*a, _f=getattr(obj, attr), _n=name, **k):
                calls[_n] += 1
                return _f(*a, **k)
            setattr(obj, attr, counted)

        def wait(work, what):
            calls["wait"] += 1
            assert isinstance(what, str) and what
            work.wait()

        error = None
        try:
            transfer.sync(state, rank, WORLD, None, wait)
        except (TypeError, transfer.StateTransferError) as e:
            error = f"{type(e).__name__}: {e}"
        if scenario == "refused":
            state.obj = None
        after = snapshot(state)
        # One more identical step everywhere: equal states must train identically.
        if error is None:
            state.sampler._world = lambda: (0, 1)
            train(state, 1)
        results[scenario] = {"before": before, "after": after, "calls": calls, "error": error,
                             "next": transfer.copy_tree(state.state_dict(), "state")}
        dist.barrier()
    torch.save(results, os.path.join(out, f"{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def synced(tmp_path_factory):
    import torch.distributed as dist

    out = str(tmp_path_factory.mktemp("sync"))
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env = {k: v for k, v in env.items() if not k.startswith("BFT_")}
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(store.port), out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r}:\n{outputs[r][-3000:]}"
    return [torch.load(os.path.join(out, f"{r}.pt"), weights_only=False) for r in range(WORLD)]


def test_a_newcomer_receives_exactly_the_members_state(synced):
    r = [s["newcomer"] for s in synced]
    new = r[2]
    assert new["before"]["committed_step"] == -1
    assert new["after"]["committed_step"] == 3 and new["after"]["state"]["step"] == 3
    assert same(new["after"]["state"], r[0]["after"]["state"])  # model, Adam, sampler, scheduler, scaler, extras
    assert new["after"]["state"]["extras"]["counter"] == {"n": 30}
    assert math.isnan(new["after"]["state"]["extras"]["hist"][1][1])
    assert len(new["after"]["state"]["optimizer"]["state"]) == 4  # Adam's moments arrived
    # Straight into the model's own tensors: no load_state_dict on the model.
    assert new["after"]["ptrs"] == new["before"]["ptrs"] and new["calls"]["model_load"] == 0
    assert new["calls"]["wait"] > 3
    # The members: rank 0 sent, rank 1 did nothing but the all-gather; both untouched.
    for m in r[:2]:
        assert same(m["after"], m["before"]) and m["calls"]["load"] == 0 and m["calls"]["wait"] >= 1
    assert r[0]["calls"]["payload"] == 1 and r[1]["calls"]["payload"] == 0
    # Equal states train identically.
    assert same(new["next"], r[0]["next"]) and same(r[1]["next"], r[0]["next"])


def test_a_member_behind_receives_from_the_lowest_rank_ahead(synced):
    r = [s["lagging"] for s in synced]
    assert [x["before"]["committed_step"] for x in r] == [4, 5, 5]
    assert r[0]["after"]["committed_step"] == 5
    assert same(r[0]["after"]["state"], r[1]["after"]["state"])
    assert not same(r[0]["before"]["state"]["model"], r[0]["after"]["state"]["model"])
    assert r[1]["calls"]["payload"] == 1 and r[2]["calls"]["payload"] == 0
    assert same(r[2]["after"], r[2]["before"]) and same(r[1]["after"], r[1]["before"])
    assert same(r[0]["next"], r[2]["next"])


def test_without_any_commit_rank_0_sends_and_everyone_commits(synced):
    r = [s["fresh"] for s in synced]
    assert not same(r[1]["before"]["state"]["model"], r[0]["before"]["state"]["model"])
    for x in r:
        assert x["after"]["committed_step"] == 0
        assert same(x["after"]["state"]["model"], r[0]["before"]["state"]["model"])
    assert same(r[1]["next"], r[0]["next"]) and same(r[2]["next"], r[0]["next"])


def test_a_state_that_cannot_be_sent_is_refused_by_the_sender_and_reported_by_receivers(synced):
    r = [s["refused"] for s in synced]
    assert r[0]["error"].startswith("TypeError: state extra 'obj' is a __main__.Opaque"), r[0]["error"]
    assert "may hold only None, bool, int, float, str" in r[0]["error"]
    for x in r[1:]:
        assert x["error"] == "StateTransferError: rank 0 could not send its state (its own error says why)"


if __name__ == "__main__":
    sys.modules.setdefault("test_transfer", sys.modules["__main__"])
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
