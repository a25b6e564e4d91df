"""A real torch worker on the bftrainer library that reports what it sees: started by
bft-run, it takes its device (bftrainer.device()), runs one step in a generation and
writes $TEST_DIR/<worker id>.json with its torchrun-style variables (LOCAL_RANK,
LOCAL_WORLD_SIZE, RANK, WORLD_SIZE), CUDA_VISIBLE_DEVICES, and the library's choice of
device and backend."""

import json
import os

import torch

import bftrainer

dev = bftrainer.device()
model = torch.nn.Linear(2, 1).to(dev)
state = bftrainer.State(model=model)
NAMES = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "BFT_LOCAL_RANK", "RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES")


@bftrainer.run
def train(state):
    model.zero_grad()
    model(torch.ones(1, 2, device=dev)).sum().backward()
    bftrainer.allreduce_gradients(model, 1)
    state.commit()
    seen = {k: os.environ.get(k) for k in NAMES}
    seen.update(
        device=str(dev),
        backend=bftrainer.backend(),
        rank=bftrainer.rank(),
        world=bftrainer.world_size(),
        cuda=torch.cuda.is_available(),
    )
    path = os.path.join(os.environ["TEST_DIR"], bftrainer.worker_id() + ".json")
    with open(path, "w") as f:
        json.dump(seen, f)


train(state)
