"""ElasticGroup: one group object across generations, aborted from another thread."""

import datetime
import os
import threading
import time

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed
mp = torch.multiprocessing




def _run_two(target, tmp_path):
    """Runs `target(rank, 2, store, out)` in two spawned processes; each must exit 0 (a
    bound of 120 s each, which only a hang reaches); returns their output lines."""

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, 2, str(tmp_path / "store"), str(tmp_path / "out"))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    return [(tmp_path / f"out.{r}").read_text().split("\n") for r in range(2)]

def _abort_while_waiting(grp, pending, lines):
    """Aborts `grp` 0.3 s into the wait of `pending` (an operation rank 1 never joins);
    records whether the wait failed with the abort's error well before gloo's timeout."""
    from bftrainer._groups import ABANDONED

    threading.Timer(0.3, lambda: grp.abort("peer 1 failed")).start()
    t0 = time.monotonic()
    try:
        pending.wait()
        lines.append("no error")
    except RuntimeError as e:
        lines.append(f"aborted {ABANDONED in str(e)} {time.monotonic() - t0 < 5}")

def _worker(rank: int, world: int, path: str, out: str) -> None:
    from bftrainer._groups import ABANDONED, ElasticGroup

    store = dist.FileStore(path, world)
    # A default group, as under the runtime (torch's logging wrapper asks it things
    # when a collective fails: below).
    dist.init_process_group("gloo", store=dist.PrefixStore("default", store), rank=rank, world_size=world)
    grp = ElasticGroup()
    lines = []
    # No generation yet: a world of one, collectives are the identity.
    t = torch.ones(2)
    grp.allreduce([t]).wait()
    lines.append(f"alone {grp.size()} {t.tolist()}")
    real = dist.ProcessGroupGloo(dist.PrefixStore("g1", store), rank, world, datetime.timedelta(seconds=60))
    grp.install(real, 1)
    t = torch.ones(2) * (rank + 1)
    grp.allreduce([t]).wait()
    lines.append(f"g1 {grp.rank()} {grp.size()} {t.tolist()}")
    if rank == 0:
        # Rank 1 never joins this all-reduce: without the abort it would wait for the
        # gloo timeout (60 s).
        _abort_while_waiting(grp, grp.allreduce_future(torch.ones(2)), lines)
        try:
            grp.allreduce([torch.ones(1)])
            lines.append("later: no error")
        except RuntimeError as e:
            lines.append(f"later {ABANDONED in str(e)}")
        # A script's own collective through torch's API: its logging wrapper turns the
        # failure into a ValueError (get_backend of a group outside torch's tables),
        # which the run wrapper must still take for a peer failure.
        from bftrainer.elastic import _is_peer_failure

        try:
            dist.all_reduce(torch.ones(1), group=grp)
            lines.append("script: no error")
        except Exception as e:  # noqa: BLE001 - which one is the point
            lines.append(f"script {_is_peer_failure(e)} {type(e).__name__}")
    store.add("aborted", 1)
    while store.add("aborted", 0) < world:
        time.sleep(0.01)
    old, works = grp.retire()
    # Rank 0's withheld all-reduce is still pending on the real group: handed back.
    lines.append(f"retired {old is real} {grp.size()} {len(works)}")
    real2 = dist.ProcessGroupGloo(dist.PrefixStore("g2", store), rank, world, datetime.timedelta(seconds=60))
    grp.install(real2, 2)
    t = torch.ones(2) * (rank + 1)
    grp.allreduce([t]).wait()
    lines.append(f"g2 {grp.generation} {t.tolist()}")
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(lines) + "\n")
    os._exit(0)  # rank 0's first group still holds a collective rank 1 never joined


def test_group_swaps_its_real_group_and_aborts_at_once(tmp_path):
    r0, r1 = _run_two(_worker, tmp_path)
    assert r0[0] == "alone 1 [1.0, 1.0]"
    assert r0[1] == "g1 0 2 [3.0, 3.0]" and r1[1] == "g1 1 2 [3.0, 3.0]"
    assert r0[2] == "aborted True True"
    assert r0[3] == "later True"
    assert r0[4] == "script True ValueError"
    assert r0[5] == "retired True 1 1" and r1[2] == "retired True 1 0"
    assert r0[6] == r1[3] == "g2 2 [3.0, 3.0]"


def _fsdp_worker(rank: int, world: int, path: str, out: str) -> None:
    from bftrainer._groups import ABANDONED, ElasticGroup

    store = dist.FileStore(path, world)
    grp = ElasticGroup("test:shard", rank, world)
    lines = []
    # Before a generation a group of more than one refuses collectives.
    try:
        grp.allreduce([torch.ones(1)])
        lines.append("early: no error")
    except RuntimeError as e:
        lines.append(f"early {'no generation yet' in str(e)}")
    real = dist.ProcessGroupGloo(dist.PrefixStore("g1", store), rank, world, datetime.timedelta(seconds=60))
    grp.install(real, 1)
    out_t = torch.empty(4)
    grp.all_gather_single(out_t, torch.ones(2) * (rank + 1)).wait()
    lines.append(f"gathered {out_t.tolist()}")
    piece = torch.empty(2)
    grp.reduce_scatter_single(piece, torch.arange(4.0) + rank).wait()
    lines.append(f"scattered {piece.tolist()}")
    # Ended operations are let go: the group holds none of 300 steps' worth (a gloo
    # reduce-scatter never says it completed; each was kept, with its tensors, and
    # scanned by every later collective of the generation).
    for _ in range(300):
        grp.all_gather_single(out_t, torch.ones(2)).wait()
        grp.reduce_scatter_single(piece, torch.ones(4)).wait()
    lines.append(f"held {len(grp._works)}")
    if rank == 0:
        # Rank 1 never joins: the reduce-scatter's wait (a blocking one in our thread)
        # must not keep the abort from failing it at once.
        _abort_while_waiting(grp, grp.reduce_scatter_single(torch.empty(2), torch.ones(4)), lines)
        store.set("done", "1")
    else:
        store.wait(["done"])  # alive meanwhile: its sockets stay open
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(lines) + "\n")
    os._exit(0)


def test_fsdp_collectives_give_the_real_results_and_abort_at_once(tmp_path):
    r0, r1 = _run_two(_fsdp_worker, tmp_path)
    assert r0[0] == r1[0] == "early True"
    assert r0[1] == r1[1] == "gathered [1.0, 1.0, 2.0, 2.0]"
    assert r0[2] == "scattered [1.0, 3.0]" and r1[2] == "scattered [5.0, 7.0]"
    assert r0[3] == r1[3] == "held 0"
    assert r0[4] == "aborted True True"
