"""The sampler's first step: time and memory at n = 10^3 .. 10^10, the keyed order
against the list shuffle of earlier releases (the baseline, in the same run).

Each case runs in a fresh process (the numpy import is counted apart: torch brings
numpy in before any step). Prints one row per case: first-step time and the process's RSS growth (best of the
repeats, untraced), and peak Python allocation (tracemalloc, one more process).
Then what ``take()`` costs a step in the steady state, for both orders (best of the
repeats, 2,000 steps each).

    /opt/bftrainer-venv/bin/python wrappers/python/bench/sampler_bench.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time, tracemalloc
sys.path.insert(0, sys.argv[1])
import numpy  # noqa: F401  (imported by torch before any step)
from bftrainer.sampler import ElasticSampler
n, form, batch, world = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
traced = sys.argv[6] == "mem"  # tracemalloc slows allocation: timed runs go without
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if traced:
    tracemalloc.start()
t = time.perf_counter()
if form == "global":
    s = ElasticSampler(n, global_batch=batch * world, seed=1, world=lambda: (world - 1, world))
else:
    s = ElasticSampler(n, batch, seed=1, world=lambda: (world - 1, world))
    s.order_version = 1  # the list shuffle of releases up to 0.1
idx = s.take()
dt = time.perf_counter() - t
peak = tracemalloc.get_traced_memory()[1] if traced else 0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
assert 0 < len(idx) <= batch
print(json.dumps({"s": dt, "peak": peak, "rss_kb": rss}))
"""


def child(src: str, n: int, form: str, batch: int, world: int, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, src, str(n), form, str(batch), str(world), mode],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def run(src: str, n: int, form: str, batch: int, world: int, repeats: int) -> dict:
    """Best time of ``repeats`` plain processes; memory from one traced process."""
    timed = min((child(src, n, form, batch, world, "time") for _ in range(repeats)), key=lambda r: r["s"])
    mem = child(src, n, form, batch, world, "mem")
    return {"s": timed["s"], "rss_kb": timed["rss_kb"], "peak": mem["peak"]}


def per_step(src: str, repeats: int) -> None:
    """What ``take()`` costs a step in the steady state, both orders, n = 10^6 (the
    list is built once, before the clock starts), rank 1 of 2."""
    sys.path.insert(0, src)
    import time

    from bftrainer.sampler import ElasticSampler

    print(f"\n{'per rank':>8} {'list take()':>12} {'keyed take()':>13}")
    for per in (32, 256, 1024):
        cost = {}
        for form in ("list", "keyed"):
            if form == "list":
                s = ElasticSampler(10**6, per, seed=1, world=lambda: (1, 2))
                s.order_version = 1
            else:
                s = ElasticSampler(10**6, global_batch=2 * per, seed=1, world=lambda: (1, 2))
            s.take()
            best = float("inf")
            for _ in range(repeats):
                k, t = 0, time.perf_counter()
                while k < 2000:
                    if s.consumed + 2 * per > s.num_samples:
                        s.consumed = 0
                    s.take()
                    k += 1
                best = min(best, (time.perf_counter() - t) / k)
            cost[form] = best
        print(f"{per:>8} {cost['list'] * 1e6:>9.1f} us {cost['keyed'] * 1e6:>10.1f} us", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=512, help="samples per rank and step")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    print(f"first step of the last of {args.world} ranks, {args.batch} samples each; best of {args.repeats} processes")
    print(f"{'order':<8} {'n':>18} {'first step':>12} {'peak alloc':>12} {'RSS growth':>12}")
    rows = [("list", 10**5), ("list", 10**6), ("list", 10**7)]
    rows += [("keyed", n) for n in (10**3, 10**5, 10**7, 10**10, 2**40)]
    for form, n in rows:
        r = run(src, n, "global" if form == "keyed" else "list", args.batch, args.world, args.repeats)
        print(f"{form:<8} {n:>18,} {r['s'] * 1e3:>9.2f} ms {r['peak'] / 1e6:>9.3f} MB {r['rss_kb'] / 1e3:>9.1f} MB", flush=True)
    per_step(src, args.repeats)


if __name__ == "__main__":
    main()
