"""What the benchmark's twin scripts (plain_train.py, torchft_train.py, mpi_train.py)
share with examples/train.py: the same synthetic data, model and optimizer (the example
itself stays self-contained, to be copied), and the flat gradient all-reduce; and the
command line of the two that restart from a checkpoint (plain_train.py under torchrun
mode, mpi_train.py under MPI mode)."""

import argparse
from typing import Callable, List, Tuple

import torch


def restart_args() -> argparse.Namespace:
    """The command line of the scripts that restart from a checkpoint at each change."""
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--timeline", default=None)
    p.add_argument("--checkpoint", default=None, help="checkpoint file (resume from it)")
    p.add_argument("--checkpoint-every", type=int, default=50)
    return p.parse_args()


def job(samples: int, hidden: int, lr: float) -> Tuple[torch.Tensor, torch.Tensor, torch.nn.Module, torch.optim.Optimizer]:
    g = torch.Generator().manual_seed(1234)
    X = torch.randn(samples, 16, generator=g)
    W_true = torch.randn(16, 1, generator=g)
    Y = torch.tanh(X @ W_true) + 0.05 * torch.randn(samples, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    return X, Y, model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def flat_allreduce(params: List[torch.nn.Parameter], n_local: int, reduce: Callable[[torch.Tensor], None]) -> None:
    """Average the gradients weighted by each rank's sample count with one call of
    ``reduce`` (a sum) on a flat buffer, as bftrainer.allreduce_gradients does."""
    grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
    flat = torch.cat([x.reshape(-1) for x in grads] + [torch.tensor([1.0])])
    flat[:-1].mul_(float(n_local))
    flat[-1] = float(n_local)
    reduce(flat)
    if flat[-1] > 0:
        flat[:-1].div_(flat[-1])
    off = 0
    for q in params:
        n = q.numel()
        if q.grad is None:
            q.grad = flat[off : off + n].view_as(q).clone()
        else:
            q.grad.copy_(flat[off : off + n].view_as(q))
        off += n
