"""The benchmark's torchft case: the same model, data and batch as examples/train.py,
one process per replica group, torchft's Manager and reconfigurable gloo process group
used plainly (its documented per-step calls: start_quorum, allreduce, should_commit).
Needs torchft (PyPI) and its Lighthouse; elastic_bench.py --torchft starts both."""

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from _job import flat_allreduce, job
from torch.distributed import ReduceOp
from torchft import Manager, ProcessGroupGloo

p = argparse.ArgumentParser()
p.add_argument("--samples", type=int, default=65536)
p.add_argument("--batch", type=int, default=256)
p.add_argument("--hidden", type=int, default=4096)
p.add_argument("--epochs", type=int, default=1000)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--timeline", default=None)
p.add_argument("--replica", type=int, required=True)
args = p.parse_args()

X, Y, model, opt = job(args.samples, args.hidden, args.lr)
params = list(model.parameters())

# The replica group's own store (torchrun would provide it).
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
timeout = datetime.timedelta(seconds=10)
manager = Manager(
    pg=ProcessGroupGloo(timeout=timeout),
    min_replica_size=1,
    load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), opt.load_state_dict(sd["opt"])),
    state_dict=lambda: {"model": model.state_dict(), "opt": opt.state_dict()},
    replica_id=f"replica{args.replica}",
    store_addr="127.0.0.1",
    store_port=store.port,
    rank=0,
    world_size=1,
    lighthouse_addr=os.environ["TORCHFT_LIGHTHOUSE"],
    timeout=timeout,
    quorum_timeout=timeout,
    connect_timeout=timeout,
)
timeline = open(args.timeline, "a", buffering=1) if args.timeline else None
rng = torch.Generator().manual_seed(args.replica)
steps = args.epochs * args.samples // args.batch
while manager.current_step() < steps:
    manager.start_quorum()
    idx = torch.randint(0, args.samples, (args.batch,), generator=rng)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
    # torchft's allreduce averages over the participants (equal batches here).
    flat_allreduce(params, 1, lambda t: manager.allreduce(t, reduce_op=ReduceOp.SUM).wait())
    if manager.should_commit():
        opt.step()
    if timeline:
        timeline.write(f"{__import__('time').time():.6f} {manager.current_step()} {manager.num_participants()} 0\n")
