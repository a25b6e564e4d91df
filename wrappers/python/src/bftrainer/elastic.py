"""Generations, process groups and the run wrapper.

The coordinator (in bft-run) announces generations; the workers switch together at a
step boundary. Beside the gradient all-reduce, each step all-reduces one small float64
tensor (this rank's sample count and "a newer generation was announced"), issued at
the same time. Every collective is asynchronous and waited for on the host
(``_wait``): when the coordinator says a member of the generation failed, or aborts
it, the wait gives up at once instead of hanging until a timeout. See docs/design.md,
"Elastic runtime".
"""

from __future__ import annotations

import atexit
import datetime
import faulthandler
import functools
import inspect
import os
import signal
import sys
import time
from typing import Any, Callable, Iterable, List, Mapping, NamedTuple, Optional, TypeVar

from . import _agent, transfer
from . import batch as _batch
from ._leftovers import LEFTOVERS
from .state import State

T = TypeVar("T")

PROGRESS_EVERY_S = 1.0

# A trace of the runtime's phases, for debugging and fault-injection tests: with
# BFT_TRACE=PATH every worker appends "time worker pid gen rank phase" at the start
# of each step's all-reduce ("step"), of each rebuild ("rebuild"), of each state
# transfer it sends or receives ("transfer"), and once a generation is entered
# ("entered"). BFT_TRACE_PAUSE="phase=seconds,..." makes workers wait that long at
# those points, so that a test can hit a short phase (a rebuild, a transfer) with a
# fault. Neither is meant for production runs.
_TRACE = os.environ.get("BFT_TRACE", "")
_PAUSE = {
    k: float(v)
    for k, _, v in (p.partition("=") for p in os.environ.get("BFT_TRACE_PAUSE", "").split(",") if "=" in p)
}


def trace(phase: str) -> None:
    if not _TRACE and not _PAUSE:
        return
    if _TRACE:
        rt = _rt()
        line = f"{time.time():.6f} {rt.worker} {os.getpid()} {rt.gen} {rt.rank} {phase}\n"
        fd = os.open(_TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    if phase in _PAUSE:
        time.sleep(_PAUSE[phase])


class DeviceChoice(NamedTuple):
    """Where a worker trains and how it talks to its peers."""

    device: str
    """``"cpu"`` or ``"cuda:N"`` (N among the devices this process sees)."""
    backend: str
    """``"nccl"`` or ``"gloo"``."""
    why: str
    """One line for the worker's log."""


BACKENDS = ("nccl", "gloo")


def _local_rank(env: Mapping[str, str]) -> int:
    for name in ("LOCAL_RANK", "BFT_LOCAL_RANK"):
        v = env.get(name)
        if v is None:
            continue
        if not (v.isascii() and v.isdigit()) or len(v) > 6:
            raise ValueError(f"{name}={v[:40]!r} is not a local rank (a whole number from 0); bft-run sets it")
        return int(v)
    return 0


def choose_device(env: Mapping[str, str], cuda_devices: int) -> DeviceChoice:
    """The device and backend of a worker, as torchrun users expect: every worker of a
    node sees all of the node's GPUs (CUDA_VISIBLE_DEVICES as Slurm set it) and takes
    the one of its LOCAL_RANK, with NCCL; without a CUDA device, the CPU with gloo.
    ``BFT_BACKEND`` (``nccl`` or ``gloo``) overrides the backend; with gloo on GPUs the
    model may still live on the GPU (gloo all-reduces CUDA tensors through the host),
    and several workers may then share one GPU, which NCCL refuses."""
    backend = env.get("BFT_BACKEND", "")
    if backend and backend not in BACKENDS:
        raise ValueError(f"BFT_BACKEND={backend[:40]!r} is not a backend; give one of: {', '.join(BACKENDS)}")
    local = _local_rank(env)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    seen = "unset" if visible is None else repr(visible[:200])
    if cuda_devices <= 0:
        if backend == "nccl":
            raise ValueError(f"BFT_BACKEND=nccl, but this worker sees no CUDA device (CUDA_VISIBLE_DEVICES {seen})")
        return DeviceChoice("cpu", "gloo", f"no CUDA device (CUDA_VISIBLE_DEVICES {seen}): gloo on the CPU")
    backend = backend or "nccl"
    index = local % cuda_devices
    shared = ""
    if local >= cuda_devices:
        if backend == "nccl":
            raise ValueError(
                f"local rank {local}, but this worker sees {cuda_devices} CUDA device(s) "
                f"(CUDA_VISIBLE_DEVICES {seen}): NCCL cannot put two ranks on one GPU; "
                "start one worker per GPU (bft-run's default) or set BFT_BACKEND=gloo"
            )
        shared = f", shared with local rank {index}"
    workers = env.get("LOCAL_WORLD_SIZE", "?")[:6]
    return DeviceChoice(
        f"cuda:{index}",
        backend,
        f"local rank {local} of {workers} on cuda:{index}{shared} "
        f"({cuda_devices} visible, CUDA_VISIBLE_DEVICES {seen}), {backend}",
    )


class PeerFailure(RuntimeError):
    """A collective failed because a peer went away; the run wrapper rolls back."""


def _is_peer_failure(e: BaseException) -> bool:
    """Whether ``e`` is a peer's failure, or was raised while one was being handled:
    torch's logging wrapper around ``dist.all_reduce(..., group=bftrainer.process_group())``
    asks ``get_backend`` of the group when the collective fails, and that raises a
    ValueError for a group outside torch's tables, with the peer failure as its
    context (a live test's job failed so, after a kill -9 during a script's own
    all-reduce)."""
    seen = 0
    while e is not None and seen < 8:
        if _is_peer_failure_itself(e):
            return True
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
        seen += 1
    return False


def _is_peer_failure_itself(e: BaseException) -> bool:
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
            for s in (
                "gloo",
                "Gloo",
                "NCCL",
                "Connection closed by peer",
                "Connection reset by peer",
                "Socket Timeout",
                "was abandoned (a member failed)",
            )
        )
    return False


class _Runtime:
    def __init__(self) -> None:
        self.agent = _agent.from_env()
        self.worker = os.environ.get("BFT_WORKER_ID", "standalone")
        self.gen = 0
        self.rank = 0
        self.world = 1
        self.members: List[str] = []
        self._store: Any = None
        self._flag: Optional[float] = None
        self._last_progress = 0.0
        # The store's and process groups' timeout: a safety net only; failures are
        # noticed through the coordinator (heartbeats, aborts) within seconds.
        self.pg_timeout = float(os.environ.get("BFT_PG_TIMEOUT", "1800"))
        self.sigterm = False
        # Where collectives' buffers live: the GPU with NCCL, else the CPU (None).
        self.device: Any = None
        self._choice: Optional[DeviceChoice] = None
        # A gradient all-reduce of this step succeeded: the optimizer may have stepped
        # since the last commit, so a failure now cannot roll back in place.
        self.dirty = False
        # Collectives of the current group issued and not seen complete: those a
        # failure abandons may stay stuck on a peer that gave up too; the group is
        # then kept until they end (_leftovers says why).
        self._inflight: List[Any] = []
        # Generations entered so far (a DDP built once rebuilds its reducer when this
        # moves), and the "switch" metadata of this generation's reductions: the one
        # issued since the last commit, and the one before it, read at this commit.
        self.entries = 0
        self._meta_cur: Optional["_Meta"] = None
        self._meta_prev: Optional["_Meta"] = None
        # This rank's samples and the whole step's since the last gradient reduction
        # (the sampler counts them; a DDP comm hook weighs by them).
        self.samples_local = 0
        self.samples_total = 0
        self._group: Any = None
        # Optimizer steps voted on in this generation (sharded: ``vote``).
        self._votes = 0
        if self.agent is not None:
            self.agent.listeners.append(self._watch)

    # -- the elastic group -----------------------------------------------------------

    def group(self) -> Any:
        """The process group that stays valid in every generation (``_groups``). Made
        at the first call: bftrainer.DistributedDataParallel's, or the first commit of a
        step that no library reduction carried (its flag-only pair, ``after_commit``).
        ``allreduce_gradients`` never uses it."""
        if self._group is None:
            import torch.distributed as dist

            from ._groups import ElasticGroup

            grp = ElasticGroup()
            self._group = grp
            if self.gen > 0 and dist.is_initialized():
                # Asked for inside a generation: it starts with the current one.
                grp.install(dist.group.WORLD, self.gen, self.device)
                self._watch()
        return self._group

    def _elastic_groups(self) -> List[Any]:
        """The elastic groups in use: DDP's and the HSDP mesh's two."""
        from . import _mesh

        groups = [self._group] if self._group is not None else []
        mesh = _mesh.current()
        if mesh is not None:
            groups.extend(mesh.groups())
        return groups

    def _watch(self) -> None:
        """From the agent's reader thread: when the coordinator's verdict says the
        current generation cannot complete its collectives (a member died, froze or
        left without warning, the generation was aborted, the agent is gone), fail
        them at once, in every elastic group. Off the step's path: nothing polls per
        step."""
        agent = self.agent
        groups = [g for g in self._elastic_groups() if g.real is not None]
        if agent is None or not groups:
            return
        why = agent.failed(groups[0].generation, self.members)
        if why is None and agent._closed is not None:
            why = f"lost the bft-run agent ({agent._closed})"
        if why is None and agent._ended is not None:
            why = "the job ended"
        if why is not None:
            nccl = self._choice is not None and self._choice.backend == "nccl"
            for grp in groups:
                grp.abort(why, real_abort=nccl)

    # -- process group -------------------------------------------------------------

    def store(self) -> Any:
        if self._store is None:
            assert self.agent is not None
            self._store = _agent.store_class()(self.agent, self.pg_timeout)
        return self._store

    def choice(self) -> DeviceChoice:
        """This worker's device and backend, chosen once (and said once on stderr); on
        a GPU it becomes torch's current device."""
        if self._choice is None:
            import torch

            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            c = choose_device(os.environ, n)
            if c.device.startswith("cuda"):
                torch.cuda.set_device(torch.device(c.device))
            print(f"bftrainer: worker {self.worker}: {c.why}", file=sys.stderr, flush=True)
            self._choice = c
        return self._choice

    def _pick_backend(self) -> str:
        return self.choice().backend

    def _rendezvous(self, g: _agent.Generation) -> bool:
        """Agree with the other members whether generation ``g`` forms: every member
        arrives (a counter in the coordinator's store), then one compare-and-set
        decides "go"; a member that sees a newer generation first decides "abandon"
        instead, and all follow the one decision. Members still in a long step arrive
        when it ends; nobody here judges them by time (liveness is the coordinator's:
        a dead or frozen member makes it announce a newer generation)."""
        agent = self.agent
        assert agent is not None
        # From here an abort of ``g`` concerns this worker: acknowledged at once.
        agent.current_gen = max(agent.current_gen, g.gen)
        prefix = f"g{g.gen}/"
        store = self.store()
        store.add(prefix + "arrived", 1)
        pause = 0.001
        while True:
            if store.check([prefix + "decision"]):
                return bool(store.get(prefix + "decision") == b"go")
            if store.add(prefix + "arrived", 0) >= len(g.members):
                return bool(store.compare_set(prefix + "decision", "", "go") == b"go")
            if agent.latest > g.gen:
                return bool(store.compare_set(prefix + "decision", "", "abandon") == b"go")
            agent.check()
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def enter(self, g: _agent.Generation, state: State) -> None:
        """Enter generation ``g`` (this worker is a member), or the newest one after it
        if ``g`` does not form: build the process group and make every member's state
        the same."""
        agent = self.agent
        assert agent is not None
        self.teardown()
        trace("rebuild")
        while True:
            while not self._rendezvous(g):
                g = self._next_generation(g.gen)
            self._init(g)
            why = self._rebuild_mesh(g)
            if why is None:
                break
            # HSDP trains whole nodes only: wait (no step) for the generation that
            # brings the missing worker back (its agent restarts it) or drops its node.
            print(f"bftrainer: worker {self.worker}: generation {g.gen} is not trained: {why}; "
                  "waiting for the next one", file=sys.stderr, flush=True)
            g = self._next_generation(g.gen)
            self.teardown()
        transfer.sync(state, self.rank, self.world, self.device, _wait)
        self._votes = 0
        # Every member holds the same commit now: the decided batch changes here for
        # all at once, and is committed (a rollback returns to it, a newcomer gets it).
        if _batch.apply(state, g.batch):
            if state.committed_step >= 0:
                state.save()
            if self.rank == 0 and state.sampler is not None:
                print(
                    f"bftrainer: generation {g.gen}: global batch {state.sampler.global_batch} from step {state.step}",
                    file=sys.stderr,
                    flush=True,
                )
        trace("entered")
        state.on_reset()
        # The first step of a generation is reported at once: bft-run measures a
        # rescale's cost up to it (the `up=`/`down=` of the job's Comment).
        self._last_progress = 0.0

    def _next_generation(self, after: int) -> _agent.Generation:
        """The next generation after ``after`` that lists this worker (a worker left
        out announces itself again, or leaves if it was asked to)."""
        agent = self.agent
        assert agent is not None
        g = agent.newer_than(after)
        if self.worker not in g.members:
            if self.sigterm:
                self.leave()
            agent.send({"t": "ready", "worker": self.worker})
            g = self._member_generation(g.gen)
        return g

    def _rebuild_mesh(self, g: _agent.Generation) -> Optional[str]:
        """With ``bftrainer.device_mesh()`` in use: this generation's groups under its
        two dimensions, or why the generation cannot train (see _mesh.rebuild)."""
        from . import _mesh

        m = _mesh.current()
        if m is None:
            return None
        why = m.rebuild(self.rank, self.world, [w.split(".")[0] for w in g.members], self.device, g.gen)
        # A verdict that came while the groups formed.
        self._watch()
        return why

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
        choice = self.choice()
        backend = choice.backend
        kwargs: dict = {}
        if backend == "nccl":
            # The GPU of this worker's local rank, current before the group forms;
            # where torch takes it, the group is bound to it (no guessing per rank).
            self.device = torch.device(choice.device)
            torch.cuda.set_device(self.device)
            if "device_id" in inspect.signature(dist.init_process_group).parameters:
                kwargs["device_id"] = self.device
        # The generation is current before the group forms: an abort of it during the
        # setup is acknowledged at once.
        assert self.agent is not None
        self.agent.current_gen = g.gen
        self.gen, self.rank, self.world, self.members = g.gen, rank, len(g.members), list(g.members)
        # For code written for torchrun: this generation's rank and size.
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(len(g.members))
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"g{g.gen}/pg", self.store()),
            rank=rank,
            world_size=len(g.members),
            timeout=datetime.timedelta(seconds=self.pg_timeout),
            **kwargs,
        )
        self._flag = None
        self._meta_cur = self._meta_prev = None
        self.samples_local = self.samples_total = 0
        self.entries += 1
        if self._group is not None:
            self._group.install(dist.group.WORLD, g.gen, self.device)
            # A verdict that came while the group formed.
            self._watch()

    # -- membership ------------------------------------------------------------------

    def join(self, state: State, after: int) -> None:
        """Wait for a generation newer than ``after`` that lists this worker, and enter
        it. A worker dropped from the membership announces itself again."""
        agent = self.agent
        assert agent is not None
        g = agent.newer_than(after)
        if self.worker not in g.members:
            agent.send({"t": "ready", "worker": self.worker})
            g = self._member_generation(g.gen)
        self.enter(g, state)

    def vote(self) -> None:
        """Before the optimizer steps, under HSDP with several workers a node: make the
        step commit on every worker of this node or on none. Each shard's gradients
        are reduced in a group of its own across nodes, so a peer's death can fail
        one shard's reduction and not its node mate's; the mate would step and commit
        while this worker rolls back, and the node would hold no whole replica. So
        each worker waits for its step's collectives to end (on a GPU, for the device:
        a host wait per step, the price of the guarantee) and asks its agent, which
        answers commit only when every worker of the node asked (bft-run's votes.rs).
        A "no" is a peer failure: the step is rolled back here as on the node mates."""
        from . import _mesh

        mesh = _mesh.current()
        agent = self.agent
        if agent is None or mesh is None or mesh.per_node < 2 or not mesh.places or self.gen == 0:
            return
        # This step's switch flag goes out first and is read before the vote: every
        # rank then switches at this very commit (a newcomer waits one step boundary,
        # not two as with the flag read a commit late), and a rank whose read fails
        # votes nothing, so its node rolls the step back.
        meta = _Meta(self, 0.0, self.device)
        try:
            for grp in mesh.groups():
                grp.settle()
        except RuntimeError as e:
            if _is_peer_failure(e):
                raise PeerFailure(f"the step's reductions: {e}") from e
            raise
        import torch

        if self.device is not None and getattr(self.device, "type", str(self.device)).startswith("cuda"):
            # The reductions are on the stream: wait for the device without blocking
            # out the verdict. An aborted communicator also ends its kernels (with
            # garbage), but only after the groups are marked broken, checked after.
            done = torch.cuda.Event()
            done.record()
            pause = 0.00005
            while not done.query():
                _check_alive("the step's reductions")
                time.sleep(pause)
                pause = min(pause * 2, 0.001)
            broken = next((g.broken for g in mesh.groups() if g.broken is not None), None)
            if broken is not None:
                raise PeerFailure(f"the step's reductions: {broken}")
        flag = meta.values()[1]
        k = self._votes
        self._votes += 1
        if not agent.vote(self.gen, k):
            raise PeerFailure(
                f"the step's commit: generation {self.gen} failed on this node before all its workers ended the step"
            )
        self._flag = flag

    def after_commit(self, state: State) -> None:
        self.dirty = False
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
            # Read the flag of the step before this one, complete long ago, so that
            # reading it never waits on the network or the device; every member reads
            # the same one, so all switch at the same step. A DDP step's reduction
            # carried this step's flag; else (HSDP, a script's own collectives) one
            # flag-only all-reduce goes out now, for the next commit (it was a blocking
            # all-reduce in every commit: a host wait per step).
            prev = self._meta_prev
            if self._meta_cur is not None:
                self._meta_prev, self._meta_cur = self._meta_cur, None
            else:
                self._meta_prev = _Meta(self, 0.0, self.device)
            changed = prev is not None and prev.values()[1] > 0
        if changed:
            t = torch.tensor([agent.latest], dtype=torch.int64, device=self.device)
            _wait(dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True), "the next generation's number")
            target = int(t.item())
            g = agent.generation(target)
            if self.worker not in g.members:
                self.leave()
            self.enter(g, state)
            return  # no step in the new generation yet: its first one is reported
        if self.rank == 0 and time.monotonic() - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = time.monotonic()
            msg = {"t": "progress", "worker": self.worker, "gen": self.gen, "samples": state.samples, "steps": state.step}
            if state.sampler is not None and state.sampler.global_batch:
                # The batch the rate is measured at: bftrainerd's batch decision needs it.
                msg["batch"] = state.sampler.global_batch
            agent.send(msg)

    def teardown(self) -> None:
        """Leave the current process group without waiting on it: after a failure a
        collective may still be stuck on a frozen peer (NCCL: the communicator is
        aborted; gloo: its thread ends when the peer's sockets close or at the
        timeout)."""
        import torch.distributed as dist

        self._meta_cur = self._meta_prev = None
        aborting = False
        ddp_works: List[Any] = []
        if self._group is not None:
            # Aborted by the watcher: on NCCL the real abort already runs in the
            # background and must not be waited for here.
            aborting = self._group.broken is not None
            _, ddp_works = self._group.retire()
        from . import _mesh

        mesh = _mesh.current()
        if mesh is not None:
            # Its groups' collectives a failure abandoned may be stuck on a peer that
            # gave up too: each real group is kept until they end (_leftovers).
            mesh_aborted = any(grp.broken is not None for grp in mesh.groups())
            for real, works in mesh.retire():
                LEFTOVERS.leave(real, works)
            aborting = aborting or mesh_aborted
        if not dist.is_initialized():
            return
        pg = dist.group.WORLD
        if dist.get_backend(pg) == "nccl" and not aborting:
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if abort is not None:
                try:
                    abort(pg)
                except Exception as e:  # noqa: BLE001 - best effort; say so
                    print(f"bftrainer: aborting the NCCL communicator failed: {e}", file=sys.stderr, flush=True)
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - an aborted group may refuse; it is left anyway
            print(f"bftrainer: leaving the old process group: {e}", file=sys.stderr, flush=True)
        LEFTOVERS.leave(pg, self._inflight + ddp_works)
        self._inflight = []

    def close(self) -> None:
        """At the interpreter's exit after a normal end: destroy the process group, as
        torch asks (ProcessGroupNCCL warns "destroy_process_group() was not called
        before program exit" from every worker otherwise). Not at the end of ``run``:
        the script may still use the group after it. A group with collectives not
        complete is kept and leaked instead (``_leftovers``: its destructor would wait
        for them); groups kept after earlier failures are no longer torch's to destroy,
        so they do not stand in the way."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        works = list(self._inflight)
        if self._group is not None:
            _, ddp_works = self._group.retire()
            works += ddp_works
        if any(not w.is_completed() for w in works):
            LEFTOVERS.leave(dist.group.WORLD, works)
            return
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - at exit; say so and go on
            print(f"bftrainer: destroying the process group at exit: {e}", file=sys.stderr, flush=True)

    def leave(self) -> None:
        """Not in the new generation: the step is committed, so leave without a rollback.
        At once: a group left after an earlier failure may still hold a collective stuck
        on a dead peer, and its destructor at interpreter exit would wait for it (the
        agent would kill this worker as hung). Output is flushed; atexit handlers and
        the like do not run for a leaver."""
        import torch.distributed as dist

        if dist.is_initialized() and not LEFTOVERS:
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


_RT: Optional[_Runtime] = None


def _rt() -> _Runtime:
    global _RT
    if _RT is None:
        _RT = _Runtime()
    return _RT


def _wait(work: Any, what: str) -> None:
    """Wait for an asynchronous collective on the host, giving up with PeerFailure as
    soon as the coordinator says this generation cannot complete it (a member died,
    froze or left without warning, or the generation was aborted). NCCL returns
    from an aborted operation with garbage: its result is never used after that."""
    rt = _rt()
    agent = rt.agent
    pause = 0.0001
    rt._inflight.append(work)
    while not work.is_completed():
        if agent is not None:
            why = agent.failed(rt.gen, rt.members)
            if why is not None:
                raise PeerFailure(f"{what}: {why}")
            agent.check()
        time.sleep(pause)
        pause = min(pause * 2, 0.002)
    rt._inflight.remove(work)
    try:
        work.wait()
    except RuntimeError as e:
        if _is_peer_failure(e):
            raise PeerFailure(f"{what}: {e}") from e
        raise


class _Meta:
    """One reduction's float64 pair [this rank's samples, "a newer generation was
    announced"], all-reduced on the elastic group beside the gradients (counts never
    ride in the gradients' dtype, where bf16 would round them). On a GPU its result is
    copied to pinned host memory behind an event, so that a later read waits for that
    copy only, never for the device's queue."""

    def __init__(self, rt: "_Runtime", n_local: float, device: Any) -> None:
        import torch

        seen = 1.0 if rt.agent is not None and rt.agent.latest > rt.gen else 0.0
        self.tensor = torch.tensor([float(n_local), seen], dtype=torch.float64, device=device)
        self.future = rt.group().allreduce_future(self.tensor)
        self._event: Any = None
        self._host: Any = None
        if self.tensor.is_cuda:
            self._host = torch.empty(2, dtype=torch.float64, pin_memory=True)
            self._event = torch.cuda.Event()

            def copy(f: Any) -> Any:
                self._host.copy_(self.tensor, non_blocking=True)
                self._event.record()
                return f.value()

            self.future = self.future.then(copy)

    def values(self) -> List[float]:
        """(samples of the whole step, flag); PeerFailure if the reduction failed."""
        try:
            self.future.wait()
        except RuntimeError as e:
            if _is_peer_failure(e):
                raise PeerFailure(f"the step's metadata: {e}") from e
            raise
        if self._event is not None:
            self._event.synchronize()
            return [float(x) for x in self._host.tolist()]
        return [float(x) for x in self.tensor.tolist()]


def _count_samples(n_local: int, n_step: int) -> None:
    """The sampler took a slice: this rank's samples and the whole step's."""
    rt = _rt()
    rt.samples_local += n_local
    rt.samples_total += n_step


def _check_alive(what: str) -> None:
    """Before a collective: a generation already known to be broken is not entered."""
    rt = _rt()
    if rt.agent is not None:
        why = rt.agent.failed(rt.gen, rt.members)
        if why is not None:
            raise PeerFailure(f"{what}: {why}")


def _before_optimizer_step() -> None:
    _rt().vote()


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


def device() -> Any:
    """The torch device this worker trains on: ``cuda:LOCAL_RANK`` (made current) when
    it sees CUDA devices, else the CPU. Put the model and the batches there. The first
    call says on stderr what was chosen and why (see ``choose_device``)."""
    import torch

    return torch.device(_rt().choice().device)


def process_group() -> Any:
    """The process group that stays valid in every generation: build torch objects on
    it once (DDP, a DeviceMesh); the runtime swaps its real group (gloo or NCCL) at
    step boundaries and fails its collectives at once when a peer fails."""
    return _rt().group()


def backend() -> str:
    """The torch.distributed backend of this worker: ``nccl`` or ``gloo``."""
    return _rt().choice().backend


def allreduce_gradients(params: Iterable[Any], n_local: int) -> int:
    """Average the gradients over all ranks, weighted by each rank's sample count
    (``n_local`` may be 0 on a rank whose slice of the step is empty: it contributes
    zero). Returns the samples of the whole step. One flat all-reduce of the
    gradients and, beside it, one of a float64 pair (the sample count and the "new
    generation announced" flag that ``commit()`` reads: counts never ride in the
    gradients' dtype, where bf16 would round them)."""
    import torch
    import torch.distributed as dist

    if hasattr(params, "parameters"):
        params = params.parameters()  # type: ignore[union-attr]
    ps = [p for p in params if p.requires_grad]
    rt = _rt()
    if not dist.is_initialized():
        return n_local
    trace("step")
    _check_alive("the gradient all-reduce")
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ps]
    seen = 1.0 if rt.agent is not None and rt.agent.latest > rt.gen else 0.0
    flat = torch.cat([g.reshape(-1) for g in grads])
    flat.mul_(float(n_local))
    meta = torch.tensor([float(n_local), seen], dtype=torch.float64, device=flat.device)
    w1 = dist.all_reduce(flat, async_op=True)
    w2 = dist.all_reduce(meta, async_op=True)
    # Queued behind w1 (or run beside it): pending too if w1's wait gives up.
    rt._inflight.append(w2)
    _wait(w1, "the gradient all-reduce")
    _wait(w2, "the gradient all-reduce")
    rt._inflight.remove(w2)
    total = float(meta[0].item())
    rt._flag = float(meta[1].item())
    rt.dirty = True
    if total > 0:
        flat.div_(total)
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
            result = func(state, *args, **kwargs)
            state.wait_checkpoint()
            return result
        agent = rt.agent

        def on_term(signum: int, frame: Any) -> None:
            # A graceful leave at the next step boundary: the coordinator leaves this
            # worker out of the next generation (told from the heartbeat thread).
            rt.sigterm = True
            agent.request_leave()

        signal.signal(signal.SIGTERM, on_term)
        # `kill -USR1` prints every thread's Python stack on stderr (in bft-run's log):
        # how to see where a stuck worker is. Only where SIGUSR1 would otherwise end
        # the process; a handler the user installed stays.
        if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        try:
            state.load_checkpoint()
            agent.send({"t": "ready", "worker": rt.worker})
            join_after: Optional[int] = 0
            while True:
                failure = ""
                try:
                    if join_after is not None:
                        rt.join(state, join_after)
                        join_after = None
                    result = func(state, *args, **kwargs)
                    state.wait_checkpoint()
                    agent.send({"t": "done", "worker": rt.worker, "gen": rt.gen})
                    atexit.register(rt.close)
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
                # The groups first: their collectives still pending fail then, and
                # FSDP's reset (in restore) waits for its own.
                rt.teardown()
                state.restore(dirty=rt.dirty)
                rt.dirty = False
                agent.broken(rt.gen)
                join_after = rt.gen
        except _agent.JobEnded as e:
            if e.code == 0:
                atexit.register(rt.close)
            raise SystemExit(0 if e.code == 0 else 1) from None

    return wrapper
