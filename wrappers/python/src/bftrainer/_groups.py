"""A process group that outlives generations: torch objects built once on it (DDP, a
DeviceMesh) stay valid while the runtime swaps the real group underneath.

Interface (used by elastic.py, ddp.py and the HSDP mesh):

- ``ElasticGroup(name, rank, size)``: a ``torch.distributed.ProcessGroup`` subclass.
  Before the first generation (and between generations) ``rank()``/``size()`` say
  ``rank``/``size`` (default 0 and 1: a world of one, whose collectives act locally;
  the HSDP mesh's shard dimension says this worker's place in its node, which
  ``fully_shard`` reads when it shards the model, and refuses collectives then).
- ``group.install(real, gen)``: at a step boundary, the runtime hands it this
  generation's real group (gloo or NCCL). ``rank()``/``size()`` follow it.
- ``group.retire()``: the runtime leaves the generation; returns the old real group
  and its operations not seen complete (for ``_leftovers``: a group is kept until
  they end, its destructor would wait for them).
- ``group.abort(why)``: from any thread (the agent's reader, when the coordinator says
  the generation is broken): every pending and later collective of this generation
  fails at once with ``PeerFailure`` (the text carries ``ABANDONED``), without waiting
  on the real group. On NCCL the real communicator is aborted in a background thread,
  so the next generation's group is made while the old one is still being torn down.
- Collectives (``allreduce``, ``broadcast``, ``allgather``, ``_allgather_base``,
  ``reduce_scatter``, ``_reduce_scatter_base``, ``barrier``, ...) delegate to the real
  group; the ``Work`` returned is backed by a future of ours, so an abort completes it
  with an error even while the real operation hangs on a frozen peer.
  ``allreduce_future(tensor, op)`` returns that future directly (DDP comm hooks).
  FSDP2's ``all_gather_single`` and ``reduce_scatter_single`` are among them.
  On gloo one thread of ours (for all groups) completes those futures (``_Watcher``);
  on NCCL the real future's callback does.

torchft's reconfigurable process groups (a wrapper whose backend is replaced at each
quorum, DDP given a dummy group and a comm hook) are the model; the code is ours.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.futures import Future

#: In every error of an abandoned collective (elastic._is_peer_failure matches it).
ABANDONED = "was abandoned (a member failed)"


class _Pending:
    __slots__ = ("future", "done")

    def __init__(self, future: Future) -> None:
        self.future = future
        self.done = False


class ElasticGroup(dist.ProcessGroup):
    """See the module's docstring."""

    def __init__(self, name: str = "bftrainer-elastic", rank: int = 0, size: int = 1) -> None:
        # The C++ side's rank and size stay those given: torch's Python code asks
        # rank() and size(), which follow the generation.
        super().__init__(rank, size)
        self._name = name
        self._lock = threading.Lock()
        self._real: Any = None
        self._gen = 0
        self._rank0, self._size0 = rank, size
        self._rank = rank
        self._size = size
        self._broken: Optional[str] = None
        self._pending: Dict[int, _Pending] = {}
        self._ids = 0
        self._device: Optional[torch.device] = None
        #: The real operations of this generation not seen complete, by key: the
        #: runtime keeps the real group until they end (_leftovers); `_complete` drops
        #: each as it ends. (A list pruned by `is_completed()` grew by every gloo
        #: reduce-scatter, whose flag stays false: tensors held and a scan per
        #: collective, a step slower with every step, until the generation ended.)
        self._works: Dict[int, Any] = {}
        #: This generation's thread for operations waited for by blocking (_Waiter).
        self._waiter: Optional[_Waiter] = None
        #: Register with torch.distributed (a DeviceMesh/FSDP2 needs it): off by
        #: default. It was blamed for a survivor's abort after a kill -9 (gloo's
        #: IoException) that the Python callbacks then run in gloo's threads also
        #: cause (see _Watcher); not tried again since.
        self.register_with_torch = False

    # -- generations -------------------------------------------------------------------

    def install(self, real: Any, gen: int, device: Optional[torch.device] = None) -> None:
        """Make ``real`` (this generation's group) the one collectives run on."""
        with self._lock:
            self._real = real
            self._gen = gen
            self._rank = real.rank()
            self._size = real.size()
            self._broken = None
            self._device = device
        if self.register_with_torch:
            self._register_c10d(real)

    def _register_c10d(self, real: Any) -> None:
        """Make the group known to torch.distributed's registry, with the real group
        as its backend for the device: DeviceMesh.from_group and FSDP2's collectives
        (which dispatch in C++, past the Python methods below) then run on the current
        generation's group. Checked by experiment on torch 2.15 (gloo): a 1-D mesh from
        this group, fully_shard on it, forward/backward in two generations."""
        from torch.distributed import distributed_c10d as c10d

        world = c10d._world
        name = self.group_name
        world.pg_group_ranks[self] = {i: i for i in range(self._size)}
        if self not in world.pg_map:
            world.pg_map[self] = ("bftrainer", None)
            world.pg_names[self] = name
            c10d._register_process_group(name, self)
        self._register_backends(real)

    def _register_backends(self, real: Any) -> None:
        """The real group's backends as this group's, by device: torch's C++ paths
        that take a group's backend directly (DTensor's functional collectives, as in
        ``full_tensor()``) use the current generation's. Those bypass ``abort``; the
        step's collectives (DDP's, FSDP2's) go through the methods below."""
        kind = {"gloo": dist.ProcessGroup.BackendType.GLOO, "nccl": dist.ProcessGroup.BackendType.NCCL}
        backend_name = real.name() if hasattr(real, "name") else ""
        bt = kind.get(str(backend_name).lower())
        if bt is None:
            return
        for dev in ("cpu", "cuda") if bt == dist.ProcessGroup.BackendType.GLOO else ("cuda",):
            try:
                be = real._get_backend(torch.device(dev)) if hasattr(real, "_get_backend") else real
            except Exception:  # noqa: BLE001 - the real group has no backend for that device
                continue
            self._register_backend(torch.device(dev), bt, be)
        self._set_default_backend(bt)

    def retire(self) -> Tuple[Any, List[Any]]:
        """Leave the current generation: later collectives act locally until the next
        ``install``. Returns the old real group (or None) and its operations not seen
        complete (the caller keeps the group until they end: ``_leftovers``)."""
        with self._lock:
            real, self._real = self._real, None
            self._broken = None
            self._rank, self._size = self._rank0, self._size0
            pending = list(self._pending.values())
            self._pending.clear()
            works, self._works = self._works, {}
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.close()
        for p in pending:
            self._fail(p, "its generation ended")
        self._unregister_c10d()
        return real, [w for w in works.values() if not w.is_completed()]

    def settle(self) -> None:
        """Wait for this generation's collectives issued so far (on gloo: until they
        end; on NCCL: until they are on the stream) and raise the first failure."""
        with self._lock:
            futures = [p.future for p in self._pending.values()]
        for f in futures:
            f.wait()

    def _unregister_c10d(self) -> None:
        """Out of torch.distributed's registry between generations: the runtime's
        ``destroy_process_group()`` (all groups) must not shut this one down."""
        from torch.distributed import distributed_c10d as c10d

        world = c10d._world
        if self in world.pg_map:
            world.pg_map.pop(self, None)
            world.pg_names.pop(self, None)
            world.pg_group_ranks.pop(self, None)
            world.pg_backend_config.pop(self, None)
            world.pg_to_tag.pop(self, None)
            for tag, pgs in list(world.tags_to_pg.items()):
                world.tags_to_pg[tag] = [g for g in pgs if g is not self]
            try:
                c10d._unregister_process_group(self.group_name)
            except Exception:  # noqa: BLE001 - not registered under that name
                pass

    def abort(self, why: str, real_abort: bool = False) -> bool:
        """Fail every pending and later collective of this generation at once. With
        ``real_abort`` (NCCL) the real communicator is aborted too, in a background
        thread. Returns whether this call broke the generation (False if it already
        was, or none is installed)."""
        with self._lock:
            if self._real is None or self._broken is not None:
                return False
            self._broken = why
            real = self._real
            pending = list(self._pending.values())
            self._pending.clear()
        for p in pending:
            self._fail(p, why)
        if real_abort:
            threading.Thread(target=_abort_real, args=(real,), name="bftrainer-abort", daemon=True).start()
        return True

    @property
    def generation(self) -> int:
        return self._gen

    @property
    def broken(self) -> Optional[str]:
        return self._broken

    @property
    def real(self) -> Any:
        return self._real

    # -- ProcessGroup ------------------------------------------------------------------

    def rank(self) -> int:  # type: ignore[override]
        return self._rank

    def size(self) -> int:  # type: ignore[override]
        return self._size

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "bftrainer"

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._name

    def _fail(self, p: _Pending, why: str) -> None:
        with self._lock:
            if p.done:
                return
            p.done = True
        p.future.set_exception(RuntimeError(f"collective {ABANDONED}: {why}"))

    def _run(
        self,
        op: Callable[[Any], Any],
        result: Callable[[], Any],
        local: Optional[Callable[[], None]] = None,
        blocking: bool = False,
    ) -> Future:
        """Start ``op(real)`` and return our future of it: completed (with ``result()``)
        by the real one, or failed by ``abort`` first. Without a generation, in a
        world of one, ``local()`` does the collective's work (gathers and scatters
        copy their input)."""
        with self._lock:
            real, broken = self._real, self._broken
            if real is not None and broken is None:
                self._ids += 1
                key = self._ids
                devices = [self._device] if self._device is not None and self._device.type == "cuda" else None
                fut: Future = Future(devices=devices) if devices else Future()
                p = _Pending(fut)
                self._pending[key] = p
        if broken is not None:
            raise RuntimeError(f"collective {ABANDONED}: {broken}")
        if real is None and self._size0 > 1:
            raise RuntimeError(
                f"bftrainer: the process group {self._name!r} has no generation yet: run its collectives "
                "inside the function decorated with @bftrainer.run"
            )
        if real is None:
            # No generation: a world of one, where every collective is the identity.
            fut = Future()
            if local is not None:
                local()
            fut.set_result(result())
            return fut
        try:
            work = op(real)
        except Exception:
            with self._lock:
                self._pending.pop(key, None)
            raise
        with self._lock:
            current = self._real is real
            if current:
                self._works[key] = work
        if not current:
            # Retired meanwhile: the runtime let go of the group without this one.
            from ._leftovers import LEFTOVERS

            LEFTOVERS.leave(real, [work])

        if devices:
            # NCCL: the real future completes (CUDA-aware) once the operation is on
            # the stream; its callback runs no host wait for the device.
            def done(f: Future) -> None:
                self._complete(key, p, f.value, result)

            work.get_future().then(done)
        else:
            # gloo: never a callback of ours in gloo's threads. A Python callback on
            # a gloo future (`then`) that completes with an error after the survivors
            # moved on crashed survivors of a kill -9 (SIGABRT: `terminate called
            # after throwing gloo::IoException`); a thread of ours watches instead.
            if blocking:
                self._blocking_waiter(real).add(work, key, p, result)
            else:
                self._watcher().add(self, work, key, p, result)
        return fut

    def _complete(self, key: int, p: _Pending, wait: Callable[[], Any], result: Callable[[], Any]) -> None:
        """The real operation ended (``wait()`` returns or raises at once), or is
        waited for here (``_Waiter``): complete our future, unless ``abort`` failed it
        first, meanwhile."""
        err: Optional[BaseException] = None
        value: Any = None
        try:
            wait()
            value = result()
        except Exception as e:  # noqa: BLE001 - handed on to the waiter
            err = e
        with self._lock:
            self._pending.pop(key, None)
            self._works.pop(key, None)
            if p.done:
                return
            p.done = True
        if err is not None:
            p.future.set_exception(err)
        else:
            p.future.set_result(value)

    def _blocking_waiter(self, real: Any) -> "_Waiter":
        with self._lock:
            if self._waiter is None or self._waiter.real is not real:
                self._waiter = _Waiter(self, real)
            return self._waiter

    def _watcher(self) -> "_Watcher":
        global _WATCHER
        with _WATCHER_LOCK:
            if _WATCHER is None:
                _WATCHER = _Watcher()
            return _WATCHER

    def _work(
        self,
        op: Callable[[Any], Any],
        result: Callable[[], Any],
        local: Optional[Callable[[], None]] = None,
        blocking: bool = False,
    ) -> Any:
        return _FutureWork(self._run(op, result, local, blocking))

    def allreduce_future(self, tensor: torch.Tensor, op: Any = None) -> Future:
        """All-reduce ``tensor`` in place (SUM by default); a future of it."""
        opts = dist.AllreduceOptions()
        if op is not None:
            opts.reduceOp = op
        return self._run(lambda pg: pg.allreduce([tensor], opts), lambda: tensor)

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None:
            opts = dist.AllreduceOptions()
        elif not isinstance(opts, dist.AllreduceOptions):
            op, opts = opts, dist.AllreduceOptions()
            opts.reduceOp = op
        return self._work(lambda pg: pg.allreduce(tensors, opts), lambda: tensors)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._work(lambda pg: pg.allreduce_coalesced(tensors, opts), lambda: tensors)

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        if isinstance(tensors, torch.Tensor):
            root, tensors, opts = opts, [tensors], dist.BroadcastOptions()
            opts.rootRank = int(root or 0)
        elif opts is None:
            opts = dist.BroadcastOptions()
        return self._work(lambda pg: pg.broadcast(tensors, opts), lambda: tensors)

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        opts = opts if opts is not None else c10d.AllgatherOptions()

        def local() -> None:
            for outs, inp in zip(output_tensors, input_tensors):
                outs[0].copy_(inp)

        return self._work(lambda pg: pg.allgather(output_tensors, input_tensors, opts), lambda: output_tensors, local)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # type: ignore[override]
        opts = opts if opts is not None else c10d.AllgatherOptions()

        def local() -> None:
            output.copy_(input.reshape(output.shape))

        return self._work(lambda pg: pg._allgather_base(output, input, opts), lambda: output, local)

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        opts = opts if opts is not None else dist.ReduceScatterOptions()

        def local() -> None:
            for out, ins in zip(output_tensors, input_tensors):
                out.copy_(ins[0])

        return self._work(
            lambda pg: pg.reduce_scatter(output_tensors, input_tensors, opts), lambda: output_tensors, local, True
        )

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # type: ignore[override]
        opts = opts if opts is not None else dist.ReduceScatterOptions()

        def local() -> None:
            output.copy_(input.reshape(output.shape))

        return self._work(lambda pg: pg._reduce_scatter_base(output, input, opts), lambda: output, local, True)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # type: ignore[override]
        """FSDP2's all-gather of a parameter group's shards."""
        opts = opts if opts is not None else c10d.AllgatherOptions()

        def local() -> None:
            output.copy_(input.reshape(output.shape))

        return self._work(lambda pg: pg.all_gather_single(output, input, opts), lambda: output, local)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # type: ignore[override]
        """FSDP2's reduce-scatter of a parameter group's gradients."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()

        def local() -> None:
            output.copy_(input.reshape(output.shape))

        return self._work(lambda pg: pg.reduce_scatter_single(output, input, opts), lambda: output, local, True)

    def barrier(self, opts: Any = None) -> Any:  # type: ignore[override]
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._work(lambda pg: pg.barrier(opts), lambda: [])


class _FutureWork(c10d.Work):
    """The ``Work`` of one of our collectives: its ``wait()`` raises what failed it
    (an abort, the real operation's error). torch's own work from a future
    (``_create_work_from_future``) returns from ``wait()`` without raising when the
    future failed (torch 2.15): FSDP2's waits would go on with garbage."""

    def __init__(self, future: Future) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: Any = None) -> bool:  # type: ignore[override]
        self._future.wait()
        return True

    def is_completed(self) -> bool:  # type: ignore[override]
        return bool(self._future.done())

    def get_future(self) -> Future:  # type: ignore[override]
        return self._future


class _Watcher:
    """One thread (for every elastic group of the process) that completes our futures
    of gloo operations: it asks each pending ``Work`` ``is_completed()`` (a flag, no
    wait) and then takes its result or error with ``wait()`` in this thread, as
    ``elastic._wait`` does on the step's thread.
    Polls only while operations are pending: 50 us at first, backing off to 1 ms."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: List[Any] = []
        threading.Thread(target=self._loop, name="bftrainer-collectives", daemon=True).start()

    def add(self, group: ElasticGroup, work: Any, key: int, p: _Pending, result: Callable[[], Any]) -> None:
        with self._cond:
            self._items.append((group, work, key, p, result))
            self._cond.notify()

    def _loop(self) -> None:
        pause = 0.00005
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                    pause = 0.00005
                # Aborted ones are dropped: gloo's thread ends them, nobody waits.
                items = [it for it in self._items if not it[3].done]
                ended = [it for it in items if it[1].is_completed()]
                self._items = [it for it in items if it not in ended] if ended else items
            for group, work, key, p, result in ended:
                group._complete(key, p, work.wait, result)
            if ended:
                pause = 0.00005
            else:
                time.sleep(pause)
                pause = min(pause * 2, 0.001)


class _Waiter:
    """One thread per generation of a group that waits, blocking and in order, for
    the gloo operations whose ``Work`` never says it completed before ``wait()``
    returns (the reduce-scatters: ``is_completed()`` stays false, so ``_Watcher``
    cannot see them end). Aborted ones are skipped. At ``close`` (the generation
    ends) the thread ends after the wait it is in, which a failed peer ends with an
    error or the group's timeout; nothing waits for it."""

    def __init__(self, group: ElasticGroup, real: Any) -> None:
        self.real = real
        self._group = group
        self._q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="bftrainer-waiter", daemon=True).start()

    def add(self, work: Any, key: int, p: _Pending, result: Callable[[], Any]) -> None:
        self._q.put((work, key, p, result))

    def close(self) -> None:
        self._q.put(None)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            work, key, p, result = item
            if not p.done:
                self._group._complete(key, p, work.wait, result)


_WATCHER: Optional[_Watcher] = None
_WATCHER_LOCK = threading.Lock()


def _abort_real(real: Any) -> None:
    """Abort a real group off the step's path (NCCL: about a second with an operation
    in flight); the new generation's group forms meanwhile."""
    try:
        real.abort()
    except Exception as e:  # noqa: BLE001 - best effort; the group is abandoned anyway
        import sys

        print(f"bftrainer: aborting the old communicator failed: {e}", file=sys.stderr, flush=True)
