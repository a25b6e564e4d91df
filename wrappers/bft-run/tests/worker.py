"""A stand-in for a training worker (no torch): speaks the worker side of bft-run's
Unix-socket protocol and logs what it saw to $TEST_DIR/<worker id>, one line per event.

Behaviour, from the environment (bft-run passes the user's variables through):
  TEST_FINISH_AT=G, TEST_FINISH_SIZE=N  send `done` and exit 0 in the first generation
                                        >= G with >= N members that lists this worker
  TEST_SUICIDE=ID     the worker ID kills itself with SIGKILL in its first generation
  TEST_BROKEN=ID      the worker ID reports `broken` for its first generation
  TEST_SILENT=ID      the worker ID hangs (reads nothing more, so acknowledges no abort)
                      in its first generation; its heartbeat thread goes on
  TEST_NO_HEARTBEAT=ID  the worker ID sends no heartbeats (the agent kills it as hung)
  TEST_STOP=ID        the worker ID stops itself (SIGSTOP) in its first generation
  TEST_AFTER_DONE=S   after `done`, spend S seconds "saving" before exiting
  TEST_PROBE=1        first say hello as an id the agent did not start, later again
                      as itself on a second connection; log both refusals
SIGTERM: exit 0 (a graceful leave). A generation that no longer lists a worker that
was a member: exit 0 (it left). `end`: exit 0. `abort` of its generation: it answers
`broken` at once, as the library's background thread does. A heartbeat every 0.5 s.
"""

import json
import os
import signal
import socket
import sys
import threading
import time

wid = os.environ["BFT_WORKER_ID"]
log_path = os.path.join(os.environ["TEST_DIR"], wid)
finish_at = int(os.environ.get("TEST_FINISH_AT", "1"))
finish_size = int(os.environ.get("TEST_FINISH_SIZE", "1"))


def log(line):
    with open(log_path, "a") as f:
        f.write(line + "\n")


def on_term(signum, frame):
    log("sigterm")
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
sock = socket.socket(socket.AF_UNIX)
sock.connect(os.environ["BFT_AGENT_SOCK"])
f = sock.makefile("rw")


lock = threading.Lock()


def send(msg):
    with lock:
        f.write(json.dumps(msg) + "\n")
        f.flush()


def heartbeat():
    while True:
        try:
            send({"t": "hb", "worker": wid})
        except (OSError, ValueError):
            return
        time.sleep(0.5)




def probe(claimed):
    """Say hello as `claimed` on a second connection; log the agent's answer."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["BFT_AGENT_SOCK"])
    s.sendall((json.dumps({"t": "hello", "worker": claimed}) + "\n").encode())
    log("probe %s: %s" % (claimed, s.makefile().readline().strip()))
    s.close()


probing = os.environ.get("TEST_PROBE") == "1"
if probing:
    probe("9.9")
send({"t": "hello", "worker": wid})
if os.environ.get("TEST_NO_HEARTBEAT") != wid:
    threading.Thread(target=heartbeat, daemon=True).start()
log(
    "start local_rank=%s cuda=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s"
    % (
        os.environ["BFT_LOCAL_RANK"],
        os.environ.get("CUDA_VISIBLE_DEVICES", "-"),
        os.environ.get("LOCAL_RANK", "-"),
        os.environ.get("LOCAL_WORLD_SIZE", "-"),
    )
)
if probing:
    time.sleep(0.2)  # the agent has registered our own hello by now
    probe(wid)
send({"t": "ready", "worker": wid})
member = False
current = 0
for line in f:
    m = json.loads(line)
    t = m["t"]
    if t == "gen":
        gen, members = m["gen"], m["members"]
        log("gen %d %s dead=%s" % (gen, " ".join(members), ",".join(m.get("dead", []))))
        if wid not in members:
            if member:
                log("left")
                sys.exit(0)
            continue  # not admitted yet
        first = not member
        member = True
        current = gen
        if first and os.environ.get("TEST_SUICIDE") == wid:
            os.kill(os.getpid(), signal.SIGKILL)
        if first and os.environ.get("TEST_STOP") == wid:
            log("stopping")
            os.kill(os.getpid(), signal.SIGSTOP)
        if first and os.environ.get("TEST_SILENT") == wid:
            log("hanging")
            time.sleep(600)
        if first and os.environ.get("TEST_BROKEN") == wid:
            send({"t": "broken", "worker": wid, "gen": gen})
            continue
        send({"t": "progress", "worker": wid, "gen": gen, "samples": 100 * gen})
        if gen >= finish_at and len(members) >= finish_size:
            send({"t": "done", "worker": wid, "gen": gen})
            log("done")
            # Like a script saving its model after training: the end of the job must
            # not cut this short.
            time.sleep(float(os.environ.get("TEST_AFTER_DONE", "0")))
            log("saved")
            sys.exit(0)
    elif t == "abort":
        log("abort %d" % m["gen"])
        if m["gen"] == current:
            send({"t": "broken", "worker": wid, "gen": m["gen"]})
    elif t == "end":
        log("end %s" % m["code"])
        sys.exit(0)
    elif t == "error":
        print("agent error: %s" % m.get("msg"), file=sys.stderr)
        sys.exit(5)
log("agent closed")
sys.exit(0)
