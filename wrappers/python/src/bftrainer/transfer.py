"""Sending the committed state to the members that lack it, once a process group forms.

``sync()`` is called by every member right after a new process group forms. The
members compare their committed steps (one small all-gather); the lowest rank holding
the newest commit sends it, point to point, to each member that does not hold it;
members that already hold it do nothing else. Nothing received is unpickled: the state
travels as a JSON header describing its tree (plain values in the JSON, tensors by
dtype and shape) followed by each tensor's bytes.

The same rules decide what a state may hold everywhere (commits, checkpoints, the
wire): see ``walk``.
"""

from __future__ import annotations

import json
import math
import sys
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Tuple, Union

from ._leftovers import LEFTOVERS

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .state import State

Key = Union[str, int]
Path = Tuple[Key, ...]
Wait = Callable[[Any, str], None]

ALLOWED = (
    "None, bool, int, float, str, torch tensors, and lists, tuples and dicts (with str or int keys) of these"
)
_FORMAT = 1
_MAX_HEADER = 1 << 30  # bytes; a header longer than this is a corrupt length
_WINDOW = 256 << 20  # bytes of tensors in flight before the oldest transfer is waited for


class StateTransferError(ValueError):
    """The state could not be sent (it holds something the format does not carry) or
    what arrived is not a state. Not a peer failure: the job stops with this error."""


def _is_dtensor(x: Any) -> bool:
    """A DTensor (FSDP2's sharded parameters and their optimizer state)."""
    if "torch.distributed.tensor" not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(x, DTensor)


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # no torch imported: no tensor can exist
    return torch is not None and isinstance(x, torch.Tensor)


def _where(root: str, path: Path) -> str:
    return root + "".join(f"[{k!r}]" for k in path)


def _refuse(root: str, path: Path, what: str) -> TypeError:
    return TypeError(
        f"{_where(root, path)} is {what}: a training state may hold only {ALLOWED}; "
        "give the object state_dict()/load_state_dict() methods and pass it as an extra, "
        "or keep it out of State"
    )


def _scalar(x: Any, root: str, path: Path) -> Any:
    """A plain value as its base type (numpy.float64, IntEnum... become float, int)."""
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, float):
        return float(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, str):
        return str(x)
    raise _refuse(root, path, f"a {type(x).__module__}.{type(x).__qualname__}")


def walk(x: Any, root: str, tensor: Callable[[Any, Path], Any], path: Path = ()) -> Any:
    """Rebuild the tree ``x`` (its containers are new, its plain values shared), with
    every tensor replaced by ``tensor(t, path)``. Refuses, naming the place, anything
    that is not one of ``ALLOWED``: what this accepts is exactly what a commit keeps, a
    checkpoint holds (``torch.load(weights_only=True)`` reads it back) and ``sync``
    sends."""
    if _is_tensor(x):
        import torch

        if x.layout != torch.strided:
            raise _refuse(root, path, f"a {x.layout} tensor (only dense tensors are supported)")
        return tensor(x, path)
    t = type(x)
    if t is dict or t is OrderedDict:
        out = t()
        for k, v in x.items():
            if type(k) not in (str, int):
                raise _refuse(root, path, f"a dict with a {type(k).__name__} key {k!r} (keys must be str or int)")
            out[k] = walk(v, root, tensor, path + (k,))
        meta = getattr(x, "_metadata", None)  # module versions of a model's state_dict()
        if t is OrderedDict and isinstance(meta, dict):
            out._metadata = walk(meta, root, tensor, path + ("_metadata",))  # type: ignore[attr-defined]
        return out
    if t is list:
        return [walk(v, root, tensor, path + (i,)) for i, v in enumerate(x)]
    if t is tuple:
        return tuple(walk(v, root, tensor, path + (i,)) for i, v in enumerate(x))
    return _scalar(x, root, path)


def copy_tree(x: Any, root: str, device: Any = None) -> Any:
    """A copy of ``x`` that shares no tensor storage with it: tensors are cloned on their
    own device, or copied to ``device`` when given."""
    if device is None:
        return walk(x, root, lambda t, _: t.detach().clone())
    return walk(x, root, lambda t, _: t.detach().to(device, copy=True))


# -- wire format ---------------------------------------------------------------------
#
# The header is UTF-8 JSON: {"format": 1, "tree": NODE, "tensors": [DESC...]}.
# NODE is None, a bool, an int, a finite float, a str, a JSON list (a Python list), or
# an object with one key: {"t": [NODE...]} a tuple, {"d": [[KEY, NODE]...]} a dict
# (KEY a str or an int, kept as it was), {"f": "nan" | "inf" | "-inf"} a float JSON
# cannot write, {"T": i} the i-th tensor. DESC is {"path": [KEY...], "dtype": "float32",
# "shape": [...], "host": bool} (host: the tensor lived on the CPU at the sender).
# The tensors follow the header, in order, each as its bytes (C-contiguous); a tensor
# that two places share (tied weights) is sent once.


def encode(tree: Any, root: str = "state") -> Tuple[bytes, List[Any], List[Path]]:
    """The header of ``tree``, the tensors to send after it in order, and their paths."""
    tensors: List[Any] = []
    paths: List[Path] = []
    descs: List[Dict[str, Any]] = []
    seen: Dict[Tuple[Any, ...], int] = {}

    def tensor(t: Any, path: Path) -> Dict[str, int]:
        sharded = _is_dtensor(t)
        if sharded:
            t = t.to_local()  # this rank's shard: a newcomer's same local rank takes it
        key = (t.device, t.dtype, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if t.numel() > 0 and key in seen:
            return {"T": seen[key]}
        i = len(tensors)
        seen[key] = i
        tensors.append(t.detach())
        paths.append(path)
        descs.append(
            {"path": list(path), "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "host": t.device.type == "cpu"}
        )
        if sharded:
            descs[-1]["dt"] = True
        return {"T": i}

    def enc(x: Any, path: Path) -> Any:
        if _is_tensor(x):
            return walk(x, root, tensor, path)  # checks the layout, then tensor()
        t = type(x)
        if t is dict or t is OrderedDict:
            items = []
            for k, v in x.items():
                if type(k) not in (str, int):
                    raise _refuse(root, path, f"a dict with a {type(k).__name__} key {k!r} (keys must be str or int)")
                items.append([k, enc(v, path + (k,))])
            return {"d": items}
        if t is list:
            return [enc(v, path + (i,)) for i, v in enumerate(x)]
        if t is tuple:
            return {"t": [enc(v, path + (i,)) for i, v in enumerate(x)]}
        v = _scalar(x, root, path)
        if isinstance(v, float) and not math.isfinite(v):
            return {"f": repr(v)}
        return v

    body = enc(tree, ())
    header = json.dumps({"format": _FORMAT, "tree": body, "tensors": descs}, allow_nan=False, separators=(",", ":"))
    return header.encode("utf-8"), tensors, paths


class _Desc:
    __slots__ = ("path", "dtype", "shape", "host", "dt")

    def __init__(self, path: Path, dtype: Any, shape: Tuple[int, ...], host: bool, dt: bool = False) -> None:
        self.path, self.dtype, self.shape, self.host, self.dt = path, dtype, shape, host, dt


def _bad(what: str) -> StateTransferError:
    return StateTransferError(f"the state received is malformed: {what}")


def parse_header(data: bytes) -> Tuple[Any, List[_Desc]]:
    """The header's tree (tensors still as {"T": i}) and its tensor descriptions,
    checked: dtypes must name torch dtypes, shapes non-negative ints."""
    import torch

    try:
        h = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(f"the header is not JSON ({e})") from None
    if not isinstance(h, dict) or h.get("format") != _FORMAT or not isinstance(h.get("tensors"), list):
        raise _bad(f"unknown header format {h.get('format') if isinstance(h, dict) else type(h).__name__!r}")
    descs = []
    for d in h["tensors"]:
        if not isinstance(d, dict):
            raise _bad("a tensor description is not an object")
        dtype = getattr(torch, str(d.get("dtype")), None)
        shape = d.get("shape")
        path = d.get("path")
        if not isinstance(dtype, torch.dtype):
            raise _bad(f"unknown dtype {d.get('dtype')!r}")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise _bad(f"bad shape {shape!r}")
        if not isinstance(path, list) or not all(type(k) in (str, int) for k in path):
            raise _bad(f"bad path {path!r}")
        descs.append(_Desc(tuple(path), dtype, tuple(shape), bool(d.get("host")), d.get("dt") is True))
    return h.get("tree"), descs


def build(node: Any, tensors: List[Any]) -> Any:
    """The Python tree of a header's ``node``, with ``tensors`` in place of {"T": i}."""
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is list:
        return [build(v, tensors) for v in node]
    if type(node) is dict and len(node) == 1:
        (tag, v), = node.items()
        if tag == "T" and type(v) is int and 0 <= v < len(tensors):
            return tensors[v]
        if tag == "t" and type(v) is list:
            return tuple(build(x, tensors) for x in v)
        if tag == "f" and v in ("nan", "inf", "-inf"):
            return float(v)
        if tag == "d" and type(v) is list:
            out: Dict[Key, Any] = {}
            for item in v:
                if type(item) is not list or len(item) != 2 or type(item[0]) not in (str, int):
                    raise _bad(f"a dict entry {item!r:.80}")
                out[item[0]] = build(item[1], tensors)
            return out
    raise _bad(f"unknown node {node!r:.80}")


def decode(header: bytes, tensors: List[Any]) -> Any:
    """``encode``'s inverse, for tests and tools: the tree with ``tensors`` in place."""
    tree, descs = parse_header(header)
    if len(descs) != len(tensors):
        raise _bad(f"{len(descs)} tensors described, {len(tensors)} given")
    return build(tree, tensors)


# -- sync --------------------------------------------------------------------------


def _bytes(t: Any) -> Any:
    """A uint8 view of contiguous ``t``: every dtype travels as its bytes."""
    import torch

    return t.view(-1).view(torch.uint8)


class _Window:
    """Transfers in flight, waited for oldest first once more than _WINDOW bytes are
    outstanding (so temporary copies stay bounded), and all at ``drain``."""

    def __init__(self, wait: Wait) -> None:
        self.wait = wait
        self.pending: Deque[Tuple[Any, str, int, Any]] = deque()
        self.bytes = 0

    def post(self, work: Any, what: str, nbytes: int, keep: Any = None) -> None:
        self.pending.append((work, what, nbytes, keep))
        self.bytes += nbytes
        while self.bytes > _WINDOW and len(self.pending) > 1:
            self._pop()

    def _pop(self) -> None:
        work, what, nbytes, _ = self.pending[0]
        self.wait(work, what)
        # Out of the deque once complete: a wait that gives up leaves it there.
        self.pending.popleft()
        self.bytes -= nbytes

    def left(self) -> List[Any]:
        """The transfers posted and not waited for (after a failure)."""
        return [p[0] for p in self.pending]

    def drain(self) -> None:
        while self.pending:
            self._pop()


def _device(device: Any) -> Any:
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def sync(state: State, rank: int, world: int, device: Any, wait: Wait) -> None:
    """Make every member's state the newest commit among them. Called by every member
    right after a new process group (the default group: ``rank`` of ``world``) forms;
    ``device`` is where communication buffers live (None: the CPU; the GPU for NCCL);
    ``wait(work, what)`` waits for one asynchronous operation (and raises if a peer dies
    meanwhile).

    The members all-gather (committed step, step, whole) as int64. The lowest rank
    holding the highest commit sends it to every member whose commit differs; members
    that hold it do nothing else. If no member holds a commit (a new job, or every
    member lost its own), the rank with a whole model and the highest step (the lowest
    such) sends to all others, and every member then commits what it holds. The
    receiver drops its optimizer state, takes model tensors straight into its model
    when dtype, shape and device match (when all do, the model's ``load_state_dict``
    is not called), and the rest in new tensors on ``device`` (those that lived on the
    sender's CPU, like Adam's step counts, are moved to the CPU); it commits what it
    received. Until then it holds no commit (``committed_step = -1``): a transfer cut
    short leaves it to receive again, or to roll back from its CPU copy."""
    import torch
    import torch.distributed as dist

    dev = _device(device)
    mine = torch.tensor([state.committed_step, state.step, 1 if state._intact else 0], dtype=torch.int64, device=dev)
    table_t = [torch.empty_like(mine) for _ in range(world)]
    wait(dist.all_gather(table_t, mine, async_op=True), "the members' committed steps")
    table = [tuple(int(v) for v in t.tolist()) for t in table_t]
    committed = [row[0] for row in table]
    top = max(committed)
    if top >= 0:
        if all(c == top for c in committed):
            return
        src = committed.index(top)
        receivers = [r for r, c in enumerate(committed) if c != top]
    else:
        whole = [r for r, row in enumerate(table) if row[2]]
        if not whole:
            raise StateTransferError(
                "no member holds a commit or a whole model (every one was interrupted while receiving the state): "
                "the training state is lost; start the job again from its checkpoint"
            )
        src = max(whole, key=lambda r: (table[r][1], -r))
        receivers = [r for r in range(world) if r != src]
    from . import _mesh

    mesh = _mesh.current()
    if mesh is not None and mesh.places:
        # Sharded (HSDP): local rank i of each worker lacking the commit takes local
        # rank i's shards from one holder of local rank i (replicas hold equal shards
        # at a commit), all local ranks at once, nothing gathered on one rank.
        sub = None
        mine: Optional[Tuple[int, List[int]]] = None
        for col in mesh.columns():
            if top >= 0:
                holders = [r for r in col if committed[r] == top]
            else:
                holders = sorted((r for r in col if table[r][2]), key=lambda r: (-table[r][1], r))
            if not holders:
                raise StateTransferError(
                    f"no worker of local rank {mesh.places[col[0]][1]} holds the newest commit or a whole shard: "
                    "the training state is lost; start the job again from its checkpoint"
                )
            s_i = holders[0]
            rec_i = [r for r in col if r != s_i and (top < 0 or committed[r] != top)]
            g = dist.new_group([s_i] + rec_i) if rec_i else None
            if rank in [s_i] + rec_i:
                mine, sub = (s_i, rec_i), g
        if mine is None:
            return
        src, receivers = mine
        if rank == src and not receivers:
            if top < 0:
                state.save()
            return
    else:
        # The sender and the receivers only, in a group of their own: members that hold
        # the commit take no part. (Gloo's point-to-point operations cannot be waited for
        # with a deadline: a group's broadcast can, and it reaches only the newcomers.)
        sub = dist.new_group([src] + receivers) if receivers else None
    window = _Window(wait)
    if rank == src or rank in receivers:
        from .elastic import trace

        trace("transfer")
    try:
        if rank == src:
            if receivers:
                _send(state, sub, src, dev, window)
            if top < 0:
                state.save()
        elif rank in receivers:
            _receive(state, sub, src, dev, window)
            if top >= 0 and state.step != top:
                raise StateTransferError(f"rank {src} sent the state of step {state.step}, not its commit {top}")
            state.save()
    finally:
        if sub is not None and rank in [src] + receivers:
            dist.destroy_process_group(sub)
            # Kept while broadcasts that a peer gave up on are pending (_leftovers).
            LEFTOVERS.leave(sub, window.left())


def _send(state: State, sub: Any, src: int, dev: Any, window: _Window) -> None:
    """Broadcasts the state from ``src`` (this rank) over ``sub`` (it and the receivers),
    through ``window``."""
    import torch
    import torch.distributed as dist

    def bcast(t: Any) -> Any:
        return dist.broadcast(t, src=src, group=sub, async_op=True)

    try:
        header, tensors, paths = encode(state._payload())
    except (TypeError, ValueError):
        refusal = torch.tensor([-1], dtype=torch.int64, device=dev)
        window.post(bcast(refusal), "the refusal to the receivers", 8, refusal)
        window.drain()
        raise
    length = torch.tensor([len(header)], dtype=torch.int64, device=dev)
    head = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(dev)
    window.post(bcast(length), "the state's header length", 8, length)
    window.post(bcast(head), "the state's header", len(header), head)
    for t, path in zip(tensors, paths):
        if t.numel() == 0:
            continue
        buf = _bytes(t.to(dev).contiguous())
        window.post(bcast(buf), f"{_where('state', path)}", buf.numel(), buf)
    window.drain()


def _as_dtensors(state: State, descs: List[_Desc], tensors: List[Any], live: Dict[str, Any]) -> None:
    """Shards received become DTensors again, laid out as this rank's own parameters:
    a model entry as its live entry (the live one itself when it was received in
    place), optimizer state as the parameter it belongs to."""
    from torch.distributed.tensor import DTensor

    params: List[Any] = []
    if state.optimizer is not None:
        params = [p for g in state.optimizer.param_groups for p in g["params"]]
    for i, d in enumerate(descs):
        if not d.dt:
            continue
        like = None
        if len(d.path) == 2 and d.path[0] == "model":
            like = live.get(d.path[1])
            if _is_dtensor(like) and like.to_local() is tensors[i]:
                tensors[i] = like
                continue
        elif len(d.path) == 4 and d.path[:2] == ("optimizer", "state") and type(d.path[2]) is int:
            if 0 <= d.path[2] < len(params):
                like = params[d.path[2]]
        if not _is_dtensor(like) or tuple(like.to_local().shape) != tuple(tensors[i].shape):
            raise _bad(f"{_where('state', d.path)} arrived as a shard of shape {list(d.shape)}, which no "
                       "sharded parameter of this rank has")
        tensors[i] = DTensor.from_local(
            tensors[i], like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
        )


def _receive(state: State, sub: Any, src: int, dev: Any, window: _Window) -> None:
    import torch
    import torch.distributed as dist

    def bcast(t: Any) -> Any:
        return dist.broadcast(t, src=src, group=sub, async_op=True)

    state._receiving()
    length = torch.empty(1, dtype=torch.int64, device=dev)
    window.post(bcast(length), f"the state's header length from rank {src}", 8)
    window.drain()
    n = int(length.item())
    if n < 0:
        raise StateTransferError(f"rank {src} could not send its state (its own error says why)")
    if n > _MAX_HEADER:
        raise _bad(f"a header of {n} bytes")
    head = torch.empty(n, dtype=torch.uint8, device=dev)
    window.post(bcast(head), f"the state's header from rank {src}", n)
    window.drain()
    tree, descs = parse_header(bytes(head.cpu().tolist()))
    live: Dict[str, Any] = dict(state.model.state_dict()) if state.model is not None else {}
    if state.optimizer is not None:
        state.optimizer.state.clear()  # replaced by what arrives: do not hold both
    tensors: List[Any] = []
    for d in descs:
        target: Optional[torch.Tensor] = None
        if len(d.path) == 2 and d.path[0] == "model" and d.path[1] in live:
            t = live[d.path[1]]
            if d.dt and _is_dtensor(t):
                t = t.to_local()
            if t.dtype == d.dtype and tuple(t.shape) == d.shape and t.device == dev and t.is_contiguous():
                target = t
        if target is None:
            target = torch.empty(d.shape, dtype=d.dtype, device=dev)
        tensors.append(target)
        if target.numel() > 0:
            buf = _bytes(target)
            window.post(bcast(buf), f"{_where('state', d.path)} from rank {src}", buf.numel())
    window.drain()
    for i, d in enumerate(descs):
        if d.host and tensors[i].device.type != "cpu" and d.path[:1] != ("model",):
            tensors[i] = tensors[i].cpu()
    if any(d.dt for d in descs):
        _as_dtensors(state, descs, tensors, live)
    d_tree = build(tree, tensors)
    if not isinstance(d_tree, dict):
        raise _bad("the state is not a dict")
    model = d_tree.get("model")
    in_place = (
        isinstance(model, dict)
        and set(model) == set(live)
        and all(model[k] is live[k] for k in live)
    )
    state._load(d_tree, model_loaded=in_place)
