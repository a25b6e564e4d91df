"""A stand-in for bft-run's agent and coordinator, driven by the test: workers connect
to its Unix socket exactly as to a real agent; the test decides the generations. A
member's first ``broken`` report aborts its generation for all, as the coordinator does
(a test may also abort one itself). It holds the job's store as the coordinator does (``kv`` requests)."""

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
#: Runs the example as __main__ after registering an exit hook, which runs after every
#: hook the library registers (atexit runs them last in, first out): it says on stderr
#: when a process group is still there at exit. On NCCL torch then warns
#: "destroy_process_group() was not called before program exit"; gloo is silent, so
#: the tests look for this line instead.
LEFT_AT_EXIT = "bftrainer-test: a process group was left at exit"
EXIT_PROBE = f"""
import atexit, runpy, sys

def probe():
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        print({LEFT_AT_EXIT!r}, file=sys.stderr, flush=True)

atexit.register(probe)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


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
        self.kv: Dict[str, bytes] = {}
        self.aborted: set = set()
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
                    self.ready[msg["worker"]] = "coord"
                elif msg["t"] == "broken" and int(msg["gen"]) not in self.aborted:
                    # As the coordinator does: the first report of a failed collective
                    # aborts the generation for every member. A member whose own
                    # collective waits on a live peer (which gave up on the dead one
                    # mid-ring and never sends again) learns of the loss only this way.
                    self._abort_locked(int(msg["gen"]))
                elif msg["t"] == "kv":
                    threading.Thread(target=self._kv, args=(c, msg), daemon=True).start()
                self.lock.notify_all()

    def _kv(self, c: socket.socket, m: Dict[str, Any]) -> None:
        """One store request, with TCPStore's semantics (get and wait block)."""
        op, key = m["op"], m.get("key", "")
        r: Dict[str, Any] = {"t": "kvr", "worker": m["worker"], "id": m["id"]}
        with self.lock:
            if op in ("get", "wait"):
                keys = [key] if op == "get" else m["keys"]
                deadline = time.monotonic() + float(m.get("timeout", 300))
                while not all(k in self.kv for k in keys):
                    if time.monotonic() > deadline:
                        r["err"] = f"timed out waiting for key(s) {keys}"
                        break
                    self.lock.wait(0.05)
                else:
                    if op == "get":
                        r["value"] = self.kv[key].hex()
            elif op == "set":
                self.kv[key] = bytes.fromhex(m["value"])
            elif op == "add":
                n = int(self.kv.get(key, b"0")) + int(m["delta"])
                self.kv[key] = str(n).encode()
                r["n"] = n
            elif op == "cas":
                exp, des = bytes.fromhex(m["expected"]), bytes.fromhex(m["desired"])
                cur = self.kv.get(key)
                if (cur is None and exp == b"") or cur == exp:
                    self.kv[key] = des
                    cur = des
                elif cur is None:
                    cur = exp
                r["value"] = cur.hex()
            elif op == "check":
                r["found"] = all(k in self.kv for k in m["keys"])
            elif op == "delete":
                r["found"] = self.kv.pop(key, None) is not None
            elif op == "num_keys":
                r["n"] = len(self.kv)
            self.lock.notify_all()
            self._send(c, r)

    def _send(self, c: socket.socket, msg: Dict[str, Any]) -> None:
        try:
            c.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            pass

    def spawn(self, worker: str, args: List[str], log: str) -> subprocess.Popen:
        env = dict(os.environ, BFT_AGENT_SOCK=self.path, BFT_WORKER_ID=worker, BFT_NODE_ADDR="127.0.0.1", BFT_JOB="fake")
        p = subprocess.Popen(
            [sys.executable, "-c", EXIT_PROBE, EXAMPLE, *args],
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

    def wait_ready(self, workers: List[str], timeout: float = 300.0) -> None:
        # Generous: three workers importing torch at once on a loaded 2-core machine
        # took over 60 s.
        self.wait_for(lambda: all(w in self.ready for w in workers), timeout, f"ready {workers}")

    def announce(self, members: List[str], dead: Optional[List[str]] = None) -> int:
        with self.lock:
            self.gen += 1
            msg = {"t": "gen", "gen": self.gen, "members": members, "dead": dead or []}
            self.last_gen = msg
            for c in list(self.conns.values()):
                self._send(c, msg)
            return self.gen

    def abort(self, gen: int) -> None:
        """As the coordinator does at a member's first ``broken`` report."""
        with self.lock:
            self._abort_locked(gen)

    def _abort_locked(self, gen: int) -> None:
        self.aborted.add(gen)
        for c in list(self.conns.values()):
            self._send(c, {"t": "abort", "gen": gen})

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
