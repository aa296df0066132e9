"""Full fine-tuning against LoRA with a merged sync and LoRA with an adapter sync (issue 28), in one run: the smoke
task from the same start and seed, for the same number of steps.

Stages:

1. ``train``: ``rlvr train recipes/smoke_cpu.yaml`` three times, one after the other (:data:`VARIANTS`: full
   fine-tuning at the recipe's lr; LoRA rank ``--rank`` on the seven projections, ``trainer.lora.sync`` merged and
   adapter, at ``--lora-lr``: 3e-4, 30x; "LoRA without regret" advises about 10x, which lagged here: docs/lora.md),
   with the same overrides
   (:func:`overrides`: seed, steps, the local executor, no validation, no checkpoints), each in its own process.
2. ``trainer``: the trainer alone, full and LoRA, in fresh subprocesses (``benchmarks/lora_trainer.py``'s
   measurement: the smoke model, ``--trainer-seqs`` sequences of the smoke shape): its peak RSS. (In the loop the
   local executor holds every role in one process, so the trainer's own peak is measured apart, in this run.)
3. ``report``: per variant, from ``RUN/metrics.jsonl``: the median seconds per step of each stage
   (``timing/rollout_s``, ``timing/reward_s``, ``timing/train_s``, ``timing/sync_s``, ``timing/step_s``), the
   bytes per sync (``sync/gb``), the mean reward over steps 1-10 and 11-20 (``reward/mean``) and its ratio to full
   fine-tuning's; the trainer's peak RSS and its ratio; the reward curves in ``lora_vs_full.png``. Issue 28's goals:
   trainer peak RSS <= 0.6x full, adapter bytes per sync <= 0.05x full, reward over steps 11-20 >= 0.9x full.

    # ~50 min on 2 cores (the adapter variant's rollout is the slow part on CPU)
    PYTHONPATH=. .venv/bin/python benchmarks/lora_vs_full.py train trainer report --out runs/lora_vs_full
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from passk_preservation import RLVR, _run  # noqa: E402 - one home

VARIANTS = ("full", "lora_merged", "lora_adapter")
STAGES = ("rollout", "reward", "train", "sync", "step")


def overrides(args: argparse.Namespace, variant: str, out: Path) -> list[str]:
    """The recipe overrides of ``variant`` on top of ``recipes/smoke_cpu.yaml``."""
    common = [f"run.name={variant}", f"run.output_dir={out / 'runs'}", f"run.seed={args.seed}", f"run.steps={args.steps}",
              "run.executor=local", "validation.every_steps=0", "validation.at_start=false", "metrics.samples_every=0",
              "checkpoint.every_steps=0", "run.save_final=false", *args.set]  # fmt: skip
    if variant == "full":
        return common
    sync = variant.removeprefix("lora_")
    return [*common, f"trainer.lora.rank={args.rank}", f"trainer.lora.alpha={2 * args.rank}",
            f"trainer.lora.sync={sync}", f"trainer.lr={args.lora_lr}"]  # fmt: skip


def train(args: argparse.Namespace, out: Path) -> None:
    for v in args.variants:
        run_dir = out / "runs" / v
        if (run_dir / "metrics.jsonl").exists() and not args.again:
            print(f"{v}: {run_dir} exists, kept (--again to rerun)")
            continue
        (out / "runs").mkdir(parents=True, exist_ok=True)
        s = _run([*RLVR, "train", str(REPO / "recipes" / "smoke_cpu.yaml"), *overrides(args, v, out)], out / f"train_{v}.log")
        print(f"{v}: {s:.0f} s")


def trainer(args: argparse.Namespace, out: Path) -> None:
    from lora_trainer import measure

    rows = [measure(rank, steps=2, threads=2, seqs=args.trainer_seqs) for rank in (0, args.rank)]
    (out / "trainer.json").write_text(json.dumps(rows, indent=2))


def _rows(out: Path, v: str) -> list[dict]:
    return [json.loads(x) for x in (out / "runs" / v / "metrics.jsonl").read_text().splitlines() if x.strip()]


def report(args: argparse.Namespace, out: Path) -> None:
    runs = {v: _rows(out, v) for v in args.variants if (out / "runs" / v / "metrics.jsonl").exists()}
    half = args.steps // 2

    def reward(rows, lo, hi):
        vals = [r["reward/mean"] for r in rows if lo <= r["step"] <= hi]
        return sum(vals) / len(vals) if vals else float("nan")

    full = runs.get("full")
    print(f"\n## Full fine-tuning and LoRA on the smoke task ({args.steps} steps, seed {args.seed}, local executor)\n")
    print("| variant | " + " | ".join(f"{s} s" for s in STAGES) + f" | GB / sync | x full | reward 1-{half} | "
          f"reward {half + 1}-{args.steps} | x full |")  # fmt: skip
    print("|" + "---|" * (len(STAGES) + 6))
    for v, rows in runs.items():
        med = [statistics.median(r[f"timing/{s}_s"] for r in rows if f"timing/{s}_s" in r) for s in STAGES]
        gb = statistics.median(r["sync/gb"] for r in rows)
        late = reward(rows, half + 1, args.steps)
        gb_x = gb / statistics.median(r["sync/gb"] for r in full) if full else float("nan")
        late_x = late / reward(full, half + 1, args.steps) if full else float("nan")
        print(f"| {v} | " + " | ".join(f"{m:.1f}" for m in med) + f" | {gb:.4f} | {gb_x:.3f} | "
              f"{reward(rows, 1, half):.3f} | {late:.3f} | {late_x:.2f} |")  # fmt: skip
    tj = out / "trainer.json"
    if tj.exists():
        t = json.loads(tj.read_text())
        print(f"\n## The trainer alone ({args.trainer_seqs} sequences of the smoke shape, 2 updates, fresh processes)\n")
        print("| variant | dtype | trainable | peak RSS MB | x full | update s | x full |")
        print("|---|---|---|---|---|---|---|")
        for r in t:
            name = "full" if r["rank"] == 0 else f"LoRA r{r['rank']}"
            print(f"| {name} | {r['dtype']} | {r['trainable']:,} | {r['peak_mb']:.0f} | {r['peak_mb'] / t[0]['peak_mb']:.2f} | "
                  f"{r['update_s']:.1f} | {r['update_s'] / t[0]['update_s']:.2f} |")  # fmt: skip
    if runs:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for v, rows in runs.items():
            ax.plot([r["step"] for r in rows], [r["reward/mean"] for r in rows], marker="o", ms=3, label=v)
        ax.set_xlabel("step")
        ax.set_ylabel("training reward (mean over the batch)")
        ax.set_title(f"smoke task, seed {args.seed}: full fine-tuning vs LoRA r{args.rank}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "lora_vs_full.png", dpi=120)
        print(f"\nfigure: {out / 'lora_vs_full.png'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stages", nargs="+", choices=["train", "trainer", "report"])
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "lora_vs_full")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lora-lr", type=float, default=3e-4,
                    help="LoRA's lr (the smoke recipe's full lr is 1e-5; 1e-4 = 10x lagged, 3e-4 matched: docs/lora.md)")
    ap.add_argument("--trainer-seqs", type=int, default=16, help="sequences per update in the trainer stage")
    ap.add_argument("--set", nargs="*", default=[], help="more recipe overrides for every variant")
    ap.add_argument("--again", action="store_true")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stage in args.stages:
        {"train": train, "trainer": trainer, "report": report}[stage](args, out)


if __name__ == "__main__":
    main()
