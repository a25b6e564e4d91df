"""An experiment for docs/design.md (MPI mode): what keeping MPI ranks alive across a
change would cost with Open MPI 4.1's dynamic processes (connect/accept), to compare
with bft-run --mode mpi's restart (elastic_bench.py). Not bft-run: plain mpirun.

A world of 2 ranks (one mpirun) trains the benchmark's model (mpi_train.py's step: the
MLP, its gradient all-reduced over mpi4py). Each round, a third rank is started by a
second mpirun while the world trains: it imports torch, builds its data, looks the
world's port up in ompi-server (the name server two mpiruns need to meet) and
connects. At the next step boundary the world accepts, both sides merge the
intercommunicator, rank 0 broadcasts the model and optimizer state, and the three
train on. Later the third leaves gracefully: every rank frees the merged communicator
and disconnects, and the two train on (a rank of the world's own mpirun could not leave
this way: MPI_COMM_WORLD cannot be disconnected). Pauses are measured as
elastic_bench.py measures them, on rank 0's timeline: the gap across the change minus
the median step before it.

    python wrappers/python/bench/mpi_accept.py [--rounds 3] [--keep DIR]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVICE = "bft-bench-grow"
JOIN, LEAVE, STOP = 1, 2, 3


def rank_main(a) -> None:
    """One rank: of the world (role "world") or the one that joins (role "joiner")."""
    import numpy as np
    import torch
    from mpi4py import MPI

    from _job import flat_allreduce, job

    X, Y, model, opt = job(a.samples, a.hidden, a.lr)
    params = list(model.parameters())
    base = MPI.COMM_WORLD
    comm, inter, port = base, None, None
    if a.role == "world":
        if base.Get_rank() == 0:
            port = MPI.Open_port()
            MPI.Publish_name(SERVICE, port)
    else:
        port = MPI.Lookup_name(SERVICE)
        open(a.ready, "w").close()
        inter = base.Connect(port, root=0)
        comm = inter.Merge(high=True)
        state = comm.bcast(None, root=0)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    rank = comm.Get_rank()
    timeline = open(a.timeline, "a", buffering=1) if a.role == "world" and rank == 0 else None
    step, changes = 0, 0
    # The gradient and one more element, the driver's word read by rank 0 (0: train on,
    # then JOIN, LEAVE, STOP): it rides the step's one all-reduce, as mpi_train.py's
    # stop flags do.
    buf = np.empty(sum(q.numel() for q in params) + 2, dtype=np.float32)
    word = [0]

    def reduce(flat: torch.Tensor) -> None:
        buf[:-1] = flat.numpy()
        buf[-1] = 0
        if comm.Get_rank() == 0:
            buf[-1] = (STOP if os.path.exists(a.stop) else LEAVE if os.path.exists(a.leave)
                       else JOIN if os.path.exists(a.ready) else 0)
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        flat.copy_(torch.from_numpy(buf[:-1]))
        word[0] = int(buf[-1])

    while word[0] != STOP:
        g = torch.Generator().manual_seed(step * 1000 + comm.Get_rank())
        idx = torch.randint(a.samples, (a.batch,), generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
        flat_allreduce(params, a.batch, reduce)
        opt.step()
        step += 1
        if timeline:
            timeline.write(f"{time.time():.6f} {step} {comm.Get_size()} {changes}\n")
        if word[0] == JOIN and inter is None:
            inter = base.Accept(port or "", root=0)
            comm = inter.Merge(high=False)
            comm.bcast({"model": model.state_dict(), "optimizer": opt.state_dict()} if rank == 0 else None, root=0)
            if rank == 0:
                os.remove(a.ready)
            changes += 1
        elif word[0] == LEAVE and inter is not None:
            comm.Free()
            inter.Disconnect()
            if a.role == "joiner":
                return
            comm, inter = base, None
            if rank == 0:
                os.remove(a.leave)
            changes += 1
    if rank == 0:
        MPI.Unpublish_name(SERVICE, port)
        MPI.Close_port(port)


def driver(a) -> None:
    from elastic_bench import MODEL, env_with_lib, log, median_step, mpi_env, pauses, steps_at, timeline, wait_for

    with tempfile.TemporaryDirectory(prefix="bft-accept-") as tmp:
        d = a.keep or tmp
        os.makedirs(d, exist_ok=True)
        files = {k: os.path.join(d, k) for k in ("uri", "ready", "leave", "stop", "tl")}
        for f in files.values():
            if os.path.exists(f):
                os.remove(f)
        e = mpi_env(env_with_lib())
        err = open(os.path.join(d, "accept.log"), "w")
        server = subprocess.Popen(["ompi-server", "--no-daemonize", "--report-uri", files["uri"]], env=e,
                                  stdout=err, stderr=err)
        t = time.monotonic()
        while not (os.path.exists(files["uri"]) and open(files["uri"]).read().strip()):
            if time.monotonic() - t > 30 or server.poll() is not None:
                sys.exit(f"ompi-server did not start: {err.name}")
            time.sleep(0.05)

        def mpirun(n: int, role: str) -> subprocess.Popen:
            return subprocess.Popen(
                ["mpirun", "--ompi-server", f"file:{files['uri']}", "-np", str(n), a.python, __file__,
                 "--role", role, *MODEL, *(f"--{k}={files[k]}" for k in ("ready", "leave", "stop")),
                 "--timeline", files["tl"]], env=e, stdout=err, stderr=err)

        tl = files["tl"]
        world = mpirun(2, "world")
        marks, launched = [], []
        try:
            wait_for(tl, lambda x: len(x) > 100, 180, "the world of 2 to train")
            for _ in range(a.rounds):
                t0 = time.time()
                launched.append(t0)
                joiner = mpirun(1, "joiner")
                wait_for(tl, lambda x: steps_at(3, t0)(x) > 150, 180, "the third rank to join")
                marks.append("join")
                t0 = time.time()
                open(files["leave"], "w").close()
                wait_for(tl, lambda x: steps_at(2, t0)(x) > 150, 180, "the third rank to leave")
                marks.append("leave")
                if joiner.wait(60) != 0:
                    sys.exit(f"the joiner's mpirun exited {joiner.returncode}: {err.name}")
            open(files["stop"], "w").close()
            if world.wait(60) != 0:
                sys.exit(f"the world's mpirun exited {world.returncode}: {err.name}")
        finally:
            for p in (world, server):
                if p.poll() is None:
                    p.kill()
                    p.wait()
        x = timeline(tl)
        got = pauses(x)
        if len(got) != len(marks):
            sys.exit(f"expected {len(marks)} changes of world, saw {len(got)}: {got}")
        step = median_step(x, world=2)
        # The joiner's own start (mpirun, Python, torch, its data, MPI_Init, the lookup)
        # runs beside the training: from its launch to the first step of the three.
        ready = [next(e[0] for e in x if e[0] > t and e[2] == 3) - t for t in launched]
        log(f"connect/accept, Open MPI 4.1 (ompi-server), MLP 16-4096-1, per-rank batch 256; "
            f"step of 2 ranks {step * 1000:.1f} ms")
        for kind, what in (("join", "a rank joins (accept, merge, state broadcast), 2 -> 3"),
                           ("leave", "it leaves (free, disconnect), 3 -> 2")):
            xs = [p for k, (_, _, p, _) in zip(marks, got) if k == kind]
            log(f"{what}: pause median {statistics.median(xs):.3f} s, {min(xs):.3f}-{max(xs):.3f} s over {len(xs)} "
                f"({', '.join(f'{p:.3f}' for p in xs)})")
        log(f"from the joiner's launch to the first step of 3 (training goes on meanwhile): median "
            f"{statistics.median(ready):.2f} s ({', '.join(f'{r:.2f}' for r in ready)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=os.path.join(os.environ.get("BFT_VENV", "/opt/bftrainer-venv"), "bin", "python"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", default=None, help="keep the timeline and logs in this directory")
    # A rank's (the driver passes them).
    ap.add_argument("--role", choices=["world", "joiner"], default=None, help=argparse.SUPPRESS)
    for k in ("ready", "leave", "stop", "timeline"):
        ap.add_argument(f"--{k}", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    a = ap.parse_args()
    sys.path.insert(0, HERE)
    if a.role:
        rank_main(a)
    else:
        driver(a)


if __name__ == "__main__":
    main()
