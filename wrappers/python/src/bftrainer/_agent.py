"""The worker's side of the agent connection (a Unix socket, JSON lines).

A background thread reads what the agent forwards from the coordinator (``gen``,
``end``, ``error``) so that training threads only look at memory; see docs/design.md,
"Elastic runtime", for the messages.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

MAX_LINE = 1 << 20


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
    store: str

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
        self._ended: Optional[JobEnded] = None
        self._closed: Optional[str] = None
        self.send({"t": "hello", "worker": worker})
        self._reader = threading.Thread(target=self._read, name="bftrainer-agent", daemon=True)
        self._reader.start()

    def send(self, msg: Dict[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self._wlock:
            try:
                self._sock.sendall(data)
            except OSError as e:
                raise AgentError(f"lost the bft-run agent: {e}") from e

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
        with self._cond:
            self._closed = reason
            self._cond.notify_all()

    def _handle(self, msg: Dict[str, Any]) -> None:
        t = msg.get("t")
        with self._cond:
            if t == "gen":
                g = Generation(int(msg["gen"]), [str(m) for m in msg["members"]], str(msg["store"]))
                self._gens[g.gen] = g
                self.latest = max(self.latest, g.gen)
                # Keep a short history: a switch agrees on a number that every member
                # has seen or is about to see.
                for old in [k for k in self._gens if k < self.latest - 64]:
                    del self._gens[old]
            elif t == "end":
                self._ended = JobEnded(int(msg.get("code", 0)), str(msg.get("reason", "")))
            elif t == "error":
                print(f"bftrainer: agent error: {msg.get('msg')}", file=sys.stderr, flush=True)
            self._cond.notify_all()

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

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


def from_env() -> Optional[AgentClient]:
    path = os.environ.get("BFT_AGENT_SOCK")
    if not path:
        return None
    worker = os.environ.get("BFT_WORKER_ID")
    if not worker:
        raise AgentError("BFT_AGENT_SOCK is set but BFT_WORKER_ID is not: start workers with bft-run")
    return AgentClient(path, worker)
