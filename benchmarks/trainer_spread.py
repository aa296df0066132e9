"""The trainer's step time over several whole runs of a recipe (issue 40, "a steady trainer"), and who else used the
CPU while it trained.

Each run is ``rlvr train RECIPE`` (``run.steps``, no validation, no checkpoints, no sample tables) in a process of
its own, one run after another; a sampler reads every process of the run's tree from ``/proc`` every
``--interval`` seconds (CPU seconds, by role: the Ray actor's name, ``raylet``, the driver, ...). Printed per run:
``timing/train_s`` of each step after the first (median, min, max), and the CPU cores each role used on average
while the trainer trained (the sampler's intervals in which the trainer's process used more than half a core).
Printed at the end: the median step over all runs, the spread (max/min of the runs' medians), and each run's
median as a ratio of the fastest run's.

    .venv/bin/python benchmarks/trainer_spread.py --runs 3 --steps 6
    .venv/bin/python benchmarks/trainer_spread.py --runs 3 --steps 6 -- trainer.malloc=system   # overrides for rlvr train

Also printed: ``train/tokens_per_s`` (median, min, max) and the trainer's minor page faults per second while it
trained (trainer.malloc: keep against system, README "The trainer's memory on CPU").

Run it alone on the machine: anything beside it is in the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out[ppid].append(int(d))
    return out


def _tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _role(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    m = re.match(r"ray::(\w+)", cmd)
    if m:
        return m.group(1)  # an actor's process title: ray::PolicyWorker, ray::VLLMEngine, ray::IDLE
    exe = Path(cmd.split()[0]).name if cmd else "?"
    if exe.startswith("python"):
        for key in ("rlvr train", "log_monitor", "dashboard", "monitor.py", "forkserver", "multiprocessing"):
            if key in cmd:
                return key.split()[0].removesuffix(".py")
    return exe


def _cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid``'s threads so far (utime + stime), and its minor page faults so far."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK, float(f[7])
    except (OSError, IndexError, ValueError):
        return float("nan"), float("nan")


def one_run(k: int, steps: int, recipe: str, extra: list[str], interval: float, out: Path) -> dict:
    cmd = [str(ROOT / ".venv" / "bin" / "rlvr"), "train", recipe, f"run.steps={steps}", f"run.output_dir={out}",
           f"run.name=spread{k}", "validation.every_steps=0", "checkpoint.every_steps=0", "metrics.samples_every=0",
           *extra]
    log = open(out / f"run{k}.log", "w")
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    last: dict[int, tuple[str, float, float]] = {}
    faults = 0.0  # the trainer's minor page faults inside its busy intervals
    busy: dict[str, float] = defaultdict(float)  # role -> CPU seconds inside the trainer's busy intervals
    busy_wall = 0.0
    total: dict[str, float] = defaultdict(float)
    while p.poll() is None:
        time.sleep(interval)
        now: dict[int, tuple[str, float, float]] = {}
        for pid in _tree(p.pid):
            c, flt = _cpu(pid)
            if c == c:
                now[pid] = (_role(pid), c, flt)  # a worker's title changes when it becomes an actor (ray::IDLE first)
        delta: dict[str, float] = defaultdict(float)
        fdelta: dict[str, float] = defaultdict(float)
        for pid, (role, c, flt) in now.items():
            if pid in last:
                delta[role] += c - last[pid][1]
                fdelta[role] += flt - last[pid][2]
            elif len(last):
                delta[role] += c  # started since the last sample
        last = now
        for role, d in delta.items():
            total[role] += d
        if delta.get("PolicyWorker", 0.0) > 0.5 * interval:
            busy_wall += interval
            faults += fdelta.get("PolicyWorker", 0.0)
            for role, d in delta.items():
                busy[role] += d
    log.close()
    if p.returncode != 0:
        raise SystemExit(f"run {k} failed (exit {p.returncode}): see {out / f'run{k}.log'}")
    rows = [json.loads(x) for x in (out / f"spread{k}" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "timing/train_s" in r][1:]  # the first step warms up
    train = [r["timing/train_s"] for r in rows]
    tps = [r.get("train/tokens_per_s", float("nan")) for r in rows]
    cores = {role: busy[role] / busy_wall for role in busy} if busy_wall else {}
    return {"train_s": train, "tokens_per_s": tps, "busy_cores": cores, "cpu_s": dict(total),
            "faults_per_s": faults / busy_wall if busy_wall else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--recipe", default="recipes/smoke_cpu.yaml")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples of /proc")
    ap.add_argument("overrides", nargs="*", help="recipe overrides for every run (after --)")
    a = ap.parse_args()
    medians = []
    with tempfile.TemporaryDirectory(prefix="trainer_spread_") as tmp:
        for k in range(a.runs):
            r = one_run(k, a.steps, a.recipe, a.overrides, a.interval, Path(tmp))
            t = r["train_s"]
            medians.append(statistics.median(t))
            cores = ", ".join(f"{role} {c:.2f}" for role, c in sorted(r["busy_cores"].items(), key=lambda x: -x[1]) if c >= 0.01)
            print(f"run {k}: train_s median {medians[-1]:.1f} (min {min(t):.1f}, max {max(t):.1f}) over steps 2-{a.steps}: "
                  + " ".join(f"{x:.1f}" for x in t), flush=True)
            tps = r["tokens_per_s"]
            print(f"        train/tokens_per_s median {statistics.median(tps):.0f} (min {min(tps):.0f}, max {max(tps):.0f}); "
                  f"the trainer's minor page faults {r['faults_per_s']:.0f}/s while it trained", flush=True)
            print(f"        cores used while the trainer trained: {cores}", flush=True)
            print("        CPU s over the run: " + ", ".join(f"{role} {c:.0f}" for role, c in
                                                         sorted(r["cpu_s"].items(), key=lambda x: -x[1]) if c >= 1), flush=True)
    best = min(medians)
    print(f"median over runs {statistics.median(medians):.1f} s; spread (slowest run / fastest) {max(medians) / best:.2f}x; "
          "runs vs the fastest: " + " ".join(f"{m / best:.2f}x" for m in medians))


if __name__ == "__main__":
    sys.exit(main())
