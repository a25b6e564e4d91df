"""Elastic FSDP2 HSDP: a small transformer sharded over each node's workers, replicated
across nodes, on synthetic next-token data (fixed seed).

    bft-run --nproc-per-node 2 -- python train_hsdp.py --epochs 2

The model is wrapped once with torch's own ``fully_shard(..., mesh=bftrainer.device_mesh())``;
nodes join and leave whole, as replicas, and the mesh stays valid across generations.
"""

import time

T_START = time.time()  # before torch: a newcomer's start-up, split (--timings)

import argparse  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

import bftrainer  # noqa: E402

T_TORCH = time.time()

p = argparse.ArgumentParser()
p.add_argument("--samples", type=int, default=1536, help="sequences in the data set")
p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--seq", type=int, default=16)
p.add_argument("--dim", type=int, default=64)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--fast-file", default=None, help="no step sleep once this file exists")
p.add_argument("--stop-file", default=None,
               help="end at the first epoch boundary after this file exists (the ranks agree on it)")
p.add_argument("--log-dir", default=None, help="write each rank's samples per step here (for checking)")
p.add_argument("--loss-log", default=None, help="rank 0 appends 'step loss world gen' per step here")
p.add_argument("--bf16", action="store_true", help="FSDP2 mixed precision: bf16 parameters, fp32 reduction")
p.add_argument("--no-reshard", action="store_true", help="reshard_after_forward=False")
p.add_argument("--checkpointing", action="store_true", help="activation checkpointing of each block")
p.add_argument("--timings", action="store_true",
               help="print when the process started, torch was imported and the model built (stderr)")
p.add_argument("--plain", action="store_true", help="torch's own init_device_mesh, no bftrainer (a baseline)")
p.add_argument("--reference", type=int, default=0, metavar="WORLD",
               help="one process, no FSDP: the run of a static world of WORLD ranks (global batch WORLD * --batch)")
args = p.parse_args()

VOCAB = 64
g = torch.Generator().manual_seed(1234)
# Sequences that follow a fixed random bigram table: the loss can fall well below log(VOCAB).
table = torch.randint(0, VOCAB, (VOCAB,), generator=g)
start = torch.randint(0, VOCAB, (args.samples,), generator=g)
X = torch.empty(args.samples, args.seq + 1, dtype=torch.long)
X[:, 0] = start
for t in range(args.seq):
    noise = torch.rand(args.samples, generator=g) < 0.1
    X[:, t + 1] = torch.where(noise, torch.randint(0, VOCAB, (args.samples,), generator=g), table[X[:, t]])
T_DATA = time.time()


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, 4, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, args.dim)
        self.pos = torch.nn.Parameter(torch.zeros(args.seq, args.dim))
        self.blocks = torch.nn.ModuleList(Block(args.dim) for _ in range(args.layers))
        self.head = torch.nn.Linear(args.dim, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos[: x.shape[1]]
        for b in self.blocks:
            if args.checkpointing:
                h = torch.utils.checkpoint.checkpoint(b, h, use_reentrant=False)
            else:
                h = b(h)
        return self.head(h)


def whole_loss(m) -> float:
    with torch.no_grad():
        return sum(step_loss(list(range(i, min(i + 64, args.samples))), m).item() * min(64, args.samples - i)
                   for i in range(0, args.samples, 64)) / args.samples


def step_loss(idx, m=None):
    x = X[idx]
    logits = (m or model)(x[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))


if args.reference:
    # The same initial model, optimizer and sample order as a static world of
    # --reference ranks: each step's gradient is the mean over the global batch, as
    # FSDP's averaged reduction over ranks with equal slices gives it.
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sampler = bftrainer.ElasticSampler(args.samples, batch_size=args.batch * args.reference, seed=42,
                                       world=lambda: (0, 1))
    print(f"initial loss {whole_loss(model):.5f}", flush=True)
    while sampler.epoch < args.epochs:
        for idx in sampler:
            opt.zero_grad()
            step_loss(idx).backward()
            opt.step()
    print(f"final loss {whole_loss(model):.5f}", flush=True)
    raise SystemExit(0)

if args.plain:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (dist.get_world_size() // local, local), mesh_dim_names=("replicate", "shard"))
else:
    mesh = bftrainer.device_mesh()
T_MESH = time.time()

torch.manual_seed(0)
model = GPT()
kw = {"mesh": mesh, "reshard_after_forward": not args.no_reshard}
if args.bf16:
    kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for b in model.blocks:
    fully_shard(b, **kw)
fully_shard(model, **kw)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
if args.timings:
    import sys

    print(f"timings pid {os.getpid()} start {T_START:.6f} torch {T_TORCH:.6f} data {T_DATA:.6f} "
          f"mesh {T_MESH:.6f} model {time.time():.6f}", file=sys.stderr, flush=True)


if args.plain:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    perm = torch.randperm(args.samples, generator=torch.Generator().manual_seed(42)).tolist()
    per = args.batch * world
    t0, steps = None, 0
    losses = open(args.loss_log, "a", buffering=1) if args.loss_log and rank == 0 else None
    for s in range(args.samples // per):
        idx = perm[s * per + rank * args.batch : s * per + (rank + 1) * args.batch]
        if s == 3:
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = step_loss(idx)
        loss.backward()
        opt.step()
        steps += s >= 3
        if losses:
            # As the elastic loop's log: the loss read on the host each step.
            losses.write(f"{s + 1} {loss.item():.5f} {world} 0 {time.time():.6f}\n")
    if rank == 0 and t0 is not None:
        print(f"plain step {(time.perf_counter() - t0) / max(steps, 1) * 1000:.1f} ms", flush=True)
    raise SystemExit(0)

sampler = bftrainer.ElasticSampler(args.samples, batch_size=args.batch, seed=42)
state = bftrainer.State(model=model, optimizer=opt, sampler=sampler, last_loss=float("nan"))
log = None
if args.log_dir:
    os.makedirs(args.log_dir, exist_ok=True)
    log = open(os.path.join(args.log_dir, f"{bftrainer.worker_id()}.{os.getpid()}.log"), "a", buffering=1)
losses = open(args.loss_log, "a", buffering=1) if args.loss_log else None


def stop_here(state) -> bool:
    """At the start of an epoch: does any rank see --stop-file? All ranks reach this at
    the same point of the lineage (a newcomer or a rollback resumes from a commit, and
    no commit lies between an epoch's last step and this check), so they agree through
    one all-reduce on the library's group and all stop, or none."""
    if not args.stop_file or state.sampler.consumed != 0:
        return False
    import torch.distributed as dist

    seen = torch.tensor([1.0 if os.path.exists(args.stop_file) else 0.0])
    dist.all_reduce(seen, group=bftrainer.process_group())
    return seen.item() > 0


@bftrainer.run
def train(state):
    while state.sampler.epoch < args.epochs:
        if stop_here(state):
            break
        for idx in state.sampler:
            if log:
                log.write(f"S {bftrainer.generation()} {state.step + 1} {state.sampler.epoch} "
                          f"{bftrainer.rank()} {' '.join(map(str, idx))}\n")
            opt.zero_grad()
            # Every rank takes part in FSDP's collectives, even with an empty slice.
            loss = step_loss(idx if idx else [0]) * (1.0 if idx else 0.0)
            loss.backward()
            opt.step()
            if args.step_sleep and not (args.fast_file and os.path.exists(args.fast_file)):
                time.sleep(args.step_sleep)
            state.commit()
            if losses and bftrainer.rank() == 0:
                losses.write(f"{state.step} {loss.item():.5f} {bftrainer.world_size()} {bftrainer.generation()} "
                             f"{time.time():.6f}\n")
    final = whole_loss(model)
    if bftrainer.rank() == 0:
        print(f"final loss {final:.5f} after {state.step} steps, {state.samples} samples", flush=True)


train(state)
