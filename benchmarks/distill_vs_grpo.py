"""On-policy distillation against GRPO from the same start, seed and budget (issue 29): held-out pass@1 per step and
per wall-clock second, and how many steps each takes to reach 90% of the teacher's pass@1.

Stages:

1. ``teacher``: the teacher is the embedded SmolLM2-135M-Instruct after the smoke recipe's 20 steps of GRPO
   (``rlvr train recipes/smoke_cpu.yaml``, run here into ``OUT/teacher``), or the ``final/`` folder of a run given
   with ``--teacher RUN``. Then ``rlvr eval`` of the teacher and of the untrained student on the same held-out
   problems (the methods' task, ``recipes/methods/*.yaml``: one-digit addition; its holdout rows in order, the
   methods' prompt template, n samples, T = 1): the teacher's pass@1 is the target, the student's is step 0 of
   both runs.
2. ``train``: ``rlvr train recipes/methods/distill.yaml teacher.model=TEACHER`` and ``recipes/methods/grpo.yaml``,
   the same overrides (:func:`overrides`: seed, steps, batch, validation every ``--val-every`` steps on the same
   held-out problems, not at the start), one after the other on this machine.
3. ``report``: per method and validated step, pass@1 with its 95% bootstrap interval over problems
   (:func:`rlvr.metrics.intervals.bootstrap_ci`, as ``rlvr eval``), the cumulative wall-clock seconds of the steps
   so far (``timing/step_s`` of ``RUN/metrics.jsonl``), the teacher's share of distillation's step time
   (``timing/teacher_share``), the first step whose pass@1 reaches 0.9 x the teacher's, and the figure
   ``distill_vs_grpo.png`` (pass@1 against step and against seconds, interval bands, the teacher's line).

    # ~40 min on 2 cores: the teacher (20 GRPO steps), then the two evals
    .venv/bin/python benchmarks/distill_vs_grpo.py teacher --out runs/distill_vs_grpo
    # or with a trained smoke run:  ... teacher --teacher runs/smoke_cpu
    # ~60 min: both methods, then the table and figure
    .venv/bin/python benchmarks/distill_vs_grpo.py train report --out runs/distill_vs_grpo
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from passk_preservation import RLVR, _run, add_run_args, method_table, start_record, write_holdout  # noqa: E402 - one home
from passk_preservation import train as passk_train  # noqa: E402

from rlvr.eval_cli import _cell  # noqa: E402

TEMPLATE = "{question} Put your final answer within \\boxed{}."
"""The methods' prompt template (``recipes/methods/*.yaml``)."""
TASK = {"ops": ["plus"], "digits": 1, "size": 1000, "holdout": 100}
"""The methods' generated task (``data.generated`` of ``recipes/methods/*.yaml``)."""
METHODS = ("distill", "grpo")


def _eval(model: str, dest: Path, args: argparse.Namespace, out: Path) -> None:
    _run([*RLVR, "eval", model, "--data", str(write_holdout(TASK, out / "holdout.jsonl", args.seed)), "--n", str(args.n), "--limit",
          str(args.problems), "--max-new-tokens", str(args.max_new_tokens), "--prompt-template", TEMPLATE,
          "--threads", "2", "--seed", str(args.seed), "--output", str(dest)], dest.with_suffix(".log"))  # fmt: skip


def teacher_dir(args: argparse.Namespace, out: Path) -> Path:
    return (Path(args.teacher) if args.teacher else out / "teacher" / "smoke_cpu") / "final"


def teacher(args: argparse.Namespace, out: Path) -> None:
    """Stage 1 (module docstring)."""
    final = teacher_dir(args, out)
    if not (final / "config.json").exists():
        if args.teacher:
            raise SystemExit(f"--teacher {args.teacher}: no {final}/config.json (a finished run's folder is needed)")
        seconds = _run([*RLVR, "train", str(REPO / "recipes" / "smoke_cpu.yaml"), f"run.output_dir={out / 'teacher'}"],
                       out / "teacher_train.log")
        print(f"teacher: 20 GRPO steps in {seconds:.0f} s -> {final}", flush=True)
    for name, model in (("teacher", str(final)), ("student", "smollm2-135m-instruct")):
        if not (out / f"eval_{name}" / "samples.jsonl").exists():
            _eval(model, out / f"eval_{name}", args, out)
        m = json.loads((out / f"eval_{name}" / "results.json").read_text())["overall"]["metrics"]
        print(f"{name}: held-out pass@1 {_cell(m['pass@1'])}", flush=True)


def overrides(args: argparse.Namespace, method: str, out: Path) -> list[str]:
    """The recipe overrides both methods share (and the teacher for distillation)."""
    common = [
        f"run.name={method}", f"run.output_dir={out / 'runs'}", f"run.seed={args.seed}", f"run.steps={args.steps}",
        f"validation.every_steps={args.val_every}", "validation.at_start=false", f"validation.limit={args.problems}",
        f"validation.samples={args.n}", f"rollout.max_new_tokens={args.max_new_tokens}", "metrics.samples_every=0",
        "checkpoint.every_steps=0", "checkpoint.keep_last=1", "run.save_final=false",
    ]  # fmt: skip
    return common + ([f"teacher.model={teacher_dir(args, out)}"] if method == "distill" else [])


def train(args: argparse.Namespace, out: Path) -> None:
    """Stage 2 (module docstring): passk_preservation's train stage with :func:`overrides`."""
    passk_train(args, out, overrides)


def step_seconds(run_dir: Path) -> tuple[dict[int, float], float | None]:
    """(step -> wall seconds of steps 1..step, summed ``timing/step_s``; the median ``timing/teacher_share``)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    cum, total = {0: 0.0}, 0.0
    for r in rows:
        total += float(r.get("timing/step_s", 0.0))
        cum[int(r["step"])] = total
    shares = sorted(float(r["timing/teacher_share"]) for r in rows if "timing/teacher_share" in r)
    return cum, (shares[len(shares) // 2] if shares else None)


def report(args: argparse.Namespace, out: Path) -> None:
    """Stage 3 (module docstring)."""
    import numpy as np

    from rlvr.metrics.intervals import bootstrap_ci

    teach = json.loads((out / "eval_teacher" / "results.json").read_text())["overall"]["metrics"]["pass@1"]
    target = 0.9 * float(teach["value"])
    start = start_record(out / "eval_student")
    results: dict[str, Any] = {"teacher_pass@1": teach, "target": target, "methods": {}}
    for m in args.methods:
        run_dir = out / "runs" / m
        if not (run_dir / "validation.jsonl").exists():
            continue
        table = method_table(run_dir, [1], start)
        secs, share = step_seconds(run_dir)
        rows = {}
        for step, per in sorted(table.items()):
            vals = np.array([per["pass@1"]]).T
            lo, hi = bootstrap_ci(vals)
            rows[step] = {"pass@1": float(vals.mean()), "ci": [float(lo[0]), float(hi[0])], "seconds": secs.get(step)}
        reached = next((s for s, r in rows.items() if s > 0 and r["pass@1"] >= target), None)
        results["methods"][m] = {"steps": rows, "teacher_share": share, "reached_step": reached,
                                 "reached_seconds": rows[reached]["seconds"] if reached is not None else None}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nteacher held-out pass@1 {_cell(teach)}; 90% of it: {target:.3f}\n")
    print("| method | step | pass@1 [95% CI] | wall s (steps so far) |")
    print("|---|---|---|---|")
    for m, res in results["methods"].items():
        for step, r in res["steps"].items():
            s = "" if r["seconds"] is None else f"{r['seconds']:.0f}"
            print(f"| {m} | {step} | {r['pass@1']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | {s} |")
    for m, res in results["methods"].items():
        where = (f"step {res['reached_step']} ({res['reached_seconds']:.0f} s)" if res["reached_step"] is not None
                 else "not within the budget")
        share = f"; teacher's share of the step (median) {res['teacher_share']:.1%}" if res["teacher_share"] else ""
        print(f"{m}: reached 90% of the teacher's pass@1 at {where}{share}")
    figure(results, out / "distill_vs_grpo.png")
    print(f"\nresults: {out / 'results.json'}\nfigure: {out / 'distill_vs_grpo.png'}")


def figure(results: dict[str, Any], path: Path) -> None:
    """pass@1 against step (left) and wall seconds (right), 95% bands, the teacher's pass@1 and its 90% line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    for j, (key, label) in enumerate([("step", "training step"), ("seconds", "wall-clock seconds of the steps")]):
        ax = fig.add_subplot(1, 2, j + 1)
        for m, res in results["methods"].items():
            pts = [(s if key == "step" else r["seconds"], r) for s, r in res["steps"].items()]
            pts = [(x, r) for x, r in pts if x is not None]
            xs = [x for x, _ in pts]
            (line,) = ax.plot(xs, [r["pass@1"] for _, r in pts], marker="o", label=m)
            ax.fill_between(xs, [r["ci"][0] for _, r in pts], [r["ci"][1] for _, r in pts], color=line.get_color(),
                            alpha=0.12)
        ax.axhline(results["teacher_pass@1"]["value"], color="k", lw=1, label="teacher")
        ax.axhline(results["target"], color="k", lw=1, ls="--", label="90% of the teacher")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out pass@1")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="+", choices=["teacher", "train", "report"])
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "distill_vs_grpo")
    ap.add_argument("--teacher", default=None, help="a finished run's folder (its final/ is the teacher)")
    add_run_args(ap, methods=METHODS, steps=20, val_every=2, problems=50, n=4, max_new_tokens=64)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for stage in args.stages:
        {"teacher": teacher, "train": train, "report": report}[stage](args, args.out)


if __name__ == "__main__":
    main()
