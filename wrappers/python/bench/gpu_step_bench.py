"""Step time and peak memory of the runtime's training paths beside torch's own, on one
device, in one run (issue 31's figures; docs/benchmarks.md, "Step time on one GPU").

A GPT-like decoder (``--size``: ``110m`` 135 M parameters, ``730m`` 780 M, ``tiny`` for a
CPU rehearsal) trains on random tokens, bf16 autocast and fused AdamW on CUDA (fp32 on
the CPU). The same model, batches and optimizer in each form:

- ``plain``: a plain loop, no torch.distributed (the baseline of the replicated forms);
- ``ddp``: torch's DistributedDataParallel, world size 1, started directly (env://);
- ``lib``: the library's flat path (``bftrainer.allreduce_gradients``, ``State.commit()``)
  under ``bft-run --local 1``;
- ``libddp``: ``bftrainer.DistributedDataParallel`` under ``bft-run --local 1``;
- ``fsdp``: plain FSDP2 (``fully_shard`` on a 1-rank mesh of torch's own), the baseline
  of ``libhsdp``;
- ``libhsdp``: ``fully_shard(..., mesh=bftrainer.device_mesh())`` under ``bft-run``;
- ``lib2``: two workers sharing the device over gloo (``--nproc-per-node 2``,
  ``BFT_BACKEND=gloo``), the flat path: the multi-worker path of one GPU; compared
  with the plain loop by samples per second (each worker takes ``--batch``).

Every form reads the loss on the host every ``--log-every`` steps (not every step: a
per-step read would hide a host wait the runtime adds). A form's step time is the wall
time of ``--steps`` steps after ``--warmup``, the device synchronised at both ends.
Forms alternate, ``--rounds`` rounds; the table gives each form's median and its ratio
to its baseline. Ratios, never a timed assert: the figures depend on the machine.

    python wrappers/python/bench/gpu_step_bench.py [--bft-run target/release/bft-run]
        [--size 110m] [--batch 4] [--seq 512] [--rounds 3] [--forms plain,lib,...] [--cpu]

bft-run needs munged: ``BFT_MUNGE_SOCKET`` if set (scripts/gpu-check sets it), else a
private munged is started here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SIZES = {  # d_model, layers, heads, vocabulary
    "tiny": (64, 2, 4, 256),
    "110m": (768, 12, 12, 32768),
    "730m": (1536, 24, 16, 32768),
}
FORMS = ["plain", "lib", "libddp", "ddp", "fsdp", "libhsdp", "lib2"]
BASELINES = {"plain": [], "lib": ["plain"], "libddp": ["plain", "ddp"], "ddp": ["plain"], "fsdp": [],
             "libhsdp": ["fsdp"], "lib2": ["plain"]}
UNDER_BFT_RUN = {"lib", "libddp", "libhsdp", "lib2"}


# -- the worker: one form's training loop ---------------------------------------------

def worker(a: argparse.Namespace) -> None:
    import torch

    form = a.worker
    dist = None
    if form in UNDER_BFT_RUN:
        import bftrainer

        dev = bftrainer.device()
    else:
        dev = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        if form in ("ddp", "fsdp"):
            import torch.distributed as dist

            dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    cuda = dev.type == "cuda"
    d, layers, heads, vocab = SIZES[a.size]

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, n, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, n, d))
            return x + self.mlp(self.ln2(x))

    class GPT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.pos = torch.nn.Parameter(torch.zeros(a.seq, d))
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.ln = torch.nn.LayerNorm(d)
            self.head = torch.nn.Linear(d, vocab, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.emb(x) + self.pos[: x.shape[1]]
            for blk in self.blocks:
                h = blk(h)
            return self.head(self.ln(h))

    torch.manual_seed(0)
    model = GPT().to(dev)
    params = sum(p.numel() for p in model.parameters())
    net = model
    if form == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
    elif form == "libddp":
        net = bftrainer.DistributedDataParallel(model)
    elif form in ("fsdp", "libhsdp"):
        from torch.distributed.fsdp import fully_shard

        if form == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(dev.type, (1,))
        else:
            mesh = bftrainer.device_mesh()
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)

    total = a.warmup + a.steps
    g = torch.Generator().manual_seed(1234)
    n = (total + 2) * a.batch * 2
    data = torch.randint(0, vocab, (n, a.seq + 1), generator=g).to(dev)

    def step(idx: list) -> torch.Tensor:
        x = data[idx]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            logits = net(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
        loss.backward()
        return loss

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    def report(t0: float, rank: int) -> None:
        ms = (time.perf_counter() - t0) / a.steps * 1000
        if cuda:
            peak = torch.cuda.max_memory_allocated(dev) / 2**20
        else:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if rank == 0:
            print(f"RESULT {form} ms={ms:.3f} peak_mb={peak:.1f} params={params} device={dev}", flush=True)

    if form not in UNDER_BFT_RUN:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(42)).tolist()
        t0 = 0.0
        for s in range(total):
            if s == a.warmup:
                sync()
                t0 = time.perf_counter()
            loss = step(perm[s * a.batch:(s + 1) * a.batch])
            opt.step()
            if (s + 1) % a.log_every == 0:
                loss.item()
        sync()
        report(t0, 0)
        if dist is not None:
            dist.destroy_process_group()
        return

    sampler = bftrainer.ElasticSampler(n, batch_size=a.batch, seed=42)
    state = bftrainer.State(model=model, optimizer=opt, sampler=sampler)

    @bftrainer.run
    def train(state) -> None:
        t0 = 0.0
        for idx in state.sampler:
            if state.step == a.warmup:
                sync()
                t0 = time.perf_counter()
            loss = step(idx)
            if form in ("lib", "lib2"):
                bftrainer.allreduce_gradients(model, len(idx))
            opt.step()
            state.commit()
            if state.step % a.log_every == 0:
                loss.item()
            if state.step >= total:
                break
        sync()
        report(t0, bftrainer.rank())

    train(state)


# -- the driver: forms in turn, rounds, the table ---------------------------------------

def run_form(form: str, a: argparse.Namespace, munge: str, d: str) -> tuple:
    py = sys.executable
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(REPO, "wrappers", "python", "src") + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("SLURM_JOB_ID", None)
    if a.cpu:
        e["CUDA_VISIBLE_DEVICES"] = ""
    args = [py, os.path.abspath(__file__), "--worker", form, "--size", a.size, "--batch", str(a.batch),
            "--seq", str(a.seq), "--warmup", str(a.warmup), "--steps", str(a.steps), "--log-every", str(a.log_every)]
    if form in UNDER_BFT_RUN:
        e["BFT_MUNGE_SOCKET"] = munge
        cmd = [a.bft_run, "--local", "1"]
        if form == "lib2":
            e["BFT_BACKEND"] = "gloo"
            cmd += ["--nproc-per-node", "2"]
        cmd += ["--", *args]
    else:
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                 LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        cmd = args
    log = os.path.join(d, f"{form}.log")
    with open(log, "w") as out:
        r = subprocess.run(cmd, env=e, stdout=out, stderr=subprocess.STDOUT, cwd=d, timeout=a.timeout)
    text = open(log).read()
    for line in text.splitlines():
        # Under bft-run a worker's lines come prefixed with its id ("[1.0] ").
        _, found, rest = line.partition(f"RESULT {form} ")
        if found:
            kv = dict(w.split("=", 1) for w in rest.split())
            return float(kv["ms"]), float(kv["peak_mb"]), int(kv["params"]), kv["device"]
    sys.exit(f"gpu_step_bench: form {form} failed (exit {r.returncode}); its last lines:\n"
             + "\n".join(text.splitlines()[-30:]))


def free_port() -> int:
    import socket

    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bft-run", default=os.path.join(REPO, "target", "release", "bft-run"))
    ap.add_argument("--size", choices=sorted(SIZES), default="110m")
    ap.add_argument("--batch", type=int, default=4, help="sequences per worker and step")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--cpu", action="store_true", help="hide CUDA: every form on the CPU (gloo)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one form's run may take")
    a = ap.parse_args()
    a.bft_run = os.path.abspath(a.bft_run)
    if a.worker:
        worker(a)
        return
    forms = [f for f in a.forms.split(",") if f]
    bad = [f for f in forms if f not in FORMS]
    if bad:
        sys.exit(f"gpu_step_bench: unknown form(s) {', '.join(bad)}; the forms are {', '.join(FORMS)}")
    if any(f in UNDER_BFT_RUN for f in forms) and not os.access(a.bft_run, os.X_OK):
        sys.exit(f"gpu_step_bench: no bft-run at {a.bft_run} (--bft-run)")
    results = {f: [] for f in forms}
    with tempfile.TemporaryDirectory(prefix="bft-gpu-step-") as d:
        munged = None
        munge = os.environ.get("BFT_MUNGE_SOCKET", "")
        if not munge and any(f in UNDER_BFT_RUN for f in forms):
            sys.path.insert(0, HERE)
            from elastic_bench import Munged

            munged = Munged(d)
            munge = munged.sock
        try:
            for i in range(a.rounds):
                for f in forms:
                    ms, peak, params, dev = run_form(f, a, munge, d)
                    results[f].append((ms, peak))
                    print(f"round {i + 1} {f}: {ms:.2f} ms/step, peak {peak:.0f} MB ({dev}, {params / 1e6:.1f} M parameters)",
                          flush=True)
        finally:
            if munged:
                munged.stop()
    print()
    print(f"size {a.size}, {a.batch}x{a.seq} tokens per worker and step, {a.rounds} round(s), "
          f"{'CPU' if a.cpu else 'the device each form chose'}")
    print(f"{'form':8} {'ms/step':>9} {'peak MB':>9}  against")
    med = {f: (statistics.median(m for m, _ in r), statistics.median(p for _, p in r)) for f, r in results.items()}
    for f in forms:
        ms, peak = med[f]
        vs = []
        for base in BASELINES[f]:
            if base not in med:
                continue
            bms, bpeak = med[base]
            if f == "lib2":
                # Two workers take twice the samples a step: samples per second.
                vs.append(f"{base}: {2 * bms / ms:.3f}x its samples/s, peak {peak / bpeak:.3f}x")
            else:
                vs.append(f"{base}: step {ms / bms:.3f}x, peak {peak / bpeak:.3f}x")
        vs = "; ".join(vs)
        print(f"{f:8} {ms:9.2f} {peak:9.0f}  {vs}")


if __name__ == "__main__":
    main()
