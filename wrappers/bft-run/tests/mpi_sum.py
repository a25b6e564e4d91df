"""An MPI program for `bft-run --mode mpi` (tests/mpi.rs): an mpi4py allreduced sum
over a step budget, whatever the world's size, resumed from its own checkpoint.

Step s (1-based) allreduces (s * (rank + 1)) over the world and checks the result is
s * n(n+1)/2; the running total adds s, so the final total is budget(budget+1)/2
exactly when every step ran once. SIGUSR1 (bft-run stopping the world: mpirun
forwards it to every rank) or SIGTERM makes every rank agree to stop at the same
step; rank 0 saves the checkpoint and all exit 0. The program steps only up to the number in --limit-file
(the test raises it), saving when it starts holding there, so a change the test
makes lands at a known step whatever the machine's load. Rank 0 appends a JSON line
per step, per hold, per stop and per start to --log, with its time (`t`); the start
line has every rank's BFT_GLOBAL_BATCH (`batch`, null where unset) and
BFT_PROGRESS_FILE (`progress_file`). With --report-progress every rank calls
bftrainer.report_progress after each step (the one call a restarting mode's program
may add; only rank 0 writes), with `n` samples a step; --step-sleep S sleeps S
seconds after each step.
"""

import argparse
import json
import os
import signal
import sys
import time

from mpi4py import MPI

ap = argparse.ArgumentParser()
ap.add_argument("--ckpt", required=True)
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--limit-file", required=True)
ap.add_argument("--report-progress", action="store_true")
ap.add_argument("--step-sleep", type=float, default=0.0)
a = ap.parse_args()
if a.report_progress:
    import bftrainer

comm = MPI.COMM_WORLD
n, rank = comm.Get_size(), comm.Get_rank()
stop = [0]
for sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.__setitem__(0, 1))


def log(**kv):
    kv["t"] = time.time()
    if rank == 0:
        with open(a.log, "a") as f:
            f.write(json.dumps(kv) + "\n")


def save(step, total):
    if rank == 0:
        tmp = a.ckpt + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step, "total": total}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, a.ckpt)


def limit():
    try:
        with open(a.limit_file) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


state = None
if rank == 0 and os.path.exists(a.ckpt):
    with open(a.ckpt) as f:
        state = json.load(f)
state = comm.bcast(state or {"step": 0, "total": 0}, root=0)
step, total = state["step"], state["total"]
gen = os.environ.get("BFT_GENERATION", "?")
batches = comm.gather(os.environ.get("BFT_GLOBAL_BATCH"), root=0)
progress_files = comm.gather(os.environ.get("BFT_PROGRESS_FILE"), root=0)
log(start=True, world=n, step=step, gen=gen, host=MPI.Get_processor_name(), batch=batches,
    progress_file=progress_files)
holding = False
while step < a.steps:
    # Every rank stops at the same step once any was told to.
    if comm.allreduce(stop[0], op=MPI.MAX):
        save(step, total)
        log(stopped=True, world=n, step=step)
        sys.exit(0)
    lim = comm.bcast(limit() if rank == 0 else None, root=0)
    if step >= lim:
        if not holding:
            holding = True
            save(step, total)
            log(world=n, step=step, hold=True, gen=gen)
        time.sleep(0.05)
        continue
    holding = False
    s = step + 1
    got = comm.allreduce(s * (rank + 1), op=MPI.SUM)
    if got != s * n * (n + 1) // 2:
        print(f"rank {rank}: step {s} allreduced {got} in a world of {n}", file=sys.stderr)
        sys.exit(3)
    total += got // (n * (n + 1) // 2)
    step = s
    log(world=n, step=step, hold=False)
    if a.report_progress:
        bftrainer.report_progress(samples=step * n, steps=step, batch=n)
    if a.step_sleep:
        time.sleep(a.step_sleep)
save(step, total)
if rank == 0:
    print(f"final steps={step} total={total}", flush=True)
