"""A group let go of with a collective stuck on a peer is kept until the collective
ends: its destructor would wait for it (until the group's timeout), and the runtime
dropping such a group hung a restarted worker in the failure matrix."""

import datetime
import threading

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from bftrainer._leftovers import Leftovers  # noqa: E402


def two_ranks():
    """Two gloo groups of one world of 2, in this process (rank 0 and rank 1)."""
    store = dist.HashStore()
    groups = [None, None]

    def make(rank):
        groups[rank] = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=120))

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return groups


def test_a_group_with_a_pending_collective_is_kept_until_it_ends():
    g0, g1 = two_ranks()
    left = Leftovers()
    # Rank 1 all-reduces; rank 0 has not (a peer that gave up on the step).
    stuck = g1.allreduce([torch.ones(4)])
    assert not stuck.is_completed()
    left.leave(g1, [stuck])
    left.prune()
    assert len(left) == 1, "dropped while its all-reduce is pending: the destructor would wait for it"
    # Its peer's side comes: the collective ends, and the group is let go of.
    g0.allreduce([torch.ones(4)]).wait()
    stuck.wait()
    left.prune()
    assert len(left) == 0
    # A group whose collectives all ended is dropped at once.
    done = g0.allreduce([torch.ones(1)])
    g1.allreduce([torch.ones(1)]).wait()
    done.wait()
    left.leave(g0, [done])
    assert len(left) == 0


EXITING = """
import datetime, threading, torch, torch.distributed as dist
from bftrainer._leftovers import LEFTOVERS
store = dist.HashStore()
g = [None, None]
def make(r):
    g[r] = dist.ProcessGroupGloo(store, r, 2, datetime.timedelta(seconds=600))
ts = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
[t.start() for t in ts]
[t.join() for t in ts]
# Each rank waits on a collective the other never matches.
stuck = [g[0].broadcast([torch.ones(4)], dist.BroadcastOptions()), g[1].allreduce([torch.ones(4)])]
LEFTOVERS.leave(g[0], [stuck[0]])
LEFTOVERS.leave(g[1], [stuck[1]])
del g, stuck
print("leaving", flush=True)
"""


def test_a_worker_with_stuck_groups_exits_without_waiting_for_them():
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.Popen([sys.executable, "-c", EXITING], env=env, stdout=subprocess.PIPE, text=True)
    try:
        # Their destructors would wait out the groups' 600 s timeout.
        out, _ = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("the process waited for its stuck groups at exit")
    assert p.returncode == 0 and "leaving" in out
