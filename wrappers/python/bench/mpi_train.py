"""The benchmark's MPI program (elastic_bench.py, under `bft-run --mode mpi`): the same
model, data, batches and flat gradient all-reduce as plain_train.py, with the
all-reduce over MPI (mpi4py) instead of gloo. It resumes from its checkpoint (rank 0
reads it and broadcasts it, as tests/mpi_sum.py does), writes one every
--checkpoint-every steps, and stops on SIGUSR1 (bft-run stopping the world: mpirun
forwards it to every rank) or SIGTERM: every rank stops after the same step and rank 0
saves, so a stopped world loses no step."""

import os
import signal
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

from _job import flat_allreduce, job, restart_args
from bftrainer.sampler import ElasticSampler

args = restart_args()

comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
gen = int(os.environ.get("BFT_GENERATION", "0"))
stop = [0.0]
for sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.__setitem__(0, 1.0))

X, Y, model, opt = job(args.samples, args.hidden, args.lr)
sampler = ElasticSampler(args.samples, batch_size=args.batch, seed=42, world=lambda: (rank, world))
state = None
if rank == 0 and args.checkpoint and os.path.exists(args.checkpoint):
    state = torch.load(args.checkpoint, weights_only=False)
state = comm.bcast(state, root=0)
step = 0
if state is not None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sampler.load_state_dict(state["sampler"])
    step = state["step"]
del state


def save() -> None:
    if rank == 0 and args.checkpoint:
        tmp = args.checkpoint + ".tmp"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "sampler": sampler.state_dict(), "step": step}, tmp)
        os.replace(tmp, args.checkpoint)


params = list(model.parameters())
# The gradient and one more element, the ranks' stop flags: the step's one collective
# also tells every rank whether any was told to stop (mpi_sum.py spends an allreduce of
# its own on that).
buf = np.empty(sum(q.numel() for q in params) + 2, dtype=np.float32)
stopping = [False]


def reduce(flat: torch.Tensor) -> None:
    buf[:-1] = flat.numpy()
    buf[-1] = stop[0]
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    flat.copy_(torch.from_numpy(buf[:-1]))
    stopping[0] = buf[-1] > 0


timeline = open(args.timeline, "a", buffering=1) if args.timeline and rank == 0 else None
while sampler.epoch < args.epochs:
    for idx in sampler:
        opt.zero_grad()
        if idx:
            torch.nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
        flat_allreduce(params, len(idx), reduce)
        opt.step()
        step += 1
        if timeline:
            timeline.write(f"{time.time():.6f} {step} {world} {gen}\n")
        if stopping[0]:
            save()
            sys.exit(0)
        if step % args.checkpoint_every == 0:
            save()
comm.Barrier()
