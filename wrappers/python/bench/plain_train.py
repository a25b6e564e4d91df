"""The benchmark's baseline: the same model, data, batches and flat gradient
all-reduce as examples/train.py, in plain torch.distributed under torchrun (no
bftrainer runtime). A restart (torchrun --max-restarts) resumes from the last
checkpoint, as torchrun-based elastic training does on every membership change."""

import datetime
import os
import time

import torch
import torch.distributed as dist

from _job import flat_allreduce, job, restart_args
from bftrainer.sampler import ElasticSampler

args = restart_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
# A store key prefix per torchrun restart: keys of the previous round's ranks would
# otherwise send the restarted ranks to dead addresses (seen with torch 2.15). Under
# torchrun the agent holds the store (TORCHELASTIC_USE_AGENT_STORE=True); under
# bft-run --mode torchrun, as without a launcher, rank 0 does (as env:// decides).
agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=rank == 0
                      and not agent_store, timeout=datetime.timedelta(seconds=60))
prefix = f"round{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=world)
X, Y, model, opt = job(args.samples, args.hidden, args.lr)
sampler = ElasticSampler(args.samples, batch_size=args.batch, seed=42, world=lambda: (rank, world))
step = 0
if args.checkpoint and os.path.exists(args.checkpoint):
    d = torch.load(args.checkpoint, weights_only=False)
    model.load_state_dict(d["model"])
    opt.load_state_dict(d["optimizer"])
    sampler.load_state_dict(d["sampler"])
    step = d["step"]
timeline = open(args.timeline, "a", buffering=1) if args.timeline and rank == 0 else None
params = list(model.parameters())
while sampler.epoch < args.epochs:
    for idx in sampler:
        opt.zero_grad()
        if idx:
            torch.nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
        flat_allreduce(params, len(idx), dist.all_reduce)
        opt.step()
        step += 1
        if timeline:
            timeline.write(f"{time.time():.6f} {step} {world} 0\n")
        if args.checkpoint and rank == 0 and step % args.checkpoint_every == 0:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "sampler": sampler.state_dict(), "step": step}, tmp)
            os.replace(tmp, args.checkpoint)
dist.barrier()
if timeline:
    timeline.close()
# Tearing gloo down while the peer exits aborts now and then (SIGABRT, torch 2.15):
# the work is done, leave without it.
os._exit(0)
