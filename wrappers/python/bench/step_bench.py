"""Issue 19's benchmark of the elastic runtime under real step times (docs/benchmarks.md,
"Pauses by step time" and "Memory against DDP"), in one run on this machine:

- for steps of 0.01, 1, 5 and 20 s (sleep-padded, examples/train.py --step-sleep):
  the training pause per scale-out (a newcomer joins), per graceful scale-in (its agent
  gets SIGTERM), per node killed with -9 (agent and worker) and per node frozen with
  SIGSTOP (noticed by the coordinator's heartbeat bound, --hang-timeout), each measured
  on rank 0's timeline as the gap across the change minus the median step before it,
  and said as the time beyond the step boundary;
- peak RSS per worker of examples/train.py under bft-run against plain DDP
  (bench/ddp_train.py) with the same model of at least 200 MB of state.

    python wrappers/python/bench/step_bench.py [--bft-run target/release/bft-run]
        [--steps 0.01,1,5,20] [--hang-timeout 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_bench import REPO, TRAIN, Munged, env_with_lib, free_port, log, pauses, steps_at, timeline, wait_for  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = ["--hidden", "256", "--batch", "32", "--samples", "2000000", "--epochs", "1"]


def node_pids(agent: int):
    """The agent and its workers (each worker is in a process group of its own)."""
    pids = [agent]
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open(f"/proc/{p}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == agent:
                pids.append(int(p))
    return pids


def coord_of(path: str):
    while not (os.path.exists(path) and open(path).read().endswith("\n")):
        time.sleep(0.05)
    return open(path).read().split()


def events(bft: str, py: str, d: str, munge: str, step: float, hang: float):
    tl = os.path.join(d, f"steps{step}.tl")
    cf = os.path.join(d, f"coord{step}")
    e = env_with_lib()
    e["BFT_MUNGE_SOCKET"] = munge
    errlog = open(os.path.join(d, f"steps{step}.log"), "w")
    main = subprocess.Popen([bft, "--local", "2", "--hang-timeout", str(hang), "--coord-file", cf, "--",
                             py, TRAIN, *SMALL, "--step-sleep", str(step), "--timeline", tl],
                            env=e, stdout=subprocess.DEVNULL, stderr=errlog, start_new_session=True)
    addr, job, run = coord_of(cf)
    # Steps to see after each change: enough for a median, few at long steps.
    n = 150 if step < 0.1 else 3
    wait_for(tl, lambda t: len(t) > n + 2, 300, "training to start")
    marks = []

    def extra(name: str) -> subprocess.Popen:
        return subprocess.Popen([bft, "--agent", "--coord", addr, "--coord-job", job, "--coord-run", run,
                                 "--node-name", name], env=e, stdout=subprocess.DEVNULL, stderr=errlog,
                                start_new_session=True)

    try:
        t0 = time.time()
        a = extra("join-leave")
        wait_for(tl, lambda t: steps_at(3, t0)(t) > n, 600, "scale-out")
        marks.append("join")
        t0 = time.time()
        a.send_signal(signal.SIGTERM)
        wait_for(tl, lambda t: steps_at(2, t0)(t) > n, 600, "graceful scale-in")
        marks.append("leave")
        for kind, sig in (("kill -9", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP)):
            t0 = time.time()
            b = extra(kind)
            wait_for(tl, lambda t: steps_at(3, t0)(t) > n, 600, "scale-out")
            marks.append("join")
            t0 = time.time()
            # The whole node: the agent and its workers, as when a node dies or freezes.
            for pid in node_pids(b.pid):
                os.kill(pid, sig)
            wait_for(tl, lambda t: steps_at(2, t0)(t) > n, 600, f"recovery after {kind}")
            marks.append(kind)
            for pid in node_pids(b.pid):
                os.kill(pid, signal.SIGKILL)
            b.wait()
    finally:
        os.killpg(main.pid, signal.SIGKILL)
        main.wait()
        subprocess.run(["pkill", "-KILL", "-f", tl], check=False)
    got = pauses(timeline(tl))
    if len(got) != len(marks):
        sys.exit(f"steps of {step} s: expected {len(marks)} changes of world, saw {len(got)}: {got}")
    return list(zip(marks, [p for _, _, p, _ in got]))


def rss(cmd, env, what: str):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    vals = [float(l.split()[-1]) for l in (out.stdout + out.stderr).splitlines() if " rss " in f" {l}"]
    if not vals:
        sys.exit(f"{what} printed no rss:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return vals


def memory(bft: str, py: str, munge: str, hidden: int):
    state_mb = (16 * hidden + hidden + hidden + 1) * 4 * 2 / 1e6  # params + SGD momentum
    model = ["--hidden", str(hidden), "--batch", "8", "--samples", "640", "--epochs", "1", "--lr", "0.0001"]
    port = free_port()
    procs = []
    for r in range(2):
        e = env_with_lib()
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2")
        procs.append(subprocess.Popen([py, os.path.join(HERE, "ddp_train.py"), *model], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    ddp = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        ddp += [float(l.split()[-1]) for l in out.splitlines() if l.startswith("rss ")]
    e = env_with_lib()
    e["BFT_MUNGE_SOCKET"] = munge
    ours = rss([bft, "--local", "2", "--", py, TRAIN, *model, "--report-rss"], e, "bft-run")
    return state_mb, ddp, ours


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bft-run", default=os.path.join(REPO, "target", "release", "bft-run"))
    ap.add_argument("--python", default=os.path.join(os.environ.get("BFT_VENV", "/opt/bftrainer-venv"), "bin", "python"))
    ap.add_argument("--steps", default="0.01,1,5,20")
    ap.add_argument("--hang-timeout", type=float, default=10.0)
    ap.add_argument("--hidden", type=int, default=1_500_000, help="MLP width of the memory case (state = 2 x 18 x hidden x 4 bytes)")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--memory-runs", type=int, default=5)
    args = ap.parse_args()
    if not os.path.exists(args.bft_run):
        sys.exit(f"{args.bft_run} is missing: cargo build --release -p bft-run")
    with tempfile.TemporaryDirectory(prefix="bft-step-bench-") as d:
        m = Munged(d)
        try:
            if not args.skip_memory:
                # Peak RSS moves by 10-30% between identical runs (the allocator):
                # several runs of each, alternating, and the medians of their worst ranks.
                ddp_runs, our_runs = [], []
                for _ in range(args.memory_runs):
                    state_mb, ddp, ours = memory(args.bft_run, args.python, m.sock, args.hidden)
                    ddp_runs.append(max(ddp))
                    our_runs.append(max(ours))
                    log(f"memory run: DDP {', '.join(f'{x:.0f}' for x in ddp)} MB, bft-run {', '.join(f'{x:.0f}' for x in ours)} MB")
                d, o = statistics.median(ddp_runs), statistics.median(our_runs)
                log(f"memory: model + SGD momentum {state_mb:.0f} MB; peak RSS per worker (median over {args.memory_runs} "
                    f"runs of the worst rank): DDP {d:.0f} MB, bft-run {o:.0f} MB; bft-run / DDP = {o / d:.3f}")
            for s in [float(x) for x in args.steps.split(",") if x]:
                ev = events(args.bft_run, args.python, d, m.sock, s, args.hang_timeout)
                parts = []
                for kind in ("join", "leave", "kill -9", "SIGSTOP"):
                    xs = [x for k, x in ev if k == kind]
                    parts.append(f"{kind} {statistics.median(xs):.3f} s" + (f" (of {len(xs)}: {', '.join(f'{x:.3f}' for x in xs)})" if len(xs) > 1 else ""))
                log(f"steps of {s:g} s: pause beyond the step boundary: " + "; ".join(parts) +
                    f" (--hang-timeout {args.hang_timeout:g} s)")
        finally:
            m.stop()


if __name__ == "__main__":
    main()
