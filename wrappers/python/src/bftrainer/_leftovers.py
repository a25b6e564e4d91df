"""Process groups let go of with collectives still pending.

A group's destructor waits for its pending collectives. After a failure a collective
may be stuck on a peer that gave up on it (and is stuck on one of ours in turn):
neither completes before the group's timeout (30 min by default), and the destructor
runs without the GIL, so the heartbeat thread goes on and nothing judges the worker
hung. So a group left with such collectives stays referenced here until they end (an
error when the peer's sockets close, or the timeout), and only then is dropped, when
its destructor returns at once."""

from __future__ import annotations

import atexit
import ctypes
from typing import Any, Iterable, List, Tuple


class Leftovers:
    def __init__(self) -> None:
        self._kept: List[Tuple[Any, List[Any]]] = []
        self._hooked = False

    def leave(self, group: Any, works: Iterable[Any]) -> None:
        """Let go of ``group``: kept until ``works`` (its collectives issued here and
        maybe not complete) have ended; dropped at once if they have."""
        pending = [w for w in works if not w.is_completed()]
        if pending:
            self._kept.append((group, pending))
            if not self._hooked:
                self._hooked = True
                atexit.register(self._at_exit)
        self.prune()

    def _at_exit(self) -> None:
        """At the interpreter's exit the groups still kept are never destroyed (a
        reference is leaked on purpose): their destructors would wait for collectives
        that peers exiting the same way never end, and the worker would not exit
        before the timeout. The process's end closes their sockets anyway."""
        self.prune()
        for g, _ in self._kept:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(g))

    def prune(self) -> None:
        """Drops the groups whose collectives have all ended."""
        self._kept = [(g, ws) for g, ws in self._kept if not all(w.is_completed() for w in ws)]

    def __len__(self) -> int:
        return len(self._kept)


#: The one list of the process (the runtime's groups and the transfers' groups).
LEFTOVERS = Leftovers()
