"""The worker's side of the agent connection (a Unix socket, JSON lines).

A background thread reads what the agent forwards from the coordinator (``gen``,
``abort``, ``end``, ``kvr``, ``error``) so that training threads only look at memory;
a second one sends a heartbeat every second (the agent kills a worker that stops
sending: frozen or wedged) and acknowledges aborts at once, whatever the training
thread is doing. See docs/design.md, "Elastic runtime", for the messages.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set

MAX_LINE = 1 << 20
HEARTBEAT_S = 1.0


class AgentError(RuntimeError):
    """The agent connection failed or the agent said something we cannot use."""


class JobEnded(Exception):
    """The coordinator ended the job (``end``); ``code`` is the job's exit code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"the job ended (code {code}): {reason}")
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class Generation:
    gen: int
    members: List[str]
    #: Members of the previous generation lost to a failure.
    dead: List[str]
    #: The global batch bftrainerd decided (``batch_now``), or None: the script's own.
    batch: Optional[int] = None

    def rank_of(self, worker: str) -> Optional[int]:
        try:
            return self.members.index(worker)
        except ValueError:
            return None


class AgentClient:
    def __init__(self, path: str, worker: str) -> None:
        self.worker = worker
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
        except OSError as e:
            raise AgentError(f"cannot reach the bft-run agent at {path}: {e}") from e
        self._wlock = threading.Lock()
        self._cond = threading.Condition()
        self._gens: Dict[int, Generation] = {}
        self.latest = 0
        #: Workers known to have failed (their collectives will not complete).
        self.dead: Set[str] = set()
        #: Generations aborted by the coordinator.
        self.aborted: Set[int] = set()
        #: The generation this worker is a member of (set by the runtime), and the
        #: ones it has acknowledged an abort of.
        self.current_gen = 0
        self._acked: Set[int] = set()
        self._leave = False
        self._left = False
        self._ended: Optional[JobEnded] = None
        self._closed: Optional[str] = None
        self._ids = itertools.count(1)
        self._replies: Dict[int, Dict[str, Any]] = {}
        #: The agent's commit decisions (``vote``), by (generation, step index).
        self._decisions: Dict[Any, bool] = {}
        #: Called from the reader thread after every message and when the connection
        #: ends (the runtime aborts a broken generation's group from there).
        self.listeners: List[Callable[[], None]] = []
        self.send({"t": "hello", "worker": worker})
        self._reader = threading.Thread(target=self._read, name="bftrainer-agent", daemon=True)
        self._reader.start()
        self._beat = threading.Thread(target=self._heartbeat, name="bftrainer-heartbeat", daemon=True)
        self._beat.start()

    def send(self, msg: Dict[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self._wlock:
            try:
                self._sock.sendall(data)
            except OSError as e:
                raise AgentError(f"lost the bft-run agent: {e}") from e

    def _heartbeat(self) -> None:
        while self._closed is None:
            try:
                self.send({"t": "hb", "worker": self.worker})
                if self._leave and not self._left:
                    # Sent from here, not from the signal handler (which may run while
                    # the training thread holds the write lock).
                    self._left = True
                    self.send({"t": "leave", "worker": self.worker})
            except AgentError:
                return
            time.sleep(HEARTBEAT_S)

    def request_leave(self) -> None:
        """Leave at the next step boundary (this worker got SIGTERM): async-signal safe."""
        self._leave = True

    def _read(self) -> None:
        buf = b""
        reason = "the agent closed the connection"
        try:
            while True:
                chunk = self._sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self._handle(json.loads(line))
                if len(buf) > MAX_LINE:
                    reason = "the agent sent a line over 1 MiB"
                    break
        except (OSError, ValueError) as e:
            reason = f"agent connection failed: {e}"
        except Exception as e:  # noqa: BLE001 - a bad message must not leave waiters hanging
            reason = f"agent connection failed: {type(e).__name__}: {e}"
        finally:
            with self._cond:
                self._closed = self._closed or reason
                self._cond.notify_all()
            self._notify()

    def _notify(self) -> None:
        for fn in list(self.listeners):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a listener must not kill the reader
                print(f"bftrainer: agent listener failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def _handle(self, msg: Dict[str, Any]) -> None:
        t = msg.get("t")
        ack: Optional[int] = None
        with self._cond:
            if t == "gen":
                batch = msg.get("batch")
                g = Generation(
                    int(msg["gen"]),
                    [str(m) for m in msg["members"]],
                    [str(d) for d in msg.get("dead", [])],
                    int(batch) if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else None,
                )
                self._gens[g.gen] = g
                self.dead.update(g.dead)
                self.latest = max(self.latest, g.gen)
                # Keep a short history: a switch agrees on a number that every member
                # has seen or is about to see.
                for old in [k for k in self._gens if k < self.latest - 64]:
                    del self._gens[old]
            elif t == "abort":
                gen = int(msg["gen"])
                self.aborted.add(gen)
                # Acknowledged when it is this worker's generation or one it is entering
                # (the coordinator ignores an acknowledgement from a non-member).
                if gen >= self.current_gen and gen not in self._acked:
                    self._acked.add(gen)
                    ack = gen
            elif t == "kvr":
                self._replies[int(msg["id"])] = msg
            elif t == "decide":
                self._decisions[(int(msg["gen"]), int(msg["k"]))] = msg.get("commit") is True
            elif t == "end":
                self._ended = JobEnded(int(msg.get("code", 0)), str(msg.get("reason", "")))
            elif t == "error":
                print(f"bftrainer: agent error: {msg.get('msg')}", file=sys.stderr, flush=True)
            self._cond.notify_all()
        if t in ("gen", "abort", "end"):
            self._notify()
        if ack is not None:
            # At once, from this thread: the coordinator drops members that do not
            # acknowledge within --broken-timeout, and a long step must not look hung.
            try:
                self.send({"t": "broken", "worker": self.worker, "gen": ack})
            except AgentError:
                pass  # the connection is gone: the reader ends next

    def broken(self, gen: int) -> None:
        """Report that a collective of ``gen`` failed here (once per generation)."""
        with self._cond:
            if gen in self._acked:
                return
            self._acked.add(gen)
        self.send({"t": "broken", "worker": self.worker, "gen": gen})

    def failed(self, gen: int, members: List[str]) -> Optional[str]:
        """Why collectives of generation ``gen`` (these members) cannot complete, or None."""
        if gen in self.aborted:
            return f"the coordinator aborted generation {gen}"
        lost = [m for m in members if m in self.dead]
        if lost:
            return f"member(s) {' '.join(lost)} failed"
        return None

    def check(self) -> None:
        if self._ended is not None:
            raise self._ended
        if self._closed is not None:
            raise AgentError(self._closed)

    def wait(self, pred: "Any", timeout: Optional[float], what: str) -> None:
        """Wait until ``pred()`` holds (under the lock); raise on end or loss."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not pred():
                self.check()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise AgentError(f"timed out after {timeout:.0f} s waiting for {what}")
                self._cond.wait(timeout=0.5 if left is None else min(left, 0.5))

    def generation(self, gen: int, timeout: Optional[float] = None) -> Generation:
        self.wait(lambda: gen in self._gens, timeout, f"generation {gen}")
        return self._gens[gen]

    def newer_than(self, after: int, timeout: Optional[float] = None) -> Generation:
        """The newest generation once there is one newer than ``after``."""
        self.wait(lambda: self.latest > after, timeout, f"a generation after {after}")
        return self._gens[self.latest]

    def request(self, msg: Dict[str, Any], timeout: Optional[float]) -> Dict[str, Any]:
        """A store request to the coordinator; its answer (an error answer raises)."""
        rid = next(self._ids)
        msg = dict(msg, t="kv", worker=self.worker, id=rid)
        if timeout is not None:
            msg["timeout"] = timeout
        self.send(msg)
        # The coordinator answers a held request at its deadline; a little more here.
        self.wait(lambda: rid in self._replies, None if timeout is None else timeout + 30, "the store")
        with self._cond:
            r = self._replies.pop(rid)
        if "err" in r:
            raise RuntimeError(f"bftrainer store: {r['err']}")
        return r

    def vote(self, gen: int, k: int) -> bool:
        """Ask the agent whether this worker's ``k``-th optimizer step of generation
        ``gen`` commits: True once every worker of this node voted for it, False if the
        generation failed here first (the agent's decision, the same for all of them;
        bft-run's votes.rs)."""
        self.send({"t": "vote", "worker": self.worker, "gen": gen, "k": k})
        key = (gen, k)
        self.wait(lambda: key in self._decisions, None, f"the node's decision on step {k} of generation {gen}")
        with self._cond:
            return self._decisions.pop(key)

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


def _bytes(v: Any) -> bytes:
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def store_class() -> type:
    """The torch.distributed Store held by the coordinator (made on first use: torch
    is imported only then)."""
    global _STORE
    if _STORE is not None:
        return _STORE
    import torch.distributed as dist

    class CoordStore(dist.Store):  # type: ignore[misc]
        """A c10d Store whose keys live in the job's coordinator, reached through the
        agent: no port of its own, so no other user can read or write it."""

        def __init__(self, agent: AgentClient, timeout: float) -> None:
            super().__init__()
            self._agent = agent
            self._timeout = timeout

        def set_timeout(self, timeout: datetime.timedelta) -> None:
            self._timeout = timeout.total_seconds()

        def set(self, key: str, value: Any) -> None:
            self._agent.request({"op": "set", "key": key, "value": _bytes(value).hex()}, None)

        def get(self, key: str) -> bytes:
            return bytes.fromhex(self._agent.request({"op": "get", "key": key}, self._timeout)["value"])

        def add(self, key: str, delta: int) -> int:
            return int(self._agent.request({"op": "add", "key": key, "delta": int(delta)}, None)["n"])

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            r = self._agent.request(
                {"op": "cas", "key": key, "expected": _bytes(expected).hex(), "desired": _bytes(desired).hex()}, None
            )
            return bytes.fromhex(r["value"])

        def wait(self, keys: List[str], timeout: Optional[datetime.timedelta] = None) -> None:
            t = self._timeout if timeout is None else timeout.total_seconds()
            self._agent.request({"op": "wait", "keys": list(keys)}, t)

        def check(self, keys: List[str]) -> bool:
            return bool(self._agent.request({"op": "check", "keys": list(keys)}, None)["found"])

        def delete_key(self, key: str) -> bool:
            return bool(self._agent.request({"op": "delete", "key": key}, None)["found"])

        def num_keys(self) -> int:
            return int(self._agent.request({"op": "num_keys"}, None)["n"])

    _STORE = CoordStore
    return CoordStore


_STORE: Optional[type] = None


def from_env() -> Optional[AgentClient]:
    path = os.environ.get("BFT_AGENT_SOCK")
    if not path:
        return None
    worker = os.environ.get("BFT_WORKER_ID")
    if not worker:
        raise AgentError("BFT_AGENT_SOCK is set but BFT_WORKER_ID is not: start workers with bft-run")
    return AgentClient(path, worker)
