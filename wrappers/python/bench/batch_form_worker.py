"""The worker of batch_form_bench.py (under ``bft-run --local W``): one job that
alternates the two forms of a step at equal per-rank work, so both see the same
machine load: per round, a block of --block steps with ``ElasticSampler(batch_size=B)``
and one with ``ElasticSampler(global_batch=W*B)`` (the order swapped every round), each
step the same code otherwise (forward, backward, ``allreduce_gradients``, optimizer
step, ``state.commit()``). Rank 0 prints, per round, the median step of each block and
their ratio (global / per-rank).
"""

import argparse
import statistics
import time

import torch

import bftrainer

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, required=True, help="samples per rank and step")
p.add_argument("--hidden", type=int, required=True)
p.add_argument("--samples", type=int, required=True)
p.add_argument("--block", type=int, default=8, help="steps per form and round")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--warmup", type=int, default=3, help="steps of each form before the first round")
p.add_argument("--world", type=int, required=True,
               help="workers of the job (bft-run --local W): the global form's batch is W*B, fixed before the "
                    "first generation, when bftrainer.world_size() still says 1")
p.add_argument("--same", action="store_true",
               help="A/A check: both blocks use the global form (the ratio shows the bench's own bias)")
a = p.parse_args()

dev = bftrainer.device()
g = torch.Generator().manual_seed(1234)
X = torch.randn(a.samples, 16, generator=g).to(dev)
Y = torch.tanh(X @ torch.randn(16, 1, generator=g).to(dev))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, a.hidden), torch.nn.ReLU(), torch.nn.Linear(a.hidden, 1)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
W = a.world
forms = {
    "per-rank": bftrainer.ElasticSampler(a.samples, global_batch=W * a.batch, seed=42) if a.same
    else bftrainer.ElasticSampler(a.samples, batch_size=a.batch, seed=42),
    "global": bftrainer.ElasticSampler(a.samples, global_batch=W * a.batch, seed=42),
}
state = bftrainer.State(model=model, optimizer=opt, sampler=forms["global"])


def step(sampler) -> float:
    t = time.perf_counter()
    if sampler.remaining() < W * a.batch:  # whole steps only: both forms take W*B
        sampler.next_epoch()
    idx = sampler.take()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(X[idx]), Y[idx])
    loss.backward()
    bftrainer.allreduce_gradients(model, len(idx))
    opt.step()
    state.commit()
    return time.perf_counter() - t


@bftrainer.run
def train(state):
    if bftrainer.world_size() != W:
        raise SystemExit(f"--world {W}, but the generation has {bftrainer.world_size()} workers")
    if W * a.batch > a.samples:
        raise SystemExit("--samples must hold one step of every form")
    for s in forms.values():
        state.sampler = s
        for _ in range(a.warmup):
            step(s)
    ratios = []
    for r in range(a.rounds):
        order = ["per-rank", "global"] if r % 2 == 0 else ["global", "per-rank"]
        med = {}
        for name in order:
            # The State holds the sampler that steps, as in a script of either form.
            state.sampler = forms[name]
            med[name] = statistics.median(step(forms[name]) for _ in range(a.block))
        ratios.append(med["global"] / med["per-rank"])
        if bftrainer.rank() == 0:
            print(f"round {r + 1:>2} {med['per-rank'] * 1e3:>10.1f} ms {med['global'] * 1e3:>10.1f} ms "
                  f"{ratios[-1]:>7.3f}", flush=True)
    if bftrainer.rank() == 0:
        print(f"median ratio (global / per-rank) over {a.rounds} rounds: {statistics.median(ratios):.3f}", flush=True)


train(state)
