#!/usr/bin/python3
"""What loading a SPANK plugin costs sbatch, per plugin stack, on one running test cluster.

Stacks: none; a trivial C plugin (fixtures/floor_spank.c: one option, nothing else);
the least Rust plugin (fixtures/min_rust_spank.rs: std, catch_unwind, one option; built
like ours, panic=unwind and libgcc_eh static, with rustc's default -z now); ours (the
spank_bftrainer.so named in the cluster's plugstack.conf). Each stack gets its own copy
of slurm.conf differing only in PlugStackConfig.

Counts that do not drift with machine load, for one `sbatch --hold --wrap=true`:
instructions of the whole process and inside Slurm's SPANK calls (spank_init_allocator,
which loads the plugins and runs slurm_spank_init, + spank_init_post_opt + spank_fini),
by callgrind; page faults (perf stat -r 20) and system calls (strace -c) of
`sbatch --nodes=abc --wrap=true`, which loads the stack and fails in option parsing.
Then, with --runs N, sbatch's CPU time (wait4) for that failing command, the stacks
interleaved run by run (order reversed every round), medians over N runs.

    eval "$(tests/cluster/cluster up --dir /tmp/c --plugins DIR)"   # DIR as in CLUSTER_SPEC
    nice -n -15 plugin/job_submit/benches/spank_cost.py --runs 800 [--plugin old=PATH]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
FAILING = ["sbatch", "--nodes=abc", "--wrap=true"]


def die(msg):
    sys.exit(f"spank_cost.py: {msg}")


def run(cmd, env=None, check=True):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        die(f"`{' '.join(cmd)}` failed (exit {p.returncode}):\n{p.stderr}")
    return p


def build_floors(tmp):
    c_so = os.path.join(tmp, "floor_c.so")
    run(["cc", "-O2", "-shared", "-fPIC", "-o", c_so, os.path.join(HERE, "fixtures/floor_spank.c")])
    eh = run(["cc", "-print-file-name=libgcc_eh.a"]).stdout.strip()
    rs_so = os.path.join(tmp, "floor_rust.so")
    run(["rustc", "--edition", "2021", "-O", "-C", "panic=unwind", "--crate-type", "cdylib",
         "-o", rs_so, os.path.join(HERE, "fixtures/min_rust_spank.rs"),
         "-L", os.path.dirname(eh), "-l", "static=gcc_eh"])
    return c_so, rs_so


def counts(env):
    cg = env["SLURM_CONF"] + ".cg"
    job = run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}",
               "sbatch", "--parsable", "--hold", "--wrap=true"], env=env).stdout.strip()
    run(["scancel", job], env=env, check=False)
    total = spank = 0
    flat = run(["callgrind_annotate", cg]).stdout
    m = re.search(r"^\s*([\d,]+).*PROGRAM TOTALS", flat, re.M)
    total = int(m.group(1).replace(",", "")) if m else 0
    incl = run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", cg]).stdout
    for line in incl.splitlines():
        m = re.match(r"\s*([\d,]+) .*:(spank_init_allocator|spank_init_post_opt|spank_fini) \[", line)
        if m:
            spank += int(m.group(1).replace(",", ""))
    pf = run(["perf", "stat", "-x,", "-e", "page-faults", "-r", "20"] + FAILING, env=env, check=False).stderr
    faults = next((l.split(",")[0] for l in pf.splitlines() if "page-faults" in l), "?")
    st = env["SLURM_CONF"] + ".strace"
    run(["strace", "-f", "-c", "-o", st] + FAILING, env=env, check=False)
    with open(st) as f:
        last = [l for l in f.read().splitlines() if l.rstrip().endswith("total")]
    calls = last[-1].split()[-3] if last else "?"
    return total, spank, faults, calls


def cpu_times(envs, runs):
    devnull = os.open(os.devnull, os.O_WRONLY)
    out = {name: [] for name in envs}
    names = list(envs)
    for r in range(runs + 1):
        for name in names if r % 2 == 0 else names[::-1]:
            pid = os.fork()
            if pid == 0:
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                os.execvpe(FAILING[0], FAILING, envs[name])
            _, _, ru = os.wait4(pid, 0)
            if r > 0:  # round 0 warms the page cache for every stack
                out[name].append((ru.ru_utime + ru.ru_stime) * 1e6)
    return {name: statistics.median(v) for name, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=0, help="timed runs per stack (0: counts only)")
    ap.add_argument("--plugin", action="append", default=[], metavar="NAME=PATH",
                    help="one more stack: the SPANK plugin at PATH (e.g. an older build)")
    a = ap.parse_args()
    if a.runs < 0:
        die("--runs needs a whole number >= 0")
    conf = os.environ.get("SLURM_CONF") or die("set SLURM_CONF to a test cluster started with --plugins DIR")
    for tool in ["valgrind", "callgrind_annotate", "perf", "strace", "cc", "rustc", "sbatch"]:
        if not shutil.which(tool):
            die(f"needs {tool} on PATH")
    try:
        with open(conf) as f:
            text = f.read()
    except OSError as e:
        die(f"cannot read SLURM_CONF {conf}: {e.strerror}")
    m = re.search(r"^PlugStackConfig=(.*)$", text, re.M)
    stack = open(m.group(1)).read().split() if m and os.path.exists(m.group(1)) else []
    ours = next((stack[i + 1] for i, w in enumerate(stack[:-1]) if w in ("required", "optional")), None)
    if not ours or not os.path.exists(ours):
        die(f"no SPANK plugin in the PlugStackConfig of {conf}")
    with tempfile.TemporaryDirectory() as tmp:
        c_so, rs_so = build_floors(tmp)
        envs = {}
        extra = []
        for kv in a.plugin:
            name, _, path = kv.partition("=")
            if not name or not os.path.isfile(path):
                die(f"--plugin {kv}: expected NAME=PATH of an existing .so")
            extra.append((name, os.path.abspath(path)))
        stacks = [("none", None), ("floor_c", c_so), ("floor_rust", rs_so), ("ours", ours)] + extra
        for name, so in stacks:
            sp = os.path.join(tmp, f"plugstack-{name}.conf")
            with open(sp, "w") as f:
                f.write(f"required {so}\n" if so else "")
            sc = os.path.join(tmp, f"slurm-{name}.conf")
            with open(sc, "w") as f:
                f.write(re.sub(r"^PlugStackConfig=.*$", f"PlugStackConfig={sp}", text, flags=re.M))
            envs[name] = dict(os.environ, SLURM_CONF=sc)
        print(f"{'stack':<11} {'instr total':>12} {'instr SPANK':>12} {'faults':>7} {'syscalls':>9}")
        for name, env in envs.items():
            total, spank, faults, calls = counts(env)
            print(f"{name:<11} {total:>12,} {spank:>12,} {faults:>7} {calls:>9}")
        if a.runs:
            med = cpu_times(envs, a.runs)
            base = med["none"]
            print(f"sbatch CPU p50 of `{' '.join(FAILING)}`, {a.runs} runs per stack, interleaved:")
            for name, v in med.items():
                print(f"  {name:<11} {v:7.0f} us  ({v - base:+.0f} us)")


if __name__ == "__main__":
    main()
