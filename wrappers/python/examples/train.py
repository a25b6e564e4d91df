"""A complete elastic training script: a small MLP on synthetic data (fixed seed).

    bft-run -- python train.py --epochs 3

Every worker runs this file. bft-run grows and shrinks the world between steps;
``bftrainer.run`` rebuilds the process group, newcomers receive the state, and the
sampler makes sure every sample is used exactly once per epoch.
"""

import argparse
import contextlib
import os
import sys
import time

import torch

import bftrainer

p = argparse.ArgumentParser()
p.add_argument("--samples", type=int, default=4096, help="dataset size")
p.add_argument("--batch", type=int, default=32, help="per-rank batch size")
p.add_argument("--global-batch", type=int, default=None,
               help="samples per step whatever the world (instead of --batch): results do not depend on the nodes lent")
p.add_argument("--batch-at", action="append", default=[], metavar="STEP:BATCH",
               help="with --global-batch: from step STEP on, a global batch of BATCH, taken as a batch bftrainerd "
                    "decided (learning-rate rule included): a static run replays an elastic run's decisions")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--stop-at", type=int, default=0, metavar="STEP",
               help="end after step STEP: a prefix of the run (a static reference for an elastic run's changes)")
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
               help="of the data and the model: in float64 the order of a step's sums (other world sizes) "
                    "no longer shows in thousands of steps (the live reproducibility test)")
p.add_argument("--hidden", type=int, default=64, help="width of the hidden layer")
p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (slow the job down for demos)")
p.add_argument("--sample-sleep", type=float, default=0.0,
               help="extra seconds per sample this rank takes in a step: compute that shrinks as nodes join "
                    "(with --step-sleep, the step time Saxena's model assumes: synchronisation plus compute)")
p.add_argument("--data-dir", default=None,
               help="keep the data set as a file here and read it through a DataLoader with worker processes")
p.add_argument("--loader-workers", type=int, default=2, help="the DataLoader's worker processes (with --data-dir)")
p.add_argument("--fast-file", default=None,
               help="once this file exists, steps no longer sleep (a test's faults are over: run out the epoch)")
p.add_argument("--log-dir", default=None, help="write each rank's samples per step here (for checking)")
p.add_argument("--checkpoint-dir", default=None, help="checkpoint here every --checkpoint-every commits")
p.add_argument("--checkpoint-every", type=int, default=0)
p.add_argument("--timeline", default=None, help="rank 0 appends 'time step world generation' per step here")
p.add_argument("--ddp", action="store_true", help="train through bftrainer.DistributedDataParallel (torch's DDP)")
p.add_argument("--accum", type=int, default=1, help="with --ddp: micro-batches per step (no_sync() on all but the last)")
p.add_argument("--report-rss", action="store_true", help="every rank prints its peak RSS at the end (benchmarks)")
args = p.parse_args()
batch_at = {}
for a in args.batch_at:
    step, _, batch = a.partition(":")
    if not (step.isdigit() and batch.isdigit() and int(step) >= 1 and int(batch) >= 1 and args.global_batch):
        p.error(f"--batch-at {a!r}: expected STEP:BATCH, two positive whole numbers, with --global-batch")
    batch_at[int(step)] = int(batch)

# This worker's device: the GPU of its LOCAL_RANK (NCCL), else the CPU (gloo).
dev = bftrainer.device()

# The data: y = a nonlinear function of x, the same on every worker (fixed seed).
g = torch.Generator().manual_seed(1234)
X = torch.randn(args.samples, 16, generator=g)
W_true = torch.randn(16, 1, generator=g)
Y = torch.tanh(X @ W_true) + 0.05 * torch.randn(args.samples, 1, generator=g)
dtype = getattr(torch, args.dtype)
X, Y = X.to(dev, dtype), Y.to(dev, dtype)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1)).to(dev, dtype)
# With --ddp, torch's DDP on the library's group: built once, valid in every generation.
net = bftrainer.DistributedDataParallel(model) if args.ddp else model
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
if args.global_batch:
    sampler = bftrainer.ElasticSampler(args.samples, global_batch=args.global_batch, seed=42)
else:
    sampler = bftrainer.ElasticSampler(args.samples, batch_size=args.batch, seed=42)
state = bftrainer.State(
    model=model,
    optimizer=opt,
    sampler=sampler,
    checkpoint_dir=args.checkpoint_dir,
    checkpoint_every=args.checkpoint_every,
    last_loss=float("nan"),
)

class FileRows(torch.utils.data.Dataset):
    """The data set as a file of float32 rows (16 inputs, 1 target), read per sample."""

    def __init__(self, path: str, n: int) -> None:
        self.path, self.n, self.rows = path, n, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        import numpy as np

        if self.rows is None:  # opened in each DataLoader worker process
            self.rows = np.memmap(self.path, dtype=np.float32, mode="r", shape=(self.n, 17))
        return torch.from_numpy(np.array(self.rows[i]))


loader = None
if args.data_dir:
    os.makedirs(args.data_dir, exist_ok=True)
    path = os.path.join(args.data_dir, f"rows-{args.samples}.f32")
    if not os.path.exists(path):
        # Every worker may write it at once: the same bytes, renamed into place.
        tmp = f"{path}.{os.getpid()}"
        torch.cat([X, Y], 1).to("cpu", torch.float32).numpy().tofile(tmp)
        os.replace(tmp, path)
    loader = bftrainer.ElasticDataLoader(FileRows(path, args.samples), sampler,
                                         num_workers=args.loader_workers, prefetch_factor=4)


def steps():
    """(this rank's indices, their rows from the file or None) for each step."""
    if loader is None:
        for idx in state.sampler:
            yield idx, None
    else:
        yield from loader

with torch.no_grad():
    print(f"initial loss {torch.nn.functional.mse_loss(model(X), Y).item():.5f}", flush=True)

log = None
if args.log_dir:
    os.makedirs(args.log_dir, exist_ok=True)
    log = open(os.path.join(args.log_dir, f"{bftrainer.worker_id()}.{os.getpid()}.log"), "a", buffering=1)

timeline = open(args.timeline, "a", buffering=1) if args.timeline else None


def ddp_step(chunk):
    """One step of --ddp: each micro-batch's mean loss, divided by their number, as a
    plain DDP script with gradient accumulation does; torch's DDP reduces the
    gradients during the last backward (the others run under no_sync())."""
    opt.zero_grad()
    loss_sum, n = 0.0, 0
    for j, idx in enumerate(chunk):
        last = j == len(chunk) - 1
        with (contextlib.nullcontext() if last else net.no_sync()):
            out = net(X[idx])
            # An empty slice (the end of an epoch) still runs backward: every rank
            # must reach the reduction; it adds nothing.
            loss = torch.nn.functional.mse_loss(out, Y[idx]) if idx else out.sum() * 0.0
            (loss / len(chunk)).backward()
        loss_sum += loss.item() * len(idx)
        n += len(idx)
    opt.step()
    return loss_sum, n


def log_batch(state):
    """Rank 0 logs the step's global batch and learning rate (a batch bftrainerd decides)."""
    if bftrainer.rank() == 0 and state.sampler.global_batch:
        log.write(f"B {bftrainer.generation()} {state.step + 1} {state.sampler.global_batch} "
                  f"{opt.param_groups[0]['lr']!r}\n")


def take_decided_batch(state):
    """--batch-at: the batch that starts at the next step, applied as the library applies
    a batch bftrainerd decided when a generation is entered (bftrainer.batch.apply: the
    sampler's global batch and the job's lr= rule, BFT_LR_RULE), and committed. For a
    static run: in an elastic one each new generation applies bftrainerd's decision."""
    batch = batch_at.get(state.step + 1)
    if batch is not None and bftrainer.batch.apply(state, batch) and state.committed_step >= 0:
        state.save()


def end_step(state, n):
    """The end of a step in either loop (``n``: the samples this rank took): the step
    and sample sleeps (until --fast-file), the commit, the timeline."""
    pause = args.step_sleep + args.sample_sleep * n
    if pause and not (args.fast_file and os.path.exists(args.fast_file)):
        time.sleep(pause)
    state.commit()
    take_decided_batch(state)
    if timeline and bftrainer.rank() == 0:
        timeline.write(f"{time.time():.6f} {state.step} {bftrainer.world_size()} {bftrainer.generation()}\n")


def more(state):
    """Steps are left: epochs, and steps before --stop-at."""
    return state.sampler.epoch < args.epochs and not (args.stop_at and state.step >= args.stop_at)


def end_epoch(state, epoch_loss, epoch_n):
    if epoch_n:
        state.last_loss = epoch_loss / epoch_n
    if bftrainer.rank() == 0:
        print(f"epoch {state.sampler.epoch} done at step {state.step}, world {bftrainer.world_size()}, "
              f"rank-0 loss {state.last_loss:.4f}", flush=True)


@bftrainer.run
def train(state):
    take_decided_batch(state)
    if args.ddp:
        while more(state):
            epoch_loss, epoch_n, chunk = 0.0, 0, []
            for idx in state.sampler:
                chunk.append(idx)
                if len(chunk) < args.accum and state.sampler.remaining() > 0:
                    continue
                if log:
                    log.write(f"S {bftrainer.generation()} {state.step + 1} {state.sampler.epoch} "
                              f"{bftrainer.rank()} {' '.join(str(i) for c in chunk for i in c)}\n")
                    log_batch(state)
                loss_sum, n = ddp_step(chunk)
                chunk = []
                epoch_loss += loss_sum
                epoch_n += n
                end_step(state, n)
                if not more(state):
                    break
            end_epoch(state, epoch_loss, epoch_n)
    while more(state):
        epoch_loss, epoch_n = 0.0, 0
        for idx, rows in steps():
            if log:
                # Written before the step: the checker keeps, for each step, the
                # samples of the last generation that ran it (the committed one).
                log.write(f"S {bftrainer.generation()} {state.step + 1} {state.sampler.epoch} "
                          f"{bftrainer.rank()} {' '.join(map(str, idx))}\n")
                log_batch(state)
            opt.zero_grad()
            if idx:
                x, y = (X[idx], Y[idx]) if rows is None else (rows[:, :16].to(dev, dtype), rows[:, 16:].to(dev, dtype))
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                epoch_loss += loss.item() * len(idx)
                epoch_n += len(idx)
                if log:
                    # This rank's share of the step's loss (before the update): the
                    # checker sums the ranks of the committed run of each step.
                    log.write(f"L {bftrainer.generation()} {state.step + 1} {bftrainer.rank()} "
                              f"{loss.item() * len(idx)!r} {len(idx)}\n")
            bftrainer.allreduce_gradients(model, len(idx))
            opt.step()
            end_step(state, len(idx))
            if not more(state):
                break
        end_epoch(state, epoch_loss, epoch_n)
    # The loss of the final model on the whole data set, the same on every rank (in
    # batches: a wide model's activations of the whole set would not fit).
    with torch.no_grad():
        final = sum(
            torch.nn.functional.mse_loss(model(X[i : i + args.batch]), Y[i : i + args.batch], reduction="sum").item()
            for i in range(0, len(X), args.batch)
        ) / len(X)
    if bftrainer.rank() == 0:
        print(f"final loss {final:.5f} after {state.step} steps, {state.samples} samples", flush=True)
    if args.report_rss:
        import resource

        print(f"rss {bftrainer.rank()} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}", flush=True)


train(state)
