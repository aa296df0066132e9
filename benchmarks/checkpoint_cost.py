"""What a checkpoint every step costs (issue 41): the same recipe run with ``checkpoint.every_steps=1`` and with
checkpoints only at the end (``0``: the last step always writes one), each ``rlvr train`` in a process of its own.

Three settings: checkpoints at the end only, every step written within the step (``checkpoint.async_write=false``),
every step written in the background (the default). Printed per setting: the run's wall seconds and their ratio to
the first setting's, the median step (``timing/step_s``), and per checkpoint (median, from ``RUN/train.log``) the
seconds the run waited for it, of which the roles' part and the fsync and rename, and its bytes.

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
LINE = re.compile(r"checkpoint \S+ written \(([\d.]+) GB\); the run waited ([\d.]+)s for it \(the roles' part "
                  r"([\d.]+)s, fsync and rename ([\d.]+)s\)")


def one(recipe: str, steps: int, every: int, background: bool, out: Path, overrides: list[str]) -> dict:
    name = f"every{every}-{'async' if background else 'sync'}"
    cmd = [sys.executable, "-m", "rlvr.cli", "train", recipe, f"run.steps={steps}", f"run.output_dir={out}",
           f"run.name={name}", f"checkpoint.every_steps={every}", "checkpoint.keep_last=2", "validation.every_steps=0",
           f"checkpoint.async_write={str(background).lower()}", "metrics.samples_every=0", "run.save_final=false",
           "metrics.progress=false", *overrides]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    run = out / name
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    cks = [tuple(map(float, m.groups())) for m in LINE.finditer((run / "train.log").read_text())]
    mid = cks[:-1] or cks  # the last one is written at once whatever the setting
    return {"wall": wall, "step": statistics.median(r["timing/step_s"] for r in rows[1:] or rows),
            "ck_s": statistics.median(c[1] for c in mid), "gb": cks[-1][0],
            "state_s": statistics.median(c[2] for c in mid), "fsync_s": statistics.median(c[3] for c in mid),
            "n": len(cks)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "smoke_cpu.yaml"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("overrides", nargs="*", help="more KEY=VALUE overrides for rlvr train")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="rlvr-ckcost-"))
    settings = {"at the end": (0, False), "every step, written in the step": (1, False),
                "every step, written in the background": (1, True)}
    res = {k: one(args.recipe, args.steps, e, bg, out, args.overrides) for k, (e, bg) in settings.items()}
    print(f"{Path(args.recipe).name}, {args.steps} steps ({out})")
    print("| checkpoints | run wall s | wall / at the end | median step s | checkpoints | the run waited s each "
          "(median) | of which the roles | of which fsync | GB each |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = res["at the end"]["wall"]
    for label, r in res.items():
        print(f"| {label} | {r['wall']:.1f} | {r['wall'] / base:.2f}x | {r['step']:.2f} | {r['n']} | {r['ck_s']:.2f} | "
              f"{r['state_s']:.2f} | {r['fsync_s']:.2f} | {r['gb']:.2f} |")
    print("\n(the last checkpoint is written at once in every setting; the medians are over the others where "
          "there are any. With the background, the roles' part counts the snapshot and any wait for the files "
          "after the next rollout)")


if __name__ == "__main__":
    main()
