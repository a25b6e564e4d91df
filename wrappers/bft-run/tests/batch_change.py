"""A global batch decided mid-run (issue 32, item 2) under `bft-run --local 2`: the
decision comes through `--batch-file` (what bftrainerd's `batch_now` is to a job under
Slurm), 32 -> 64 -> 48 samples per step with lr=linear, and a worker killed -9 after the
first change. Checks that every sample is used once in the epoch, that each step of the
committed lineage took the batch in force and its learning rate (0.05 * G / 32), that
the change came at one step for all ranks, and that the rollback kept it.

Usage: batch_change.py BFT_RUN_BINARY [TRAIN.PY OPTIONS...] (e.g. --ddp --accum 2)
"""

import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from faults import CHECK, REPO, TRAIN, Trace, munged, wait_while_running  # noqa: E402

SAMPLES = 6000
LR = 0.05


def lineage(log_dir):
    """Per step of the committed lineage (the highest generation that ran it): its
    generation, the rank-0 `B` line (global batch, lr) and the samples of all ranks."""
    b, s = {}, collections.defaultdict(lambda: collections.defaultdict(int))
    for name in os.listdir(log_dir):
        for line in open(os.path.join(log_dir, name)):
            p = line.split()
            if p and p[0] == "B":
                gen, step = int(p[1]), int(p[2])
                if gen >= b.get(step, (-1,))[0]:
                    b[step] = (gen, int(p[3]), float(p[4]))
            elif p and p[0] == "S":
                s[int(p[2])][int(p[1])] += len(p) - 5
    return {k: (g, batch, lr, s[k][g]) for k, (g, batch, lr) in b.items()}


def main():
    bft = sys.argv[1]
    # With --accum N (under --ddp) a step is N sampler batches, each of the global batch.
    accum = int(sys.argv[sys.argv.index("--accum") + 1]) if "--accum" in sys.argv else 1
    d = tempfile.mkdtemp(prefix="bft-batch-")
    os.mkdir(os.path.join(d, "munge"))
    mp, sock = munged(os.path.join(d, "munge"))
    env = dict(os.environ, BFT_MUNGE_SOCKET=sock, PYTHONPATH=os.path.join(REPO, "wrappers", "python", "src"),
               BFT_TRACE=os.path.join(d, "trace"), BFT_LR_RULE="linear")
    env.pop("SLURM_JOB_ID", None)
    batch_file, fast, logs = (os.path.join(d, n) for n in ("batch", "fast", "samples"))
    log_path = os.path.join(d, "bft-run.log")
    core = subprocess.Popen(
        [bft, "--local", "2", "--batch-file", batch_file, "--hang-timeout", "5", "--broken-timeout", "3", "--",
         sys.executable, TRAIN, "--samples", str(SAMPLES), "--global-batch", "32", "--epochs", "1",
         "--lr", str(LR), "--step-sleep", "0.05", "--fast-file", fast, "--log-dir", logs, *sys.argv[2:]],
        env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, cwd=d)
    trace = Trace(env["BFT_TRACE"])
    try:
        def wait_for(pred, what, timeout=240.0):
            return wait_while_running(trace, core, pred, what, timeout)

        def steps_at(batch):
            return lambda: os.path.isdir(logs) and sum(1 for v in lineage(logs).values() if v[1] == batch) >= 5

        wait_for(steps_at(32), "5 steps at 32")
        with open(batch_file + ".tmp", "w") as f:
            f.write("64\n")
        os.rename(batch_file + ".tmp", batch_file)
        wait_for(steps_at(64), "5 steps at 64")
        # kill -9 a worker of rank 1 in the middle of a step: the rollback keeps 64.
        gen_now = max(r[3] for r in trace.rows)
        victim = wait_for(lambda: next((r for r in trace.rows if r[3] == gen_now and r[4] == 1
                                        and r[5] == "step"), None), "a step of rank 1")
        os.kill(victim[2], signal.SIGKILL)
        wait_for(lambda: any(r[5] == "step" and r[3] > gen_now for r in trace.rows), "training after the kill")
        wait_for(steps_at(64), "steps at 64 after the kill")
        with open(batch_file + ".tmp", "w") as f:
            f.write("48\n")
        os.rename(batch_file + ".tmp", batch_file)
        wait_for(steps_at(48), "5 steps at 48")
        open(fast, "w").close()
        rc = core.wait(timeout=600)
        log = open(log_path).read()
        if rc != 0:
            raise AssertionError(f"the job failed (exit {rc}):\n{log[-3000:]}")
        sys.path.insert(0, CHECK)
        from check_samples import check

        res = check(logs, SAMPLES, 1)
        print(f"samples ok: {res}", flush=True)
        steps = lineage(logs)
        last = max(steps)
        order = []
        for k in range(1, last + 1):
            if k not in steps:
                raise AssertionError(f"step {k} has no B line")
            gen, batch, lr, n = steps[k]
            if abs(lr - LR * batch / 32) > 1e-12:
                raise AssertionError(f"step {k}: lr {lr} at global batch {batch}, expected {LR * batch / 32}")
            if k < last and n != batch * accum:
                raise AssertionError(f"step {k} (generation {gen}) took {n} samples, its batch is {batch}"
                                     f"{f' x {accum} micro-batches' if accum > 1 else ''}")
            if not order or order[-1][0] != batch:
                order.append((batch, k))
        if [b for b, _ in order] != [32, 64, 48]:
            raise AssertionError(f"batches in step order: {order}, expected 32, 64, 48 each from one step on")
        for b, k in order[1:]:
            if f"global batch {b} from step {k - 1}" not in log:
                raise AssertionError(f"rank 0 did not say that the batch became {b} after step {k - 1}")
        if not re.search(r"global batch decided by bftrainerd: 64", log):
            raise AssertionError("the coordinator did not log the decision")
        print(f"batches by first step: {order}", flush=True)
        print("BATCH OK", flush=True)
        return 0
    finally:
        if core.poll() is None:
            core.kill()
        mp.terminate()


if __name__ == "__main__":
    sys.exit(main())
