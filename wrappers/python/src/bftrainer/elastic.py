"""Generations, process groups and the run wrapper.

The coordinator (in bft-run) announces generations; the workers switch together at a
step boundary. The gradient all-reduce carries two extra numbers (this rank's sample
count and "a newer generation was announced"), so steady state costs no collective
beyond the one training needs. See docs/design.md, "Elastic runtime".
"""

from __future__ import annotations

import datetime
import functools
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, Iterable, Optional, TypeVar

from . import _agent
from .state import State, from_bytes, to_bytes

T = TypeVar("T")

PROGRESS_EVERY_S = 1.0


class PeerFailure(RuntimeError):
    """A collective failed because a peer went away; the run wrapper rolls back."""


def _is_peer_failure(e: BaseException) -> bool:
    if isinstance(e, PeerFailure):
        return True
    try:
        import torch.distributed as dist

        dist_error = getattr(dist, "DistError", None)
        if dist_error is not None and isinstance(e, dist_error):
            return True
    except ImportError:  # pragma: no cover
        return False
    if isinstance(e, RuntimeError):
        text = str(e)
        return any(
            s in text
            for s in ("gloo", "Gloo", "NCCL", "Connection closed by peer", "Connection reset by peer", "Socket Timeout")
        )
    return False


class _Runtime:
    def __init__(self) -> None:
        self.agent = _agent.from_env()
        self.worker = os.environ.get("BFT_WORKER_ID", "standalone")
        self.gen = 0
        self.rank = 0
        self.world = 1
        self.store_addr = ""
        self._own_store: Any = None
        self._stores: Dict[str, Any] = {}
        self._flag: Optional[float] = None
        self._last_progress = 0.0
        self.pg_timeout = float(os.environ.get("BFT_PG_TIMEOUT", "60"))
        self.backend = os.environ.get("BFT_BACKEND", "")
        self.sigterm = False
        self.device: Any = None

    # -- process group -------------------------------------------------------------

    def start_store(self) -> None:
        import torch.distributed as dist

        addr = os.environ.get("BFT_NODE_ADDR", "127.0.0.1")
        self._own_store = dist.TCPStore(
            addr, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=self.pg_timeout)
        )
        self.store_addr = f"{addr}:{self._own_store.port}"
        self._stores[self.store_addr] = self._own_store

    def _store(self, addr: str) -> Any:
        import torch.distributed as dist

        if addr not in self._stores:
            host, _, port = addr.rpartition(":")
            self._stores[addr] = dist.TCPStore(
                host, int(port), is_master=False, timeout=datetime.timedelta(seconds=self.pg_timeout)
            )
        return self._stores[addr]

    def _pick_backend(self) -> str:
        import torch

        if self.backend:
            return self.backend
        if torch.cuda.is_available():
            return "nccl"
        return "gloo"

    def _rendezvous(self, g: _agent.Generation) -> bool:
        """Agree with the other members whether generation ``g`` forms: every member
        arrives (a counter in rank 0's store), then one compare-and-set decides "go";
        a member that sees a newer generation first decides "abandon" instead, and all
        follow the one decision. Without this, members that picked different
        generations (a newer one announced meanwhile) would wait for each other until
        the process-group timeout."""
        agent = self.agent
        assert agent is not None
        prefix = f"g{g.gen}/"
        try:
            store = self._store(g.store)
            store.add(prefix + "arrived", 1)
            said_broken = False
            start = time.monotonic()
            while True:
                if store.check([prefix + "decision"]):
                    return bool(store.get(prefix + "decision") == b"go")
                if store.add(prefix + "arrived", 0) >= len(g.members):
                    return bool(store.compare_set(prefix + "decision", "", "go") == b"go")
                if agent.latest > g.gen:
                    return bool(store.compare_set(prefix + "decision", "", "abandon") == b"go")
                agent.check()
                waited = time.monotonic() - start
                if waited > 2.0 and not said_broken:
                    # A member does not come: let the coordinator re-form without it.
                    agent.send({"t": "broken", "worker": self.worker, "gen": g.gen})
                    said_broken = True
                if waited > self.pg_timeout:
                    raise _agent.AgentError(f"generation {g.gen} did not form within {self.pg_timeout:.0f} s")
                time.sleep(0.005)
        except RuntimeError as e:
            if isinstance(e, _agent.AgentError):
                raise
            # Rank 0's store is gone (it died): wait for the next generation.
            self._stores.pop(g.store, None)
            agent.wait(lambda: agent.latest > g.gen, self.pg_timeout, f"a generation after {g.gen}")
            return False

    def enter(self, g: _agent.Generation, state: State) -> None:
        """Enter generation ``g`` (this worker is a member), or the newest one after it
        if ``g`` does not form: build the process group and make every member's state
        the same."""
        agent = self.agent
        assert agent is not None
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        while not self._rendezvous(g):
            g = agent.newer_than(g.gen)
            if self.worker not in g.members:
                if self.sigterm:
                    self.leave()
                agent.send({"t": "ready", "worker": self.worker, "store": self.store_addr})
                g = self._member_generation(g.gen)
        self._init(g)
        self._sync(state)
        state.on_reset()

    def _member_generation(self, after: int) -> _agent.Generation:
        agent = self.agent
        assert agent is not None
        while True:
            g = agent.newer_than(after)
            if self.worker in g.members:
                return g
            after = g.gen

    def _init(self, g: _agent.Generation) -> None:
        import torch
        import torch.distributed as dist

        rank = g.rank_of(self.worker)
        assert rank is not None
        backend = self._pick_backend()
        if backend == "nccl" and self.device is None:
            local = int(os.environ.get("BFT_LOCAL_RANK", "0"))
            torch.cuda.set_device(local % max(1, torch.cuda.device_count()))
            self.device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"g{g.gen}/pg", self._store(g.store)),
            rank=rank,
            world_size=len(g.members),
            timeout=datetime.timedelta(seconds=self.pg_timeout),
        )
        self.gen, self.rank, self.world = g.gen, rank, len(g.members)
        self._flag = None

    def _sync(self, state: State) -> None:
        import torch.distributed as dist

        steps: list = [None] * self.world
        dist.all_gather_object(steps, state.committed_step)
        top = max(steps)
        if top >= 0 and all(s == top for s in steps):
            return  # every member holds the same commit: nothing to send
        src = steps.index(top)
        payload = [to_bytes(state.committed() or state.state_dict()) if self.rank == src else None]
        dist.broadcast_object_list(payload, src=src, device=self.device)
        if state.committed_step != top:
            state.load_state_dict(from_bytes(payload[0]))
            state.save()

    # -- membership ------------------------------------------------------------------

    def join(self, state: State, after: int) -> None:
        """Wait for a generation newer than ``after`` that lists this worker, and enter
        it. A worker dropped from the membership announces itself again."""
        agent = self.agent
        assert agent is not None
        g = agent.newer_than(after)
        if self.worker not in g.members:
            agent.send({"t": "ready", "worker": self.worker, "store": self.store_addr})
            g = self._member_generation(g.gen)
        self.enter(g, state)

    def after_commit(self, state: State) -> None:
        agent = self.agent
        if agent is None:
            return
        agent.check()
        import torch
        import torch.distributed as dist

        if self._flag is not None:
            changed = self._flag > 0
            self._flag = None
        else:
            t = torch.tensor([1.0 if agent.latest > self.gen else 0.0], device=self.device)
            _collective(dist.all_reduce, t)
            changed = t.item() > 0
        if changed:
            t = torch.tensor([agent.latest], dtype=torch.int64, device=self.device)
            _collective(dist.all_reduce, t, op=dist.ReduceOp.MAX)
            target = int(t.item())
            g = agent.generation(target, timeout=self.pg_timeout)
            if self.worker not in g.members:
                self.leave()
            self.enter(g, state)
        if self.rank == 0 and time.monotonic() - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = time.monotonic()
            agent.send({"t": "progress", "worker": self.worker, "gen": self.gen, "samples": state.samples})

    def teardown(self) -> None:
        """Destroy the process group and everything that still refers to it."""
        import gc

        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()

    def leave(self) -> None:
        """Not in the new generation: the step is committed, so leave without a rollback."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        raise SystemExit(0)


_RT: Optional[_Runtime] = None


def _rt() -> _Runtime:
    global _RT
    if _RT is None:
        _RT = _Runtime()
    return _RT


def _collective(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:
        if _is_peer_failure(e):
            raise PeerFailure(str(e)) from e
        raise


def _after_commit(state: State) -> None:
    _rt().after_commit(state)


def rank() -> int:
    """This worker's rank in the current generation."""
    return _rt().rank


def world_size() -> int:
    """Workers in the current generation."""
    return _rt().world


def generation() -> int:
    """The current generation number (0 before the first)."""
    return _rt().gen


def worker_id() -> str:
    return _rt().worker


def allreduce_gradients(params: Iterable[Any], n_local: int) -> int:
    """Average the gradients over all ranks, weighted by each rank's sample count
    (``n_local`` may be 0 on a rank whose slice of the step is empty: it contributes
    zero). Returns the samples of the whole step. One flat all-reduce, which also
    carries the "new generation announced" flag that ``commit()`` reads."""
    import torch
    import torch.distributed as dist

    if hasattr(params, "parameters"):
        params = params.parameters()  # type: ignore[union-attr]
    ps = [p for p in params if p.requires_grad]
    rt = _rt()
    if not dist.is_initialized():
        return n_local
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ps]
    seen = 1.0 if rt.agent is not None and rt.agent.latest > rt.gen else 0.0
    flat = torch.cat([g.reshape(-1) for g in grads] + [torch.tensor([1.0, seen], dtype=grads[0].dtype, device=grads[0].device)])
    flat[:-2].mul_(float(n_local))
    flat[-2] = float(n_local)
    _collective(dist.all_reduce, flat)
    total = float(flat[-2].item())
    rt._flag = float(flat[-1].item())
    if total > 0:
        flat[:-2].div_(total)
    offset = 0
    for p in ps:
        n = p.numel()
        chunk = flat[offset : offset + n].view_as(p)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += n
    return int(round(total))


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Decorate the training function ``func(state, ...)``: it is called once the
    worker is in a generation, and called again after a rollback (a peer died). It must
    resume from ``state`` (step, sampler position, extras)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
        rt = _rt()
        if rt.agent is None:
            print(
                "bftrainer: not started by bft-run (BFT_AGENT_SOCK is not set): training alone, world size 1",
                file=sys.stderr,
                flush=True,
            )
            state.load_checkpoint()
            return func(state, *args, **kwargs)
        agent = rt.agent

        def on_term(signum: int, frame: Any) -> None:
            # The agent turns SIGTERM into a graceful leave at the next step boundary.
            rt.sigterm = True

        signal.signal(signal.SIGTERM, on_term)
        try:
            state.load_checkpoint()
            rt.start_store()
            agent.send({"t": "ready", "worker": rt.worker, "store": rt.store_addr})
            join_after: Optional[int] = 0
            while True:
                failure = ""
                try:
                    if join_after is not None:
                        rt.join(state, join_after)
                        join_after = None
                    result = func(state, *args, **kwargs)
                    agent.send({"t": "done", "worker": rt.worker, "gen": rt.gen})
                    return result
                except Exception as e:
                    if not _is_peer_failure(e):
                        raise
                    failure = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
                # Out of the except block, so that the exception's traceback (which
                # holds the failed collective and with it the process group's sockets)
                # is freed: tearing the group down must close those sockets, or a peer
                # blocked on this worker waits for the process-group timeout.
                print(
                    f"bftrainer: worker {rt.worker}: a peer failed in generation {rt.gen} "
                    f"({failure}); rolling back to step {state.committed_step}",
                    file=sys.stderr,
                    flush=True,
                )
                state.restore()
                rt.teardown()
                agent.send({"t": "broken", "worker": rt.worker, "gen": rt.gen})
                join_after = rt.gen
        except _agent.JobEnded as e:
            raise SystemExit(0 if e.code == 0 else 1) from None

    return wrapper
