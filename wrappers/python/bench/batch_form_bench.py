"""A fixed global batch against the per-rank form at equal per-rank work. Target: the
global form within 2% of the per-rank form's step time.

By default both forms run alternately in one job (batch_form_worker.py under
``bft-run --local 2``): per round a block of steps of each form, the order swapped every
round, so that both see the same load; it prints each round's median steps and their
ratio. ``--separate-runs``: the earlier comparison, the same job (examples/train.py)
once with ``--batch B`` and once with ``--global-batch 2B``, alternating whole runs.

    python wrappers/python/bench/batch_form_bench.py [--bft-run target/debug/bft-run]
        [--batch 1024 --hidden 65536 --samples 40960 --block 8 --rounds 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TRAIN = os.path.join(REPO, "wrappers", "python", "examples", "train.py")
sys.path.insert(0, os.path.join(REPO, "wrappers", "bft-run", "tests"))


def median_step(bft: str, python: str, form: list, args: argparse.Namespace, d: str, env: dict) -> float:
    tl = os.path.join(d, "timeline")
    if os.path.exists(tl):
        os.unlink(tl)
    subprocess.run(
        [bft, "--local", "2", "--", python, TRAIN, "--samples", str(args.samples), "--epochs", "1",
         "--hidden", str(args.hidden), "--timeline", tl, *form],
        env=env, check=True, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    times = [float(line.split()[0]) for line in open(tl)]
    gaps = [b - a for a, b in zip(times, times[1:])][5:]  # the first steps warm up
    return statistics.median(gaps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bft-run", default=os.path.join(REPO, "target", "debug", "bft-run"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--batch", type=int, default=256, help="samples per rank and step")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=256 * 2 * 60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=8, help="steps per form and round (one job)")
    ap.add_argument("--separate-runs", action="store_true", help="alternate whole runs, one form each")
    ap.add_argument("--same", action="store_true", help="A/A check: the global form in both blocks")
    args = ap.parse_args()
    from faults import munged  # a private munged, as the runtime tests use

    d = tempfile.mkdtemp(prefix="bft-batch-form-")
    os.mkdir(os.path.join(d, "munge"))
    mp, sock = munged(os.path.join(d, "munge"))
    env = dict(os.environ, BFT_MUNGE_SOCKET=sock, PYTHONPATH=os.path.join(REPO, "wrappers", "python", "src"))
    env.pop("SLURM_JOB_ID", None)
    try:
        if not args.separate_runs:
            print(f"2 workers, {args.batch} samples each a step, hidden {args.hidden}, one job: "
                  f"{args.block} steps of each form per round; median step per block", flush=True)
            print(f"{'round':>8} {'per-rank batch':>13} {'global batch':>13} {'ratio':>7}", flush=True)
            worker = os.path.join(HERE, "batch_form_worker.py")
            subprocess.run(
                [args.bft_run, "--local", "2", "--", args.python, worker, "--world", "2", "--batch", str(args.batch),
                 "--hidden", str(args.hidden), "--samples", str(args.samples), "--block", str(args.block),
                 "--rounds", str(args.rounds)] + (["--same"] if args.same else []),
                env=env, check=True, cwd=d, stderr=subprocess.DEVNULL,
            )
            return
        print(f"2 workers, {args.batch} samples each a step, hidden {args.hidden}; median step time per run")
        print(f"{'round':>5} {'per-rank batch':>15} {'global batch':>13} {'ratio':>7}")
        ratios = []
        for r in range(args.rounds):
            per_rank = median_step(args.bft_run, args.python, ["--batch", str(args.batch)], args, d, env)
            glob = median_step(args.bft_run, args.python, ["--global-batch", str(2 * args.batch)], args, d, env)
            ratios.append(glob / per_rank)
            print(f"{r + 1:>5} {per_rank * 1e3:>12.2f} ms {glob * 1e3:>10.2f} ms {ratios[-1]:>7.3f}", flush=True)
        print(f"median ratio (global / per-rank): {statistics.median(ratios):.3f}")
    finally:
        mp.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
