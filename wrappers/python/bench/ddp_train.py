"""The memory baseline: the same model, data and batches as examples/train.py in plain
torch.distributed DDP (gloo), two processes started directly (env://). Prints each
rank's peak RSS ("rss RANK MB") at the end."""

import argparse
import os
import resource

import torch
import torch.distributed as dist

from _job import job
from bftrainer.sampler import ElasticSampler

p = argparse.ArgumentParser()
p.add_argument("--samples", type=int, default=4096)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--hidden", type=int, default=64)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
X, Y, model, opt = job(args.samples, args.hidden, args.lr)
ddp = torch.nn.parallel.DistributedDataParallel(model)
sampler = ElasticSampler(args.samples, batch_size=args.batch, seed=42, world=lambda: (rank, world))
while sampler.epoch < args.epochs:
    for idx in sampler:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(X[idx]), Y[idx]) if idx else (ddp(X[:1]) * 0).sum()
        loss.backward()
        opt.step()
print(f"rss {rank} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}", flush=True)
dist.barrier()
os._exit(0)
