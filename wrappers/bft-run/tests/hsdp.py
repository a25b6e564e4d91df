"""HSDP under the elastic runtime, with real torch workers (FSDP2 on gloo, CPU).

    python hsdp.py BFT_RUN_BINARY

examples/train_hsdp.py (a small transformer under ``fully_shard(..., mesh=
bftrainer.device_mesh())``) runs under ``bft-run --local 2 --nproc-per-node 2``: two
replicas of two workers. Then, one after the other, each once the job trains again: a
third node (agent) joins; that node leaves on SIGTERM; a worker of rank >= 1 is killed
-9 in the middle of a step (its agent restarts it; its local rank receives its shards
from a live replica). Checked: the job finishes (exit 0), every sample is used exactly
once per epoch, and the loss falls (the last logged loss under half the first).
Prints "HSDP OK" at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from faults import CHECK, REPO, Trace, munged

TRAIN = os.path.join(REPO, "wrappers", "python", "examples", "train_hsdp.py")
SAMPLES, BATCH = 24576, 4


def main() -> int:
    bft = sys.argv[1]
    d = tempfile.mkdtemp(prefix="bft-hsdp-")
    os.mkdir(os.path.join(d, "munge"))
    mp, sock = munged(os.path.join(d, "munge"))
    env = dict(os.environ, BFT_MUNGE_SOCKET=sock, PYTHONPATH=os.path.join(REPO, "wrappers", "python", "src"),
               BFT_TRACE=os.path.join(d, "trace"))
    env.pop("SLURM_JOB_ID", None)
    log_path, coord_file, loss = os.path.join(d, "bft-run.log"), os.path.join(d, "coord"), os.path.join(d, "loss")
    args = [bft, "--local", "2", "--nproc-per-node", "2", "--hang-timeout", "10", "--broken-timeout", "3",
            "--coord-file", coord_file, "--", sys.executable, TRAIN, "--samples", str(SAMPLES), "--batch", str(BATCH),
            "--epochs", "1", "--step-sleep", "0.02", "--log-dir", os.path.join(d, "samples"), "--loss-log", loss]
    core = subprocess.Popen(args, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, cwd=d)
    trace = Trace(env["BFT_TRACE"])
    extra = None
    ok = False
    try:
        def wait_for(pred, what: str, timeout: float = float(os.environ.get("HSDP_WAIT", "300"))):
            t = time.monotonic()
            while True:
                trace.poll()
                r = pred()
                if r:
                    return r
                if core.poll() is not None:
                    raise AssertionError(f"the job ended while waiting for {what}")
                if time.monotonic() - t > timeout:
                    raise AssertionError(f"waited {timeout:.0f} s for {what}")
                time.sleep(0.02)

        def steps_after(gen: int, at: float):
            return any(x[5] == "step" and x[3] > gen and x[0] > at for x in trace.rows) or any(
                x[5] == "entered" and x[3] > gen and x[0] > at for x in trace.rows)

        def gen_now() -> int:
            return max(x[3] for x in trace.rows)

        wait_for(lambda: os.path.exists(coord_file) and open(coord_file).read().endswith("\n"), "the coordinator")
        addr, job, run = open(coord_file).read().split()
        wait_for(lambda: os.path.exists(loss) and os.path.getsize(loss) > 0, "the first step")
        # A third node joins (stop-free: the others train while it starts).
        g, at = gen_now(), time.time()
        extra = subprocess.Popen([bft, "--agent", "--coord", addr, "--coord-job", job, "--coord-run", run,
                                  "--node-name", "extra0", "--nproc-per-node", "2"],
                                 env=env, stdout=open(log_path + ".extra", "w"), stderr=subprocess.STDOUT, cwd=d)
        wait_for(lambda: sum(1 for x in trace.rows if x[5] == "entered" and x[1].startswith("3.")) >= 2,
                 "the new node's two workers to enter")
        wait_for(lambda: any(x[5] == "step" and x[1].startswith("3.") for x in trace.rows), "the new node to train")
        print(f"joined: 3 replicas after {time.time() - at:.1f} s", flush=True)
        # It leaves on SIGTERM, whole.
        g, at = gen_now(), time.time()
        extra.send_signal(signal.SIGTERM)
        extra.wait(timeout=120)
        wait_for(lambda: any(x[5] == "step" and x[3] > g and x[0] > at for x in trace.rows), "training after the leave")
        print(f"left: training again after {time.time() - at:.1f} s", flush=True)
        # kill -9 of a worker of rank >= 1 in its step (mid-backward: FSDP's collectives run there).
        g = gen_now()
        victim = wait_for(lambda: next((x for x in trace.rows if x[5] == "step" and x[4] >= 1 and x[3] == g), None),
                          "a step of rank >= 1")
        os.kill(victim[2], signal.SIGKILL)
        at = time.time()
        agent = victim[1].split(".")[0] + "."
        wait_for(lambda: any(x[5] == "entered" and x[1].startswith(agent) and x[1] != victim[1] and x[0] > at
                             for x in trace.rows), "the replacement to enter")
        wait_for(lambda: any(x[5] == "step" and x[3] > g and x[0] > at for x in trace.rows), "training after the kill")
        print(f"killed {victim[1]}: training again after {time.time() - at:.1f} s", flush=True)
        rc = core.wait(timeout=900)
        if rc != 0:
            raise AssertionError(f"the job failed (exit {rc})")
        sys.path.insert(0, CHECK)
        from check_samples import check

        print(f"samples ok: {check(os.path.join(d, 'samples'), SAMPLES, 1)}", flush=True)
        rows = [l.split() for l in open(loss)]
        first = sum(float(r[1]) for r in rows[:5]) / 5
        last = sum(float(r[1]) for r in rows[-20:]) / 20
        print(f"loss: first steps {first:.3f}, last steps {last:.3f}, {len(rows)} steps, worlds "
              f"{sorted({int(r[2]) for r in rows})}", flush=True)
        if not last < first / 2:
            raise AssertionError("the loss did not fall")
        ok = True
        print("HSDP OK", flush=True)
        return 0
    finally:
        if not ok:
            # Where each live worker is: the library prints every thread's stack on
            # SIGUSR1 (into the logs printed below).
            for pid in {r[2] for r in trace.rows}:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except OSError:
                    pass
            time.sleep(2)
        for p in [core] + ([extra] if extra else []):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    p.kill()
        mp.kill()
        if not ok:
            rows = [r for r in trace.rows if r[5] != "step"]
            print("--- trace (without steps) ---\n" + "\n".join(map(str, rows[-60:])), flush=True)
            print("--- bft-run log ---\n" + open(log_path).read()[-40000:], flush=True)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
