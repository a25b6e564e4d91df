"""Sharded state (FSDP2 HSDP on bftrainer.device_mesh()): the mesh survives a new world,
a newcomer node's local rank i receives local rank i's shards from a live replica (all
local ranks at once, nothing gathered), commit/rollback keep DTensors, and sharded
checkpoints load under another world size. Four gloo processes on the CPU: two nodes
of two workers, with the runtime's own calls (no bft-run)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import bftrainer  # noqa: E402
from bftrainer import _mesh, transfer  # noqa: E402

WORLD, LOCAL = 4, 2


def build(seed):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    mesh = bftrainer.device_mesh()
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sampler = bftrainer.ElasticSampler(256, batch_size=4, seed=3, world=lambda: (RANK, WORLD_NOW))
    return bftrainer.State(model=model, optimizer=opt, sampler=sampler, copy=True)


RANK, WORLD_NOW = 0, WORLD
g = torch.Generator().manual_seed(5)
X = torch.randn(256, 8, generator=g)
Y = torch.randn(256, 4, generator=g)


def step(state, commit=True):
    idx = next(iter(state.sampler))
    state.optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(state.model(X[idx]), Y[idx])
    loss.backward()
    state.optimizer.step()
    if commit:
        state.step += 1
        state.save()
    return loss.item()


def shards(state):
    """This rank's local shards of model and optimizer, as plain tensors."""
    from torch.distributed.tensor import DTensor

    def local(t, _):
        return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()

    d = state.state_dict()
    return transfer.walk({"model": d["model"], "optimizer": d["optimizer"]}, "state", local)


def new_world(store, gen, rank, world, nodes):
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore(f"g{gen}", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    assert _mesh.current().rebuild(rank, world, nodes, None) is None


def worker(rank, port, out, ckpt):
    global RANK, WORLD_NOW
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    os.environ["LOCAL_RANK"] = str(rank % LOCAL)
    os.environ["LOCAL_WORLD_SIZE"] = str(LOCAL)
    RANK = rank
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    res = {}
    # Generation 1: both nodes train three steps from the same initial model.
    state = build(0)
    mesh = bftrainer.device_mesh()
    new_world(store, 1, rank, WORLD, ["a", "a", "b", "b"])
    for _ in range(3):
        step(state)
    res["replicas"] = mesh.get_group("replicate").size()
    # Node b is replaced by a newcomer (another initial model, no commit).
    if rank >= LOCAL:
        state = build(1)
    res["before"] = shards(state)
    sent = []
    orig = state._payload
    state._payload = lambda: (sent.append(rank), orig())[1]
    # Generation 2: the same mesh object, new groups under it (ranks renumbered).
    new_world(store, 2, rank, WORLD, ["a", "a", "c", "c"])
    transfer.sync(state, rank, WORLD, None, lambda w, what: w.wait())
    res["sent"] = list(sent)
    res["after"] = shards(state)
    res["committed"] = state.committed_step
    res["loss"] = step(state)
    res["next"] = shards(state)
    # A rollback with copy=True after the optimizer stepped: back to the commit.
    committed = shards(state)
    step(state, commit=False)
    state.restore(dirty=True)
    res["rolled"] = shards(state)
    res["committed_shards"] = committed
    # A sharded checkpoint by every rank, loaded below by a world of 2 (one node).
    state.write_checkpoint_sharded(ckpt)
    res["full"] = {k: v.full_tensor() for k, v in state.model.state_dict().items()}
    res["adam_full"] = {k: v["exp_avg"].full_tensor() for k, v in state.optimizer.state_dict()["state"].items()}
    torch.save(res, os.path.join(out, f"{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    if rank < LOCAL:  # the other world: node a alone
        WORLD_NOW = LOCAL
        new_world(store, 3, rank, LOCAL, ["a", "a"])
        state = build(7)
        state.load_checkpoint_sharded(ckpt)
        loaded = {
            "full": {k: v.full_tensor() for k, v in state.model.state_dict().items()},
            "adam_full": {k: v["exp_avg"].full_tensor() for k, v in state.optimizer.state_dict()["state"].items()},
            "step": state.step,
            "committed": state.committed_step,
        }
        torch.save(loaded, os.path.join(out, f"loaded{rank}.pt"))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch.distributed as dist

    out = str(tmp_path_factory.mktemp("sharded"))
    ckpt = os.path.join(out, "ckpt")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env = {k: v for k, v in env.items() if not k.startswith("BFT_")}
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(store.port), out, ckpt], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    except subprocess.TimeoutExpired:
        # A hang: every rank's stacks (faulthandler, below) and output say where.
        for p in procs:
            p.kill()
        outputs = [p.communicate()[0] for p in procs]
        pytest.fail("a rank hung for 240 s:\n" + "\n".join(f"rank {r}:\n{o[-6000:]}" for r, o in enumerate(outputs)))
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r}:\n{outputs[r][-3000:]}"
    res = [torch.load(os.path.join(out, f"{r}.pt"), weights_only=False) for r in range(WORLD)]
    loaded = [torch.load(os.path.join(out, f"loaded{r}.pt"), weights_only=False) for r in range(LOCAL)]
    return res, loaded


def same(a, b):
    ta, tb = [], []
    transfer.walk(a, "a", lambda t, _: ta.append(t))
    transfer.walk(b, "b", lambda t, _: tb.append(t))
    return len(ta) == len(tb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(ta, tb))


def test_the_mesh_keeps_its_groups_across_worlds_and_sees_both_replicas(runs):
    res, _ = runs
    assert [r["replicas"] for r in res] == [2] * WORLD


def test_a_newcomer_node_gets_local_rank_is_shards_from_local_rank_i_only(runs):
    res, _ = runs
    for i in range(LOCAL):
        live, new = res[i], res[LOCAL + i]
        assert not same(new["before"]["model"], live["before"]["model"])
        assert same(new["after"], live["after"])
        assert same(live["after"], live["before"])
        assert new["committed"] == live["committed"] == 3
    # Each live local rank sent its own shards; nothing was gathered on one rank.
    assert [r["sent"] for r in res] == [[0], [1], [], []]
    # The two shards differ: local rank 1 did not get local rank 0's.
    assert not same(res[0]["after"]["model"], res[1]["after"]["model"])


def test_after_the_transfer_the_replicas_train_alike(runs):
    res, _ = runs
    for i in range(LOCAL):
        assert same(res[i]["next"], res[LOCAL + i]["next"])


def test_a_dirty_rollback_restores_the_committed_shards(runs):
    res, _ = runs
    for r in res:
        assert same(r["rolled"], r["committed_shards"])


def test_a_sharded_checkpoint_loads_under_another_world_size(runs):
    res, loaded = runs
    for l in loaded:
        assert same(l["full"], res[0]["full"])
        assert same(l["adam_full"], res[0]["adam_full"])
        assert l["step"] == l["committed"] == 4


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(200, exit=True)
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
