#!/usr/bin/env python3
"""Cuts the committed replay sample out of the BFTrainer data in data/ (run from the
repository root): one day of the Summit node-event trace from the original replayer's
start (2021-02-10T20:21:15) and the first 200 ImageNet jobs, and the same jobs with
requests for the node classes of mixed-nodes.toml (jobs-gpu-200.csv).

    python3 data/sample/make_sample.py data/bftrainer-summit data/sample
"""
import csv, gzip, io, sys
from datetime import datetime, timedelta

src, dst = sys.argv[1], sys.argv[2]
start = datetime.fromisoformat("2021-02-10T20:21:15")
end = start + timedelta(hours=24)
state, order, changes = {}, [], []
with gzip.open(f"{src}/node-events.csv.gz", "rt") as f:
    r = csv.reader(f)
    next(r)
    for t, node, idle in r:
        ts = datetime.fromisoformat(t)
        if ts <= start:
            if node not in state:
                order.append(node)
            state[node] = idle
        elif ts <= end:
            changes.append((t, node, idle))
        else:
            break
out = io.StringIO()
out.write("time,node,idle\n")
for n in order:
    out.write(f"{start.isoformat()},{n},{state[n]}\n")
for t, n, i in changes:
    out.write(f"{t},{n},{i}\n")
# mtime=0: the same input gives byte-identical output.
with open(f"{dst}/summit-day.csv.gz", "wb") as raw:
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as g:
        g.write(out.getvalue().encode())
with open(f"{src}/jobs-imagenet-imgps-1001.csv") as f, open(f"{dst}/jobs-imagenet-200.csv", "w") as g:
    for i, line in enumerate(f):
        if i > 200:
            break
        g.write(line)
# The same 200 jobs asking for GPUs of a type or CPU nodes (mixed-nodes.toml's classes),
# in turn: a100 (4 per node), v100 (4 per node), constraint cpu.
asks = ["4,a100,", "4,v100,", ",,cpu"]
with open(f"{dst}/jobs-imagenet-200.csv") as f, open(f"{dst}/jobs-gpu-200.csv", "w") as g:
    for i, line in enumerate(f):
        line = line.rstrip("\n")
        extra = "gpus_per_node,gpu_type,constraint" if i == 0 else asks[(i - 1) % 3]
        g.write(f"{line},{extra}\n")
print(f"{len(order)} nodes, {len(changes)} changes")
