"""The benchmark's baseline: the same model, data, batches and flat gradient
all-reduce as examples/train.py, in plain torch.distributed under torchrun (no
bftrainer runtime). A restart (torchrun --max-restarts) resumes from the last
checkpoint, as torchrun-based elastic training does on every membership change."""

import argparse
import os
import time

import torch
import torch.distributed as dist

from bftrainer.sampler import ElasticSampler

p = argparse.ArgumentParser()
p.add_argument("--samples", type=int, default=4096)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--timeline", default=None)
p.add_argument("--checkpoint", default=None, help="checkpoint file (resume from it)")
p.add_argument("--checkpoint-every", type=int, default=50)
args = p.parse_args()

import datetime

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
# A store key prefix per torchrun restart: keys of the previous round's ranks would
# otherwise send the restarted ranks to dead addresses (seen with torch 2.15).
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=rank == 0
                      and "TORCHELASTIC_RESTART_COUNT" not in os.environ, timeout=datetime.timedelta(seconds=60))
prefix = f"round{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=world)
g = torch.Generator().manual_seed(1234)
X = torch.randn(args.samples, 16, generator=g)
W_true = torch.randn(16, 1, generator=g)
Y = torch.tanh(X @ W_true) + 0.05 * torch.randn(args.samples, 1, generator=g)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1))
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
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
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
        flat = torch.cat([x.reshape(-1) for x in grads] + [torch.tensor([1.0])])
        flat[:-1].mul_(float(len(idx)))
        flat[-1] = float(len(idx))
        dist.all_reduce(flat)
        flat[:-1].div_(flat[-1])
        off = 0
        for q in params:
            n = q.numel()
            if q.grad is None:
                q.grad = flat[off : off + n].view_as(q).clone()
            else:
                q.grad.copy_(flat[off : off + n].view_as(q))
            off += n
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
