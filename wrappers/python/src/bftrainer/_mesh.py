"""The 2-D DeviceMesh ("replicate" = nodes, "shard" = a node's workers) that FSDP2 HSDP
trains on, built once and valid in every generation: its two dimensions are elastic
process groups (``_groups.ElasticGroup``, as under bftrainer.DistributedDataParallel)
whose real gloo/NCCL group is swapped underneath at each generation.

FSDP2 keeps the group objects of the mesh it was given (``mesh.get_group(dim)``), asks
them for ``size()`` and ``rank()`` and issues its collectives on them each step
(``all_gather_single``, ``reduce_scatter_single``, ``allreduce``); DTensor's functional
collectives resolve them by name. So each is registered in torch's tables under a fixed
name again after each new world (a new default group clears them), and out of them
between generations. A collective pending when a peer fails is failed at once by the
coordinator's verdict (``ElasticGroup.abort``), and the real group it ran on is kept
until it ends (``_leftovers``): dropping it would wait for it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from ._groups import ElasticGroup


class _MeshGroup(ElasticGroup):
    """A dimension of the mesh. Its reduce-scatter (FSDP's gradients, in backward) is
    the step's phase in the runtime's trace."""

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:  # type: ignore[override]
        from .elastic import trace

        trace("step")
        return super().reduce_scatter_single(output, input, opts)


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
        self.replicate = _MeshGroup("bftrainer:replicate", 0, 1)
        self.shard = _MeshGroup("bftrainer:shard", self.local, self.per_node)
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
            self._attach(self.replicate, dist.group.WORLD, [0], 0, None)
            self._attach(self.shard, dist.group.WORLD, [0], 0, None)
        else:
            self._attach(self.replicate, None, [], 0, None)
            self._attach(self.shard, None, [], 0, None)
        #: node index of every rank of the current generation, and its local rank
        self.places: List[Tuple[int, int]] = []

    @staticmethod
    def _attach(w: ElasticGroup, real: Any, ranks: List[int], gen: int, device: Any) -> None:
        """Register ``w`` in torch's tables of groups (by name, backend, global ranks)
        as the group of ``ranks``, serving through ``real`` (None: no generation)."""
        import torch.distributed as dist

        c10d = dist.distributed_c10d
        if real is not None:
            w.install(real, gen, device)
            w._register_backends(real)
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

    def rebuild(self, rank: int, world: int, node_of: List[str], device: Any, gen: int = 0) -> Optional[str]:
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
        self._attach(self.replicate, rep, reps[self.local], gen, device)
        self._attach(self.shard, shard, shards[self.places[rank][0]], gen, device)
        return None

    def groups(self) -> Tuple[ElasticGroup, ElasticGroup]:
        return self.replicate, self.shard

    def retire(self) -> List[Tuple[Any, List[Any]]]:
        """Leave this generation's groups (at teardown): each real group with its
        collectives not seen complete, for ``_leftovers`` (dropped at once, a group
        would wait for them). Out of torch's tables until the next ``rebuild``."""
        out = []
        for w in self.groups():
            real, works = w.retire()
            if real is not None:
                out.append((real, works))
        return out

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
