"""A torchrun-style DDP script, as a user writes one for torchrun (no bftrainer
library): it reads torchrun's environment, resumes from its own checkpoint, saves one
when it gets SIGTERM (at a step boundary all ranks agree on) and at the end, and trains
a linear model to a fixed step budget. With --report-progress it makes the one call a
restarting mode's script may add, bftrainer.report_progress (bft-run measures the rate).

    ddp_torchrun.py --ckpt FILE --steps N --log DIR [--limit-file F] [--step-sleep S]

For the tests: every worker writes its environment to DIR/env-r{RESTART}-k{RANK}.json
on start; rank 0 appends JSON lines to DIR/progress ({"restart", "world", "step",
"hold"}) whenever the step or the hold changes; --limit-file holds a step number that
the ranks do not step past until it is raised (the test then changes the membership at
a known step). Rank 0 prints "final step=N loss=L" at the end.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ENV = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME", "BFT_GENERATION", "BFT_AGENT_SOCK", "BFT_GLOBAL_BATCH",
]

term = False


def on_term(signum, frame):
    global term
    term = True


def save(path, model, opt, step):
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def limit(path):
    if not path:
        return 1 << 30
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--limit-file", default="")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--report-progress", action="store_true",
                   help="the one library call a restarting mode's script may add: bftrainer.report_progress "
                        "after each step (bft-run then measures the job's rate)")
    a = p.parse_args()
    if a.report_progress:
        import bftrainer
    signal.signal(signal.SIGTERM, on_term)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rec = {k: os.environ.get(k) for k in ENV}
    rec["pid"] = os.getpid()
    with open(os.path.join(a.log, f"env-r{restart}-k{rank}.json"), "w") as f:
        json.dump(rec, f)

    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    w_true = torch.randn(8, 1, generator=g)
    y = x @ w_true + 0.01 * torch.randn(256, 1, generator=g)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    if os.path.exists(a.ckpt):
        ck = torch.load(a.ckpt)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
    ddp = DDP(model)
    # Each rank's shard of the data, all of it every step: the averaged gradient is
    # the full batch's whatever the world size.
    xs, ys = x[rank::world], y[rank::world]

    last = None

    def progress(hold):
        nonlocal last
        if rank == 0 and last != (step, hold):
            last = (step, hold)
            with open(os.path.join(a.log, "progress"), "a") as f:
                f.write(json.dumps({"restart": restart, "world": world, "step": step, "hold": hold}) + "\n")

    saved = step
    while step < a.steps:
        allowed = step < limit(a.limit_file)
        # One collective decides for every rank: stop (anyone got SIGTERM) and step
        # (everyone may).
        flags = torch.tensor([1.0 if term else 0.0, 0.0 if allowed else 1.0])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0] > 0:
            if rank == 0:
                save(a.ckpt, model, opt, step)
            finish()
            return 0
        if flags[1] > 0:
            if rank == 0 and saved != step:
                save(a.ckpt, model, opt, step)
                saved = step
            progress(True)
            time.sleep(0.05)
            continue
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(xs), ys)
        loss.backward()
        opt.step()
        step += 1
        if rank == 0 and step % 10 == 0:
            save(a.ckpt, model, opt, step)
            saved = step
        progress(False)
        if a.report_progress:
            bftrainer.report_progress(samples=step * len(x), steps=step, batch=len(x))
        if a.step_sleep:
            time.sleep(a.step_sleep)
    if rank == 0:
        save(a.ckpt, model, opt, step)
        with torch.no_grad():
            full = torch.nn.functional.mse_loss(model(x), y).item()
        print(f"final step={step} loss={full:.6f}", flush=True)
    finish()
    return 0


def finish():
    # Every rank at the end before any tears its connections down. Without it a
    # rank still in gloo's teardown when its peer had exited was seen to abort
    # ("terminate called without an active exception", signal 6), a failure
    # that bft-run, like torchrun, answers with a restart.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
