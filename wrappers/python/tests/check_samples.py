"""Check per-sample logs of examples/train.py (``--log-dir``): in the committed lineage
every sample is used exactly once per epoch.

Each rank writes ``S <gen> <step> <epoch> <rank> <ids...>`` before running a step. A step
that was rolled back is run again in a later generation, so for each step number the
run of the highest generation is the one the final model went through.

    python check_samples.py LOG_DIR NUM_SAMPLES EPOCHS
    python check_samples.py --compare ELASTIC_LOG_DIR STATIC_LOG_DIR [RTOL]
    python check_samples.py --last-change LOG_DIR

The second form compares two runs of the same training (``compare_runs``): an elastic
one and a static reference; the third prints the last step an elastic run ran in a
generation before its last (``last_change_step``).
"""

from __future__ import annotations

import collections
import os
import sys
from typing import Dict, List, Optional, Tuple


def check(log_dir: str, num_samples: int, epochs: int) -> Dict[str, int]:
    runs: Dict[int, Dict[int, Dict[int, Tuple[int, List[int]]]]] = collections.defaultdict(dict)
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            for n, line in enumerate(f, 1):
                parts = line.split()
                if not parts or parts[0] != "S":
                    continue
                if len(parts) < 5:
                    raise AssertionError(f"{name}:{n}: truncated line {line!r}")
                gen, step, epoch, rank = (int(x) for x in parts[1:5])
                ids = [int(x) for x in parts[5:]]
                by_rank = runs[step].setdefault(gen, {})
                if rank in by_rank:
                    raise AssertionError(f"step {step} generation {gen}: rank {rank} logged twice")
                by_rank[rank] = (epoch, ids)
    if not runs:
        raise AssertionError(f"no sample logs in {log_dir}")
    last = max(runs)
    missing = [s for s in range(1, last + 1) if s not in runs]
    if missing:
        raise AssertionError(f"steps never run: {missing[:10]}")
    seen: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    rollbacks = 0
    for step in range(1, last + 1):
        gens = runs[step]
        rollbacks += len(gens) - 1
        by_rank = gens[max(gens)]
        ranks = sorted(by_rank)
        if ranks != list(range(len(ranks))):
            raise AssertionError(f"step {step} generation {max(gens)}: ranks {ranks} logged, not 0..{len(ranks) - 1}")
        epochs_here = {e for e, _ in by_rank.values()}
        if len(epochs_here) != 1:
            raise AssertionError(f"step {step}: ranks disagree on the epoch: {sorted(epochs_here)}")
        (epoch,) = epochs_here
        for _, ids in by_rank.values():
            seen[epoch].update(ids)
    if sorted(seen) != list(range(epochs)):
        raise AssertionError(f"epochs in the log: {sorted(seen)}, expected 0..{epochs - 1}")
    total = 0
    for epoch, c in sorted(seen.items()):
        twice = [i for i, k in c.items() if k > 1]
        skipped = [i for i in range(num_samples) if c[i] == 0]
        if twice or skipped or len(c) != num_samples:
            raise AssertionError(
                f"epoch {epoch}: {len(skipped)} samples skipped (e.g. {skipped[:5]}), "
                f"{len(twice)} used more than once (e.g. {twice[:5]})"
            )
        total += sum(c.values())
    return {"steps": last, "samples": total, "rerun_steps": rollbacks}


def step_losses(log_dir: str) -> Dict[int, float]:
    """The loss of each step of the committed lineage, over the whole step: from the
    ``L <gen> <step> <rank> <loss_sum> <n>`` lines of examples/train.py
    (``--log-dir``), the run of the highest generation of each step, summed over its
    ranks and divided by the step's samples."""
    runs: Dict[int, Dict[int, Dict[int, Tuple[float, int]]]] = collections.defaultdict(dict)
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 6 or parts[0] != "L":
                    continue
                gen, step, rank = (int(x) for x in parts[1:4])
                runs[step].setdefault(gen, {})[rank] = (float(parts[4]), int(parts[5]))
    out: Dict[int, float] = {}
    for step, gens in runs.items():
        by_rank = gens[max(gens)]
        n = sum(k for _, k in by_rank.values())
        out[step] = sum(v for v, _ in by_rank.values()) / n if n else float("nan")
    return out


def last_change_step(log_dir: str) -> int:
    """The last step run by a generation other than the last one: after it the world
    no longer changed."""
    gens: Dict[int, int] = {}
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 6 and parts[0] == "L":
                    gen, step = int(parts[1]), int(parts[2])
                    gens[gen] = max(gens.get(gen, 0), step)
    if len(gens) < 2:
        return 0
    last = max(gens)
    return max(v for g, v in gens.items() if g != last)


def step_samples(log_dir: str) -> Dict[int, List[int]]:
    """The samples of each step of the committed lineage (the run of the highest
    generation of each step, all its ranks), sorted."""
    runs: Dict[int, Dict[int, List[int]]] = collections.defaultdict(dict)
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 5 or parts[0] != "S":
                    continue
                gen, step = int(parts[1]), int(parts[2])
                runs[step].setdefault(gen, []).extend(int(x) for x in parts[5:])
    return {step: sorted(gens[max(gens)]) for step, gens in runs.items()}


# The tolerance schedule of an elastic run against a static one, measured by the
# failure matrix (wrappers/bft-run/tests/faults.py, LOSS_RTOL): relative 1e-3 per step
# through the changes of world and SETTLE_STEPS steps on, then compare_losses's looser
# bounds.
STRICT_RTOL = 1e-3
SETTLE_STEPS = 50


def compare_runs(elastic_dir: str, static_dir: str, rtol: Optional[float] = None) -> Dict[str, float]:
    """Two runs of the same training from their ``--log-dir``s (the static one may stop
    early: a prefix of the elastic run's steps): every step took the same
    samples in both (whatever the worlds, the splits, the rollbacks) and its loss is the
    same within compare_losses's bounds: in fp32 (``rtol`` None) STRICT_RTOL up to
    SETTLE_STEPS steps after the elastic run's last change of world, then the looser
    ones; with ``rtol`` (float64, where the order of a sum no longer shows), ``rtol`` at
    every step."""
    mine, theirs = step_samples(elastic_dir), step_samples(static_dir)
    if sorted(theirs) != list(range(1, len(theirs) + 1)) or not set(theirs) <= set(mine):
        raise AssertionError(
            f"the static run's steps are not a prefix of the elastic run's: {len(theirs)} steps "
            f"up to {max(theirs, default=0)}, the elastic run {len(mine)}"
        )
    for step in sorted(theirs):
        if mine[step] != theirs[step]:
            diff = sorted(set(mine[step]) ^ set(theirs[step]))
            raise AssertionError(
                f"step {step}: {len(mine[step])} samples in the elastic run, {len(theirs[step])} in the "
                f"static one, differing in {diff[:10]}"
            )
    losses = step_losses(elastic_dir), step_losses(static_dir)
    if rtol is not None:
        return compare_losses(*losses, rtol)
    until = last_change_step(elastic_dir) + SETTLE_STEPS
    same = compare_losses(*losses, STRICT_RTOL, until)
    same["strict_until_step"] = until
    return same


def compare_losses(
    elastic: Dict[int, float],
    static: Dict[int, float],
    rtol: float,
    until: Optional[int] = None,
    rtol_after: float = 1e-2,
    window: int = 300,
    tail_rtol: float = 0.1,
) -> Dict[str, float]:
    """Every step of the static run was run by the elastic one, with a loss equal
    within ``rtol`` relative to the step's loss, or to a thousandth of the first step's
    loss where the loss has fallen below that: near convergence the loss is tiny and
    the last bits of a sum taken in another order (other world sizes) dominate it
    (seen: 6e-7 apart at a loss of 0.005 after 2,800 steps, 45.6 at the start).

    Where ``until`` is given (the world no longer changed after it), only the fp32
    drift of sums taken in another order remains, and it grows chaotically with the
    steps: the next ``window`` steps are judged at ``rtol_after``, and the steps after
    those not one by one but by their mean loss, within ``tail_rtol`` (measured: a
    single step 2e-2 apart, 1,000 steps after the last change, at a loss of 0.004). A
    lost or doubled sample, which only a change of the world can cause, falls in the
    strict part; exactly-once is checked apart. Returns the step count and the largest
    difference (up to ``until``)."""
    if not static:
        raise AssertionError("the static run logged no losses")
    missing = sorted(set(static) - set(elastic))
    if missing:
        raise AssertionError(f"steps of the static run missing from the elastic one: {missing[:10]}")
    floor = max(abs(static[min(static)]) * 1e-3, 1e-12)
    worst, at = 0.0, 0
    tail = []
    for step, ref in sorted(static.items()):
        if until is not None and step > until + window:
            tail.append(step)
            continue
        d = abs(elastic[step] - ref) / max(abs(ref), floor)
        bound = rtol if until is None or step <= until else rtol_after
        if d > worst and bound == rtol:
            worst, at = d, step
        if d > bound:
            raise AssertionError(
                f"step {step}: loss {elastic[step]!r} elastic against {ref!r} static, "
                f"relative difference {d:.2e} over {bound:.0e}"
            )
    if tail:
        mine = sum(elastic[s] for s in tail) / len(tail)
        theirs = sum(static[s] for s in tail) / len(tail)
        d = abs(mine - theirs) / max(abs(theirs), floor)
        if d > tail_rtol:
            raise AssertionError(
                f"steps {tail[0]}-{tail[-1]}: mean loss {mine!r} elastic against {theirs!r} "
                f"static, relative difference {d:.2e} over {tail_rtol:.0e}"
            )
    return {"steps": len(static), "max_rel_diff": worst, "at_step": at}


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--compare":
        bound = float(sys.argv[4]) if len(sys.argv) == 5 else None
        print(f"samples and losses as a static run: {compare_runs(sys.argv[2], sys.argv[3], bound)}")
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--last-change":
        print(last_change_step(sys.argv[2]))
        sys.exit(0)
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    r = check(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    print(f"ok: {r['steps']} steps, {r['samples']} samples, each sample once per epoch; {r['rerun_steps']} step runs rolled back")
