"""The elastic runtime's benchmark (docs/benchmarks.md): the same training job, on this
machine, in one run:

- steady-state throughput of bft-run native against plain torch.distributed (two
  processes started directly) with the same model, batches and flat all-reduce (the
  baseline);
- the training pause per scale-out, per graceful scale-in (SIGTERM) and per node killed
  with -9, and the steps redone, under bft-run in each of its three modes on the same
  job shape (2 nodes of one worker, a third joining and leaving), printed side by side
  as a table: native (examples/train.py, the library: the workers stay up); --mode
  torchrun (plain_train.py, unmodified, a new world at every change, resuming from its
  checkpoint of every 20 steps); --mode mpi (mpi_train.py: the same with the gradient
  all-reduced over mpi4py, one mpirun per change, resuming from the same checkpoints
  and saving when stopped). --skip-{native,torchrun,mpi}-mode leaves one out;
- torchrun's pause when it restarts every worker (what it does on any membership
  change) after a worker is killed with -9, resuming from its last checkpoint;
- with --torchft DIR, torchft used plainly (wrappers/python/bench/torchft_train.py):
  steady state and the same changes;
- with --hsdp ARGS, only the pauses with a sharded model (examples/train_hsdp.py with
  the model ARGS, FSDP2 HSDP, AdamW, 2 workers per node): a node joining and leaving,
  and a newcomer's start-up split (import, model build, state transfer, first gradient).

    python wrappers/python/bench/elastic_bench.py [--bft-run target/release/bft-run]
        [--torchft DIR]   # pip install --target DIR torchft (and its opentelemetry deps)

Pauses are measured on rank 0's timeline (one line per step): the gap across the
change minus the median step time before it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TRAIN = os.path.join(HERE, "..", "examples", "train.py")
PLAIN = os.path.join(HERE, "plain_train.py")
MPI_TRAIN = os.path.join(HERE, "mpi_train.py")
MODEL = ["--hidden", "4096", "--batch", "256", "--samples", "65536"]


def log(msg: str) -> None:
    print(msg, flush=True)


class Munged:
    def __init__(self, d: str) -> None:
        self.sock = os.path.join(d, "munge.sock")
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.p = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={self.sock}", f"--key-file={key}",
             f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t = time.monotonic()
        while not os.path.exists(self.sock):
            if time.monotonic() - t > 10:
                sys.exit("munged did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.p.kill()
        self.p.wait()


def timeline(path: str) -> List[Tuple[float, int, int, int]]:
    out = []
    if os.path.exists(path):
        for line in open(path):
            f = line.split()
            if len(f) == 4:
                out.append((float(f[0]), int(f[1]), int(f[2]), int(f[3])))
    return out


def wait_for(path: str, pred, timeout: float, what: str) -> None:
    t = time.monotonic()
    while not pred(timeline(path)):
        if time.monotonic() - t > timeout:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.1)


def steps_at(world: int, after: float):
    return lambda tl: sum(1 for e in tl if e[2] == world and e[0] > after)


def median_step(tl, world: Optional[int] = None, skip: int = 20) -> float:
    # Within one world and one generation, after the first steps (warm-up).
    d = [b[0] - a[0] for a, b in zip(tl, tl[1:]) if a[3] == b[3] and a[1] + 1 == b[1] and (world is None or a[2] == world)]
    return statistics.median(d[skip:] if len(d) > 2 * skip else d)


def pauses(tl) -> List[Tuple[int, int, float, int]]:
    """(world before, world after, pause in s, steps redone) at every change of world:
    the gap across it minus the median step time of the 50 steps before it, and how
    many steps the new world took again (a restart from a checkpoint)."""
    out = []
    for i in range(1, len(tl)):
        a, b = tl[i - 1], tl[i]
        if a[2] != b[2]:
            d = []
            j = i - 1
            while j > 0 and len(d) < 50 and tl[j - 1][3] == tl[j][3] and tl[j - 1][1] + 1 == tl[j][1]:
                d.append(tl[j][0] - tl[j - 1][0])
                j -= 1
            step = statistics.median(d) if d else 0.0
            out.append((a[2], b[2], b[0] - a[0] - step, max(0, a[1] - b[1] + 1)))
    return out


def env_with_lib() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(REPO, "wrappers", "python", "src") + os.pathsep + e.get("PYTHONPATH", "")
    e["OMP_NUM_THREADS"] = "1"
    return e


def run_plain(py: str, d: str, epochs: int) -> float:
    """Two plain torch.distributed processes started directly (env:// rendezvous), as
    bft-run's agents start theirs: no launcher process beside them."""
    tl = os.path.join(d, "plain.tl")
    if os.path.exists(tl):
        os.remove(tl)
    with socket.socket() as so:  # a free port for the rendezvous, fresh each run
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    procs = []
    for r in range(2):
        e = env_with_lib()
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r))
        procs.append(subprocess.Popen([py, PLAIN, *MODEL, "--epochs", str(epochs), "--timeline", tl], env=e,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for r, p in enumerate(procs):
        if p.wait() != 0:
            sys.exit(f"the plain baseline failed (rank {r} exited {p.returncode}; port {port})")
    return median_step(timeline(tl))


def run_native(bft: str, py: str, d: str, epochs: int, munge: str) -> float:
    tl = os.path.join(d, "native.tl")
    if os.path.exists(tl):
        os.remove(tl)
    e = env_with_lib()
    e["BFT_MUNGE_SOCKET"] = munge
    subprocess.run([bft, "--local", "2", "--", py, TRAIN, *MODEL, "--epochs", str(epochs), "--timeline", tl],
                   env=e, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return median_step(timeline(tl))


def mpi_env(e: dict) -> dict:
    """Open MPI's settings for the "nodes" of this one machine: as root where the bench
    runs as root, TCP over loopback, idle ranks yield the CPUs, no binding (each node's
    daemon would bind its rank to core 0 of the same machine), and no topology in shared
    memory (a daemon of Open MPI 4.1.4 crashed here in hwloc_shmem_topology_write with
    others starting beside it)."""
    e = dict(e)
    e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,tcp",
             OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo",
             OMPI_MCA_mpi_yield_when_idle="1", OMPI_MCA_hwloc_base_binding_policy="none",
             OMPI_MCA_rtc_hwloc_vmhole="none")
    return e


def kill_node(agent: int) -> None:
    """A node dies: SIGKILL to its agent and everything under it, the deepest first. (In
    MPI mode the rank is the child of Open MPI's daemon, which the agent started: a rank
    outlives its daemon for a while, and a node that dies takes both.)"""
    children = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    tree, i = [agent], 0
    while i < len(tree):
        tree.extend(children.get(tree[i], []))
        i += 1
    for pid in reversed(tree):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# What each mode runs: bft-run's arguments before the program, and the program.
MODES = {
    "native": ([], TRAIN),
    "torchrun": (["--mode", "torchrun"], PLAIN),
    "mpi": (["--mode", "mpi"], MPI_TRAIN),
}


def mode_events(bft: str, py: str, d: str, munge: str, rounds: int, mode: str):
    """The membership changes under bft-run in one mode, 2 nodes of one worker each and
    a third that joins and leaves: native (the library, examples/train.py); torchrun
    (the plain script, resuming from its checkpoint of every 20 steps); mpi (the same
    under MPI, mpi_train.py, which also saves when stopped). (kind, pause, steps redone)
    each, and the median step of the 2-worker world."""
    name = f"mode-{mode}"
    tl = os.path.join(d, f"{name}.tl")
    coord_file = os.path.join(d, f"{name}.coord")
    e = env_with_lib()
    e["BFT_MUNGE_SOCKET"] = munge
    if mode == "mpi":
        e = mpi_env(e)
    errlog = open(os.path.join(d, f"{name}.log"), "w")
    flags, program = MODES[mode]
    args = [*MODEL, "--epochs", "1000", "--timeline", tl]
    if mode != "native":
        args += ["--checkpoint", os.path.join(d, f"{name}.ckpt"), "--checkpoint-every", "20"]
    main = subprocess.Popen([bft, "--local", "2", "--nproc-per-node", "1", *flags, "--coord-file", coord_file,
                             "--", py, program, *args], env=e, stdout=subprocess.DEVNULL, stderr=errlog)
    while not (os.path.exists(coord_file) and open(coord_file).read().endswith("\n")):
        if main.poll() is not None:
            sys.exit(f"bft-run ({mode}) exited {main.returncode}: {errlog.name}")
        time.sleep(0.05)
    coord, job, run = open(coord_file).read().split()
    wait_for(tl, lambda t: len(t) > 100, 180, f"training to start ({mode})")
    marks = []

    def extra(node: str) -> subprocess.Popen:
        return subprocess.Popen([bft, "--agent", "--coord", coord, "--coord-job", job, "--coord-run", run,
                                 "--node-name", node, "--nproc-per-node", "1"], env=e,
                                stdout=subprocess.DEVNULL, stderr=errlog, start_new_session=True)

    try:
        for r in range(rounds):
            t0 = time.time()
            a = extra(f"extra-{r}a")
            wait_for(tl, lambda t: steps_at(3, t0)(t) > 150, 180, f"scale-out ({mode})")
            marks.append("out")
            t0 = time.time()
            a.send_signal(signal.SIGTERM)
            wait_for(tl, lambda t: steps_at(2, t0)(t) > 150, 180, f"graceful scale-in ({mode})")
            marks.append("in")
            assert a.wait(60) == 0
            t0 = time.time()
            b = extra(f"extra-{r}b")
            wait_for(tl, lambda t: steps_at(3, t0)(t) > 150, 180, f"scale-out ({mode})")
            marks.append("out")
            t0 = time.time()
            kill_node(b.pid)
            b.wait()
            wait_for(tl, lambda t: steps_at(2, t0)(t) > 150, 180, f"recovery after kill -9 ({mode})")
            marks.append("kill")
    finally:
        main.send_signal(signal.SIGKILL)
        main.wait()
        subprocess.run(["pkill", "-KILL", "-f", tl], check=False)
    t = timeline(tl)
    got = pauses(t)
    if len(got) != len(marks):
        sys.exit(f"{mode}: expected {len(marks)} changes of world, saw {len(got)}: {got}")
    return [(k, p, r) for k, (_, _, p, r) in zip(marks, got)], median_step(t, world=2)


HSDP_TRAIN = os.path.join(HERE, "..", "examples", "train_hsdp.py")


def hsdp_events(bft: str, py: str, d: str, munge: str, rounds: int, model: List[str]):
    """Pauses with a sharded model (examples/train_hsdp.py, FSDP2 HSDP over
    ``bftrainer.device_mesh()``, AdamW): one node of 2 workers trains; a second node of
    2 joins and, once it trained, leaves on SIGTERM, ``rounds`` times. Each change's
    pause on rank 0's timeline (the gap across it minus the median step before it), and
    each newcomer's start-up split: its agent started -> its workers' Python started
    -> torch imported -> model built (``--timings``) -> in the generation (state
    received: the trace's ``entered``) -> its first gradient (the trace's first
    ``step``, FSDP's reduce-scatter, of that worker)."""
    tl, trace = os.path.join(d, "hsdp.tl"), os.path.join(d, "hsdp.trace")
    coord_file = os.path.join(d, "hsdp.coord")
    e = env_with_lib()
    e.pop("OMP_NUM_THREADS")  # bft-run gives each worker its share of the node's CPUs
    e["BFT_MUNGE_SOCKET"] = munge
    e["BFT_TRACE"] = trace
    errlog = open(os.path.join(d, "hsdp.log"), "w")
    main = subprocess.Popen([bft, "--local", "1", "--nproc-per-node", "2", "--coord-file", coord_file, "--", py,
                             HSDP_TRAIN, *model, "--samples", "100000", "--epochs", "1", "--timings",
                             "--loss-log", tl], env=e, stdout=subprocess.DEVNULL, stderr=errlog)

    def rows():
        out = []
        if os.path.exists(trace):
            for line in open(trace):
                f = line.split()
                if len(f) == 6:
                    out.append((float(f[0]), f[1], int(f[2]), int(f[3]), int(f[4]), f[5]))
        return out

    def loss_tl():
        # "step loss world gen time" -> (time, step, world, gen), as timeline() reads.
        out = []
        if os.path.exists(tl):
            for line in open(tl):
                f = line.split()
                if len(f) == 5:
                    out.append((float(f[4]), int(f[0]), int(f[2]), int(f[3])))
        return out

    def wait(pred, timeout: float, what: str) -> None:
        t = time.monotonic()
        while not pred(loss_tl()):
            if main.poll() is not None:
                sys.exit(f"bft-run (HSDP) exited {main.returncode}: {errlog.name}")
            if time.monotonic() - t > timeout:
                sys.exit(f"timed out waiting for {what}: {errlog.name}")
            time.sleep(0.2)

    def steps_in(world: int, after: float, n: int):
        return lambda t: sum(1 for x in t if x[2] == world and x[0] > after) >= n

    while not (os.path.exists(coord_file) and open(coord_file).read().endswith("\n")):
        if main.poll() is not None:
            sys.exit(f"bft-run (HSDP) exited {main.returncode}: {errlog.name}")
        time.sleep(0.1)
    coord, job, run = open(coord_file).read().split()
    # Few steps around each change: a step of a 1 GB model takes seconds on a CPU.
    wait(steps_in(2, 0, 5), 900, "HSDP training to start")
    marks, starts, gens = [], [], []
    try:
        for r in range(rounds):
            gens.append(loss_tl()[-1][3])
            t0 = time.time()
            elog = os.path.join(d, f"hsdp-extra{r}.log")
            a = subprocess.Popen([bft, "--agent", "--coord", coord, "--coord-job", job, "--coord-run", run,
                                  "--node-name", f"extra-{r}", "--nproc-per-node", "2"], env=e,
                                 stdout=subprocess.DEVNULL, stderr=open(elog, "w"), start_new_session=True)
            wait(steps_in(4, t0, 4), 900, "the second node to train")
            marks.append("join")
            # Its workers: the timings lines in its log, with the trace's rows of their pids.
            tr = rows()
            for line in open(elog):
                if "timings pid " not in line:
                    continue
                f = line.split("timings pid ")[1].split()
                pid, start, torch_at, data, mesh, built = int(f[0]), *(float(x) for x in f[2:11:2])
                entered = min(x[0] for x in tr if x[2] == pid and x[5] == "entered")
                first = min(x[0] for x in tr if x[2] == pid and x[5] == "step")
                starts.append((start - t0, torch_at - start, data - torch_at, mesh - data, built - mesh,
                               entered - built, first - entered, first - t0))
            gens.append(loss_tl()[-1][3])
            t0 = time.time()
            a.send_signal(signal.SIGTERM)
            wait(steps_in(2, t0, 4), 900, "training on one node after the leave")
            marks.append("leave")
            assert a.wait(120) == 0
    finally:
        main.send_signal(signal.SIGTERM)
        try:
            main.wait(30)
        except subprocess.TimeoutExpired:
            main.kill()
            main.wait()
        subprocess.run(["pkill", "-KILL", "-f", tl], check=False)
    t = loss_tl()
    got = pauses(t)
    if len(got) != len(marks):
        sys.exit(f"HSDP: expected {len(marks)} changes of world, saw {len(got)}: {got}")
    # The survivors' switch, from the trace: worker 1.0 (on the first node throughout)
    # from leaving its last step ("rebuild") to being in the next trained generation
    # with the state everywhere ("entered"). The timeline's gap holds it plus one step,
    # whose time here moves by more than the switch (2 cores shared by 4 workers and
    # other work).
    tr = rows()
    switch = []
    for g in gens:
        entered = min(x[0] for x in tr if x[1] == "1.0" and x[5] == "entered" and x[3] > g)
        rebuilt = max(x[0] for x in tr if x[1] == "1.0" and x[5] == "rebuild" and x[0] <= entered)
        switch.append(entered - rebuilt)
    return ([(k, p, redo, sw) for k, (_, _, p, redo), sw in zip(marks, got, switch)],
            median_step(t, world=2, skip=2), median_step(t, world=4, skip=2), starts)


def hsdp_report(model: List[str], ev, step2: float, step4: float, starts) -> None:
    log(f"HSDP, train_hsdp.py {' '.join(model)}: 1 node of 2 workers, a second joins and leaves")
    log(f"step: {step2:.3f} s on 1 node, {step4:.3f} s on 2 (medians)")
    for kind in ("join", "leave"):
        xs = [p for k, p, _, _ in ev if k == kind]
        sw = [w for k, _, _, w in ev if k == kind]
        redo = [r for k, _, r, _ in ev if k == kind]
        log(f"{kind}: survivors' switch (last step -> in the new generation, state sent) "
            f"{', '.join(f'{x:.3f}' for x in sw)} s; the timeline's gap minus the step median before it "
            f"{', '.join(f'{x:.3f}' for x in xs)} s; {max(redo)} steps redone at most")
    for w in starts:
        log("newcomer worker: agent start -> python {:.2f} s, import torch {:.2f} s, data {:.2f} s, "
            "device_mesh() {:.2f} s, model build (fully_shard, optimizer) {:.2f} s, -> in the generation "
            "(state received) {:.2f} s, -> first gradient {:.2f} s; in all {:.2f} s, {:.2f} s without import "
            "and the script's data and model build".format(*w, w[7] - w[1] - w[2] - w[4]))


def free_port() -> int:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def torchft_events(py: str, d: str, ftlib: str, rounds: int):
    """torchft used plainly: one replica group per process, its Lighthouse; the same
    changes as for bft-run (a replica joins; one leaves on SIGTERM, which torchft treats
    like any exit; one is killed with -9)."""
    port = free_port()
    e = env_with_lib()
    e["PYTHONPATH"] = ftlib + os.pathsep + e["PYTHONPATH"]
    e["TORCHFT_LIGHTHOUSE"] = f"http://127.0.0.1:{port}"
    errlog = open(os.path.join(d, "torchft.log"), "w")
    lh = subprocess.Popen([py, os.path.join(ftlib, "bin", "torchft_lighthouse"), "--min_replicas", "1",
                           "--quorum_tick_ms", "100", "--join_timeout_ms", "100", "--bind", f"127.0.0.1:{port}"],
                          env=e, stdout=errlog, stderr=errlog)
    tl = os.path.join(d, "torchft.tl")
    procs = []

    def replica(i: int) -> subprocess.Popen:
        p = subprocess.Popen([py, os.path.join(HERE, "torchft_train.py"), "--replica", str(i), *MODEL,
                              *(["--timeline", tl] if i == 0 else [])],
                             env=e, stdout=errlog, stderr=errlog, start_new_session=True)
        procs.append(p)
        return p

    marks = []
    try:
        replica(0)
        replica(1)
        wait_for(tl, lambda t: steps_at(2, 0)(t) > 150, 180, "torchft training on 2 replicas")
        steady = median_step([x for x in timeline(tl) if x[2] == 2])
        n = 2
        for _ in range(rounds):
            t0 = time.time()
            a = replica(n)
            n += 1
            wait_for(tl, lambda t: steps_at(3, t0)(t) > 150, 180, "torchft scale-out")
            marks.append("out")
            t0 = time.time()
            a.send_signal(signal.SIGTERM)
            wait_for(tl, lambda t: steps_at(2, t0)(t) > 150, 180, "torchft scale-in")
            marks.append("in")
            t0 = time.time()
            b = replica(n)
            n += 1
            wait_for(tl, lambda t: steps_at(3, t0)(t) > 150, 180, "torchft scale-out")
            marks.append("out")
            t0 = time.time()
            os.killpg(b.pid, signal.SIGKILL)
            wait_for(tl, lambda t: steps_at(2, t0)(t) > 150, 180, "torchft recovery after kill -9")
            marks.append("kill")
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        lh.kill()
        lh.wait()
    got = pauses(timeline(tl))
    if len(got) != len(marks):
        sys.exit(f"torchft: expected {len(marks)} changes of world, saw {len(got)}: {got}")
    return steady, [(k, x, r) for k, (_, _, x, r) in zip(marks, got)]


KINDS = {"out": "a node joins, 2 -> 3", "in": "a node leaves on SIGTERM, 3 -> 2", "kill": "a node killed with -9, 3 -> 2"}


def report(name: str, ev, step: float) -> None:
    for kind, what in KINDS.items():
        xs = [x for k, x, _ in ev if k == kind]
        redo = [r for k, _, r in ev if k == kind]
        log(f"{name}, {what}: pause median {statistics.median(xs):.3f} s, max {max(xs):.3f} s over {len(xs)} "
            f"({', '.join(f'{x:.3f}' for x in xs)}); = {statistics.median(xs) / step:.0f} steps; "
            f"steps redone {', '.join(str(r) for r in redo)}")


def table(modes) -> None:
    """The modes side by side, as a markdown table: (column title, events, step) each."""
    log("")
    log("| change | " + " | ".join(t for t, _, _ in modes) + " |")
    log("|---|" + "---|" * len(modes))
    for kind, what in KINDS.items():
        cells = []
        for _, ev, _ in modes:
            xs = [x for k, x, _ in ev if k == kind]
            redo = [r for k, _, r in ev if k == kind]
            cells.append(f"median {statistics.median(xs):.3f} s, {min(xs):.3f}-{max(xs):.3f} s ({len(xs)}); "
                         f"{min(redo)}-{max(redo)} redone")
        log(f"| {what} | " + " | ".join(cells) + " |")
    log("| step, 2 workers (median) | " + " | ".join(f"{step * 1000:.1f} ms" for _, _, step in modes) + " |")


def torchrun_restarts(py: str, d: str, rounds: int) -> List[float]:
    tl = os.path.join(d, "torchrun.tl")
    ck = os.path.join(d, "torchrun.ckpt")
    p = subprocess.Popen([os.path.join(os.path.dirname(py), "torchrun"), "--standalone", "--nproc-per-node", "2",
                          "--max-restarts", str(rounds + 1), PLAIN, *MODEL, "--epochs", "1000",
                          "--timeline", tl, "--checkpoint", ck, "--checkpoint-every", "20"],
                         env=env_with_lib(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    out = []
    try:
        wait_for(tl, lambda t: len(t) > 100, 120, "torchrun training")
        for _ in range(rounds):
            n = len(timeline(tl))
            victim = None
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                        envb = open(f"/proc/{pid}/environ", "rb").read()
                    except OSError:
                        continue
                    if PLAIN.encode() in cmd and b"LOCAL_RANK=1\0" in envb:
                        victim = int(pid)
            assert victim, "no torchrun worker found"
            t_kill = time.time()
            os.kill(victim, signal.SIGKILL)
            wait_for(tl, lambda t: len(t) > n + 150, 180, "torchrun restart")
            seg = timeline(tl)[n - 1:]
            # Restarted workers resume from the checkpoint: the first step number that
            # does not go up is the first step after the restart.
            before = [e for e in seg if e[0] <= t_kill]
            seq = before[-1:] + [e for e in seg if e[0] > t_kill]
            i = next(i for i in range(1, len(seq)) if seq[i][1] <= seq[i - 1][1])
            step = median_step(timeline(tl)[:n], skip=5)
            out.append((seq[i][0] - seq[i - 1][0] - step, seq[i - 1][1] - seq[i][1] + 1))
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        # torchrun starts its workers in sessions of their own.
        subprocess.run(["pkill", "-KILL", "-f", tl], check=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bft-run", default=os.path.join(REPO, "target", "release", "bft-run"))
    ap.add_argument("--python", default=os.path.join(os.environ.get("BFT_VENV", "/opt/bftrainer-venv"), "bin", "python"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-steady", action="store_true", help="only the membership changes")
    ap.add_argument("--skip-native-mode", action="store_true", help="leave bft-run's native mode's changes out")
    ap.add_argument("--skip-torchrun-mode", action="store_true", help="leave bft-run --mode torchrun out")
    ap.add_argument("--skip-mpi-mode", action="store_true", help="leave bft-run --mode mpi out")
    ap.add_argument("--skip-torchrun", action="store_true", help="leave torchrun itself out")
    ap.add_argument("--torchft", default=None, help="a directory with torchft installed (pip install --target DIR torchft): measure it too")
    ap.add_argument("--keep", default=None, help="keep the timelines and logs in this directory")
    ap.add_argument("--hsdp", default=None, metavar="ARGS",
                    help="only the pauses with a sharded model: train_hsdp.py's model arguments, e.g. "
                         "'--dim 1024 --layers 20 --seq 8 --batch 1' (253 M parameters, 1.01 GB in fp32)")
    args = ap.parse_args()
    if args.hsdp is not None:
        if not os.path.exists(args.bft_run):
            sys.exit(f"{args.bft_run} is missing: cargo build --release -p bft-run")
        with tempfile.TemporaryDirectory(prefix="bft-bench-") as tmp:
            d = args.keep or tmp
            os.makedirs(d, exist_ok=True)
            m = Munged(d)
            try:
                model = args.hsdp.split()
                hsdp_report(model, *hsdp_events(args.bft_run, args.python, d, m.sock, args.rounds, model))
            finally:
                m.stop()
        return
    if not os.path.exists(args.bft_run):
        sys.exit(f"{args.bft_run} is missing: cargo build --release -p bft-run")
    if not args.skip_mpi_mode:
        if shutil.which("mpirun") is None:
            sys.exit("bft-run --mode mpi needs mpirun (Debian's openmpi-bin: scripts/install-deps), or --skip-mpi-mode")
        if subprocess.run([args.python, "-c", "import mpi4py"], capture_output=True).returncode != 0:
            sys.exit(f"bft-run --mode mpi needs mpi4py in {args.python} (scripts/python-env), or --skip-mpi-mode")
    with tempfile.TemporaryDirectory(prefix="bft-bench-") as tmp:
        d = args.keep or tmp
        os.makedirs(d, exist_ok=True)
        m = Munged(d)
        try:
            log("model: MLP 16-4096-1, per-rank batch 256, 2 workers, gloo on CPU")
            plain, native = [], []
            for _ in range(0 if args.skip_steady else 3):
                plain.append(run_plain(args.python, d, 4))
                native.append(run_native(args.bft_run, args.python, d, 4, m.sock))
            if args.skip_steady:
                plain, native = [run_plain(args.python, d, 1)], [run_native(args.bft_run, args.python, d, 1, m.sock)]
            p, n = statistics.median(plain), statistics.median(native)
            log(f"steady state: plain torch.distributed {p * 1000:.2f} ms/step, bft-run {n * 1000:.2f} ms/step "
                f"(runs {', '.join(f'{x * 1000:.2f}' for x in plain)} / {', '.join(f'{x * 1000:.2f}' for x in native)}); "
                f"bft-run throughput = {p / n:.3f} x plain")
            modes = []
            for mode, title in (("native", "native mode (library)"), ("torchrun", "`--mode torchrun`"),
                                ("mpi", "`--mode mpi`")):
                if getattr(args, f"skip_{mode}_mode"):
                    continue
                ev, step = mode_events(args.bft_run, args.python, d, m.sock, args.rounds, mode)
                report(f"bft-run {title}", ev, step)
                modes.append((title, ev, step))
            if modes:
                table(modes)
            if args.torchft:
                ft_step, ft = torchft_events(args.python, d, args.torchft, args.rounds)
                log(f"torchft steady state, 2 replica groups: {ft_step * 1000:.2f} ms/step = {p / ft_step:.3f} x plain")
                report("torchft", ft, ft_step)
            if args.skip_torchrun:
                return
            tr = torchrun_restarts(args.python, d, args.rounds)
            xs = [x for x, _ in tr]
            log(f"torchrun restart of all workers (-9 on one, --max-restarts): pause median {statistics.median(xs):.3f} s, "
                f"max {max(xs):.3f} s over {len(xs)} ({', '.join(f'{x:.3f}' for x in xs)}); "
                f"steps redone from the checkpoint: {', '.join(str(r) for _, r in tr)}; "
                f"= {statistics.median(xs) / p:.0f} steps")
        finally:
            m.stop()


if __name__ == "__main__":
    main()
