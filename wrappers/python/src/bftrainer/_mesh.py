"""The 2-D DeviceMesh ("replicate" = nodes, "shard" = a node's workers) that FSDP2 HSDP
trains on, built once and valid in every generation: its two dimensions are process
groups whose real gloo/NCCL group is swapped underneath at each generation.

FSDP2 keeps the group objects of the mesh it was given (``mesh.get_group(dim)``) and
asks them for ``size()`` and ``rank()`` and issues its collectives on them each step,
DTensor's functional collectives resolve them by name. ``_SwapGroup`` is a
``ProcessGroup`` whose every collective goes to the group of the current generation,
registered under a fixed name again after each new world (a new default group clears
torch's registry).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

# Every ProcessGroup method that runs a collective or hands out the backend: forwarded
# to the current generation's group.
_FORWARD = (
    "allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "_allgather_base",
    "all_gather_single", "all_gather_single_coalesced", "allgather_into_tensor_coalesced",
    "_reduce_scatter_base", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced", "broadcast", "barrier", "reduce", "gather", "scatter",
    "alltoall", "alltoall_base", "all_to_all_single", "send", "recv", "_get_backend", "get_backend",
)

_GROUP_CLASS: Any = None


def _group_class() -> Any:
    global _GROUP_CLASS
    if _GROUP_CLASS is not None:
        return _GROUP_CLASS
    import torch.distributed as dist

    class _SwapGroup(dist.ProcessGroup):  # type: ignore[misc,name-defined]
        """A process group of fixed name whose real group is the current generation's."""

        def __init__(self, name: str, rank: int, size: int) -> None:
            super().__init__(rank, size)
            self._name = name
            self._real: Any = None
            # Before the first generation (fully_shard reads rank and size when it
            # wraps the model): this worker's place as bft-run started it.
            self._rank0, self._size0 = rank, size

        @property
        def group_name(self) -> str:  # type: ignore[override]
            return self._name

        def rank(self) -> int:  # type: ignore[override]
            return self._real.rank() if self._real is not None else self._rank0

        def size(self) -> int:  # type: ignore[override]
            return self._real.size() if self._real is not None else self._size0

        def name(self) -> str:  # type: ignore[override]
            return self._real.name() if self._real is not None else "bftrainer"

        def real(self) -> Any:
            if self._real is None:
                raise RuntimeError(
                    f"bftrainer: the mesh dimension {self._name!r} has no process group yet: "
                    "use it inside the function decorated with @bftrainer.run"
                )
            return self._real

    from .elastic import trace

    def forward(n: str) -> Any:
        def f(self: Any, *a: Any, **k: Any) -> Any:
            return getattr(self.real(), n)(*a, **k)

        if n == "reduce_scatter_single":
            # FSDP's gradient reduce-scatter, in backward: the step's phase in the trace.
            def f(self: Any, *a: Any, **k: Any) -> Any:  # noqa: F811
                trace("step")
                return self.real().reduce_scatter_single(*a, **k)

        f.__name__ = n
        return f

    for n in _FORWARD:
        setattr(_SwapGroup, n, forward(n))
    _GROUP_CLASS = _SwapGroup
    return _SwapGroup


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name, "")
    if not v:
        return default
    if not (v.isascii() and v.isdigit()) or len(v) > 6:
        raise ValueError(f"{name}={v[:40]!r} is not a whole number; bft-run sets it")
    return int(v)


class _Mesh:
    """The mesh and its two swappable groups, and where each rank of the current
    generation sits in it."""

    def __init__(self, device_type: str) -> None:
        from torch.distributed.device_mesh import DeviceMesh
        import torch

        self.local = _env_int("LOCAL_RANK", _env_int("BFT_LOCAL_RANK", 0))
        self.per_node = _env_int("LOCAL_WORLD_SIZE", 1)
        if not 0 <= self.local < self.per_node:
            raise ValueError(f"LOCAL_RANK {self.local} is not below LOCAL_WORLD_SIZE {self.per_node}")
        import torch.distributed as dist

        # DeviceMesh asks the default group for this worker's rank whenever a mesh is
        # sliced (fully_shard slices it when it wraps the model, before any
        # generation): until the first generation a default group of one stands in.
        self.placeholder = not dist.is_initialized()
        if self.placeholder:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        rank = dist.get_rank()
        cls = _group_class()
        self.replicate = cls("bftrainer:replicate", 0, 1)
        self.shard = cls("bftrainer:shard", self.local, self.per_node)
        # The mesh's shape is that of this worker's view: one replica (its node) of
        # LOCAL_WORLD_SIZE shards; the replicate dimension's real size (the number of
        # nodes) is its group's size() in each generation.
        # Its rank map holds this worker's global rank of the current generation at its
        # own place (updated in place at each generation) and distinct negative
        # numbers at its node mates' places (their global ranks matter to nobody here).
        ids = [-(j + 1) for j in range(self.per_node)]
        ids[self.local] = rank
        self.mesh = DeviceMesh(
            device_type,
            torch.tensor(ids).view(1, self.per_node),
            mesh_dim_names=("replicate", "shard"),
            _init_backend=False,
            _rank=rank,
        )
        self.mesh._dim_group_names = [self.replicate.group_name, self.shard.group_name]
        self.mesh._pg_registry[self.replicate.group_name] = self.replicate
        self.mesh._pg_registry[self.shard.group_name] = self.shard
        if self.placeholder and self.per_node == 1:
            # Alone (not under bft-run, or one worker a node before the first
            # generation): both dimensions are the group of one.
            self._attach(self.replicate, dist.group.WORLD, [0])
            self._attach(self.shard, dist.group.WORLD, [0])
        else:
            self._attach(self.replicate, None, [])
            self._attach(self.shard, None, [])
        #: node index of every rank of the current generation, and its local rank
        self.places: List[Tuple[int, int]] = []

    @staticmethod
    def _attach(w: Any, real: Any, ranks: List[int]) -> None:
        """Register ``w`` in torch's tables of groups (by name, backend, global ranks)
        as the group of ``ranks``, serving through ``real``."""
        import torch.distributed as dist

        c10d = dist.distributed_c10d
        w._real = real
        backend = real.name() if real is not None else "gloo"
        mapping = {g: i for i, g in enumerate(ranks)}
        reg = getattr(c10d, "_register_pg_in_world", None)
        if reg is not None:
            reg(w, backend, None, w.group_name, backend, mapping)
            return
        c10d._world.pg_map[w] = (backend, None)
        c10d._world.pg_names[w] = w.group_name
        c10d._world.pg_group_ranks[w] = mapping
        c10d._register_process_group(w.group_name, w)

    def rebuild(self, rank: int, world: int, node_of: List[str], device: Any) -> Optional[str]:
        """Build this generation's groups (every member calls it, right after the new
        default group formed). ``node_of[r]`` names rank r's node (its agent). Returns
        None, or why the generation cannot train HSDP (a node with a missing worker:
        a killed worker's replacement joins in the next generation)."""
        import torch
        import torch.distributed as dist

        self.mesh._rank_map[self.local] = rank
        self.mesh._rank = rank
        mine = torch.tensor([self.local, self.per_node], dtype=torch.int64, device=device)
        table = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(table, mine)
        rows = [tuple(int(v) for v in t.tolist()) for t in table]
        order: List[str] = []
        for n in node_of:
            if n not in order:
                order.append(n)
        nodes: Dict[str, Dict[int, int]] = {n: {} for n in order}
        for r, (local, per) in enumerate(rows):
            if per != self.per_node:
                raise RuntimeError(
                    f"rank {r} runs {per} workers per node, this one {self.per_node}: HSDP needs the same "
                    "LOCAL_WORLD_SIZE on every node"
                )
            nodes[node_of[r]][local] = r
        self.places = [(order.index(node_of[r]), rows[r][0]) for r in range(world)]
        short = [n for n in order if len(nodes[n]) != self.per_node]
        # Every member creates every group, in the same order (new_group is collective).
        reps: List[List[int]] = [[nodes[n][i] for n in order if n not in short] for i in range(self.per_node)]
        shards: List[List[int]] = [[nodes[n][i] for i in sorted(nodes[n])] for n in order]
        if short:
            self._attach(self.replicate, None, [])
            self._attach(self.shard, None, [])
            return f"node(s) {short} have fewer than {self.per_node} workers in this generation"
        rep = shard = None
        for ranks in reps:
            g = dist.new_group(ranks)
            if rank in ranks:
                rep = g
        for ranks in shards:
            g = dist.new_group(ranks)
            if rank in ranks:
                shard = g
        assert rep is not None and shard is not None
        self._attach(self.replicate, rep, reps[self.local])
        self._attach(self.shard, shard, shards[self.places[rank][0]])
        return None

    def detach(self) -> None:
        """Let go of this generation's groups (at teardown): a peer blocked in a
        collective with this worker sees its sockets close and fails at once, instead
        of waiting for the process-group timeout."""
        self.replicate._real = None
        self.shard._real = None

    def columns(self) -> List[List[int]]:
        """For each local rank i, the global ranks of local rank i, by node."""
        cols: List[List[int]] = [[] for _ in range(self.per_node)]
        for r, (_, local) in sorted(enumerate(self.places), key=lambda x: x[1]):
            cols[local].append(r)
        return cols


_MESH: Optional[_Mesh] = None


def current() -> Optional[_Mesh]:
    return _MESH


def device_mesh() -> Any:
    """The 2-D ``DeviceMesh`` ``("replicate", "shard")`` of this job: each node is a
    replica, its LOCAL_WORLD_SIZE workers shard the model. Pass it to FSDP2::

        mesh = bftrainer.device_mesh()
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    Build it, the model and the optimizer once, before ``@bftrainer.run``: the mesh
    stays valid in every generation (its groups are swapped underneath at step
    boundaries), nodes join and leave whole, and a newcomer's local rank i receives its
    shards from local rank i of a live replica. ``mesh.size(0)`` says 1 (this node's
    view); the number of replicas in the current generation is
    ``mesh.get_group("replicate").size()``."""
    global _MESH
    if _MESH is None:
        from .elastic import _rt

        dev = _rt().choice().device
        _MESH = _Mesh("cuda" if dev.startswith("cuda") else "cpu")
    return _MESH.mesh
