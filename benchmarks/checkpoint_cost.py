"""What a checkpoint every step costs (issue 41): the same recipe run with ``checkpoint.every_steps=1`` and with
checkpoints only at the end (``0``: the last step always writes one), each ``rlvr train`` in a process of its own.

Printed per setting: the run's wall seconds, the median step (``timing/step_s``, which holds no checkpoint), each
checkpoint's seconds (median; the trainer's state, and the fsync and rename, from ``RUN/train.log``) and bytes; then
a checkpoint's seconds as a share of a step, and the wall-time ratio of the two runs.

    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint_cost.py                      # recipes/smoke_cpu.yaml, 4 steps
    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint_cost.py --recipe recipes/tiny_test.yaml --steps 6

Run it alone on the machine: anything beside it is in the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"checkpoint \S+ written in ([\d.]+)s \(([\d.]+) GB; the roles' state ([\d.]+)s, fsync and rename "
                  r"([\d.]+)s\)")


def one(recipe: str, steps: int, every: int, out: Path, overrides: list[str]) -> dict:
    name = f"every{every}"
    cmd = [sys.executable, "-m", "rlvr.cli", "train", recipe, f"run.steps={steps}", f"run.output_dir={out}",
           f"run.name={name}", f"checkpoint.every_steps={every}", "checkpoint.keep_last=2", "validation.every_steps=0",
           "metrics.samples_every=0", "run.save_final=false", "metrics.progress=false", *overrides]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    run = out / name
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    cks = [tuple(map(float, m.groups())) for m in LINE.finditer((run / "train.log").read_text())]
    return {"wall": wall, "step": statistics.median(r["timing/step_s"] for r in rows[1:] or rows),
            "ck_s": statistics.median(c[0] for c in cks), "gb": cks[-1][1],
            "state_s": statistics.median(c[2] for c in cks), "fsync_s": statistics.median(c[3] for c in cks),
            "n": len(cks)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "smoke_cpu.yaml"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("overrides", nargs="*", help="more KEY=VALUE overrides for rlvr train")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="rlvr-ckcost-"))
    res = {e: one(args.recipe, args.steps, e, out, args.overrides) for e in (0, 1)}
    print(f"{Path(args.recipe).name}, {args.steps} steps ({out})")
    print("| checkpoints | run wall s | median step s | checkpoints written | s each (median) | of which state s | "
          "of which fsync s | GB each |")
    print("|---|---|---|---|---|---|---|---|")
    for e, label in ((0, "at the end"), (1, "every step")):
        r = res[e]
        print(f"| {label} | {r['wall']:.1f} | {r['step']:.2f} | {r['n']} | {r['ck_s']:.2f} | {r['state_s']:.2f} | "
              f"{r['fsync_s']:.2f} | {r['gb']:.2f} |")
    r1 = res[1]
    print(f"\na checkpoint = {r1['ck_s'] / r1['step']:.2f} of a step; run wall every step / at the end = "
          f"{res[1]['wall'] / res[0]['wall']:.2f}x")


if __name__ == "__main__":
    main()
