"""Step time of FSDP2 HSDP under the library against plain FSDP2, on the CPU (gloo), in
one run on this machine (docs/benchmarks.md, "HSDP step time").

examples/train_hsdp.py, the same model, data and per-rank batch, with 2 workers:
- plain: torch's own ``init_device_mesh`` (1 x 2), two processes started directly
  (env:// rendezvous), ``--plain``;
- library: ``bft-run --local 1 --nproc-per-node 2`` on ``bftrainer.device_mesh()``
  (one replica of two shards; ``State.commit()`` each step).
Each step's time is the gap between rank 0's consecutive loss-log lines (both loops
read the loss on the host each step); the median over the steps after the first 10.
Runs alternate, ROUNDS of each; prints each round's medians and their ratio, and the
median ratio. A ratio, never a timed assert: the figure depends on the machine.

    python wrappers/python/bench/hsdp_bench.py [--bft-run target/debug/bft-run] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_bench import REPO, Munged, env_with_lib, free_port  # noqa: E402

TRAIN = os.path.join(REPO, "wrappers", "python", "examples", "train_hsdp.py")


def step_ms(path: str) -> float:
    ts = [float(line.split()[4]) for line in open(path)]
    gaps = [b - a for a, b in zip(ts, ts[1:])][10:]
    return statistics.median(gaps) * 1000


def plain(py: str, model: list, d: str, i: int) -> float:
    log = os.path.join(d, f"plain{i}")
    port = free_port()
    procs = []
    for r in range(2):
        e = env_with_lib()
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2",
                 LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2")
        procs.append(subprocess.Popen([py, TRAIN, *model, "--plain", "--loss-log", log], env=e,
                                      stdout=subprocess.DEVNULL))
    for p in procs:
        if p.wait() != 0:
            sys.exit("the plain FSDP2 run failed")
    return step_ms(log)


def library(bft: str, py: str, model: list, d: str, i: int, munge: str) -> float:
    log = os.path.join(d, f"lib{i}")
    e = env_with_lib()
    e["BFT_MUNGE_SOCKET"] = munge
    e.pop("SLURM_JOB_ID", None)
    r = subprocess.run([bft, "--local", "1", "--nproc-per-node", "2", "--", py, TRAIN, *model, "--epochs", "1",
                        "--loss-log", log], env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=d)
    if r.returncode != 0:
        sys.exit("the library's HSDP run failed")
    return step_ms(log)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bft-run", default=os.path.join(REPO, "target", "debug", "bft-run"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150)
    a = ap.parse_args()
    batch, seq = 8, 64
    model = ["--dim", str(a.dim), "--layers", str(a.layers), "--seq", str(seq), "--batch", str(batch),
             "--samples", str(a.steps * batch * 2)]
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bft-hsdp-bench-") as d:
        m = Munged(d)
        try:
            ratios = []
            for i in range(a.rounds):
                p = plain(py, model, d, i)
                lib = library(a.bft_run, py, model, d, i, m.sock)
                ratios.append(lib / p)
                print(f"round {i + 1}: plain FSDP2 {p:.1f} ms, library HSDP {lib:.1f} ms, ratio {lib / p:.3f}",
                      flush=True)
        finally:
            m.stop()
    print(f"HSDP / plain FSDP2 step time, world 2 (1 x 2), CPU gloo, dim {a.dim}, {a.layers} layers, "
          f"{batch}x{seq} tokens per rank: median ratio {statistics.median(ratios):.3f} "
          f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)})", flush=True)


if __name__ == "__main__":
    main()
