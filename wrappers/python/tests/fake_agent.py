"""A stand-in for bft-run's agent and coordinator, driven by the test: workers connect
to its Unix socket exactly as to a real agent; the test decides the generations."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "train.py")


class FakeAgent:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="bft-fake-agent-")
        self.path = os.path.join(self.dir, "agent.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(64)
        self.lock = threading.Condition()
        self.conns: Dict[str, socket.socket] = {}
        self.ready: Dict[str, str] = {}
        self.messages: List[Dict[str, Any]] = []
        self.procs: Dict[str, subprocess.Popen] = {}
        self.gen = 0
        self.last_gen: Optional[Dict[str, Any]] = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        f = c.makefile("rb")
        worker = None
        for line in f:
            msg = json.loads(line)
            with self.lock:
                self.messages.append(msg)
                if msg["t"] == "hello":
                    worker = msg["worker"]
                    self.conns[worker] = c
                    if self.last_gen is not None:
                        self._send(c, self.last_gen)
                elif msg["t"] == "ready":
                    self.ready[msg["worker"]] = msg["store"]
                self.lock.notify_all()

    def _send(self, c: socket.socket, msg: Dict[str, Any]) -> None:
        try:
            c.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            pass

    def spawn(self, worker: str, args: List[str], log: str) -> subprocess.Popen:
        env = dict(os.environ, BFT_AGENT_SOCK=self.path, BFT_WORKER_ID=worker, BFT_NODE_ADDR="127.0.0.1")
        p = subprocess.Popen(
            [sys.executable, EXAMPLE, *args],
            env=env,
            stdout=open(log + ".out", "w"),
            stderr=open(log + ".err", "w"),
        )
        self.procs[worker] = p
        return p

    def wait_for(self, pred, timeout: float = 60.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        with self.lock:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what}; messages: {self.messages[-10:]}")
                self.lock.wait(min(left, 0.2))

    def wait_ready(self, workers: List[str], timeout: float = 60.0) -> None:
        self.wait_for(lambda: all(w in self.ready for w in workers), timeout, f"ready {workers}")

    def announce(self, members: List[str]) -> int:
        with self.lock:
            self.gen += 1
            msg = {"t": "gen", "gen": self.gen, "members": members, "store": self.ready[members[0]]}
            self.last_gen = msg
            for c in list(self.conns.values()):
                self._send(c, msg)
            return self.gen

    def count(self, t: str, **match: Any) -> int:
        with self.lock:
            return sum(1 for m in self.messages if m["t"] == t and all(m.get(k) == v for k, v in match.items()))

    def progress_samples(self) -> int:
        with self.lock:
            return max([m["samples"] for m in self.messages if m["t"] == "progress"] or [0])

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        self.srv.close()
