"""Does an objective keep pass@k from falling while pass@1 rises? GRPO against Pass@k Training, PKPO and DPH-RL
from the same start, seed and budget (issue 15).

The objectives exist because RLVR with GRPO sharpens the policy: pass@1 rises while pass@k at large k can fall
below the starting model's (Yue et al. 2025, "Does Reinforcement Learning Really Incentivize Reasoning Capacity in
LLMs Beyond the Base Model?", arXiv 2504.13837). Pass@k Training (arXiv 2508.10751), PKPO (arXiv 2505.15201) and
DPH-RL (arXiv 2509.07430) claim to keep it. This script measures that on this machine, in three stages:

1. ``probe``: the starting model (SmolLM2-135M-Instruct) on each candidate generated task, ``rlvr eval`` with n
   samples per held-out problem: pass@1, pass@k up to n, maj@n with 95% bootstrap intervals over problems, and the
   mean number of distinct answers per problem (diversity). A usable task is partly solved (pass@1 well inside
   (0, 1)) with diverse answers (pass@n well above pass@1).
2. ``train``: ``rlvr train recipes/methods/<method>.yaml`` for each method, every one with the same overrides
   (:func:`common_overrides`: the task, template, steps, lr, seed, sampling); validation on the same held-out
   problems at the start and every ``--val-every`` steps writes each problem's n outcomes to
   ``RUN/validation.jsonl`` (:func:`rlvr.runtime.validation.validation_record`).
3. ``report``: from those files, per method and step: pass@1, pass@k (k = 2, 4, ... n), maj@n, each with the
   95% percentile-bootstrap interval over problems that ``rlvr eval`` gives (:func:`rlvr.metrics.intervals.
   bootstrap_ci`, 1000 resamples, seed 0), and each method's paired difference to GRPO at the same step (the
   same problems resampled for both: the interval of the difference, which is what "the intervals separate"
   should mean); a markdown table, ``results.json`` and one figure (``passk_preservation.png``: pass@1 and
   pass@n against step, every method, with interval bands).

Step 0 is the starting policy, the same model for every method: it is measured once, by the probe stage's
``rlvr eval`` of the chosen task (the same held-out problems, the same n, temperature and token limit), and shared
by every method's rows (the runs do not validate at the start: ``validation.at_start=false``).

    # ~5 min: the base model on the candidate tasks
    .venv/bin/python benchmarks/passk_preservation.py probe
    # ~60 min on 2 cores: the four methods, then the table and figure
    .venv/bin/python benchmarks/passk_preservation.py train report --out runs/passk_preservation
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlvr.eval_cli import _cell  # noqa: E402 - "value [low, high]", as rlvr eval's table prints a metric

TEMPLATE = "{question} Answer with only the final number, in \\boxed{}."
FEW_SHOT_EXAMPLES = (("What is 23 plus 45?", "68"), ("What is 57 minus 19?", "38"), ("What is 12 times 3?", "36"))
FEW_SHOT = "Answer with only the final number, in \\boxed{}.\n" + "".join(
    f"{q} \\boxed{{{a}}}\n" for q, a in FEW_SHOT_EXAMPLES) + "{question}"
"""A few-shot user message (issue 30, tried for a start already in format): three worked examples of the answer's
form; :func:`holdout_file` refuses a task whose held-out questions include one of them. Measured 2026-12-03 on
plus2 (32 problems x 64): worse than the plain template, pass@1 0.002 against 0.047, 60% of samples cut at 32
tokens (the model talks about the examples); as chat turns the model answers in form but cannot add two digits
at once (pass@1 0.004): see issue 30's notes before using it."""
TEMPLATES = {"plain": TEMPLATE, "fewshot": FEW_SHOT}
"""The user message: a short answer keeps responses (and so every stage) short on a CPU; the ``math`` verifier
reads the last ``\\boxed{}`` (or the last number)."""
CANDIDATES: dict[str, dict[str, Any]] = {
    "plus1": {"kind": "arithmetic", "ops": ["plus"], "digits": 1},
    "times1": {"kind": "arithmetic", "ops": ["times"], "digits": 1},
    "mixed1": {"kind": "arithmetic", "ops": ["plus", "minus", "times"], "digits": 1},
    "plus2": {"kind": "arithmetic", "ops": ["plus"], "digits": 2},
    "mixed2": {"kind": "arithmetic", "ops": ["plus", "minus"], "digits": 2},
    "plus3": {"kind": "arithmetic", "ops": ["plus"], "digits": 3},
}
"""Candidate generated tasks (``data.generated`` settings), each with :data:`SIZE` rows, the last :data:`HOLDOUT` held out."""
SIZE, HOLDOUT = 1000, 100
"""Rows of every candidate task and how many of them (the last) are held out for validation."""
METHODS = ("grpo", "passk", "pkpo", "dph")
"""``recipes/methods/<name>.yaml``; every one runs with :func:`common_overrides` on top of its own settings."""


def task_settings(name: str) -> str:
    """``data.generated`` of a candidate as a flow mapping for a dotted override."""
    g = dict(CANDIDATES[name], size=SIZE, holdout=HOLDOUT)
    return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in g.items()) + "}"


def write_holdout(task: dict[str, Any], path: Path, seed: int) -> Path:
    """The held-out rows of the generated ``task`` (``data.generated``'s ops, digits, size, holdout: the recipe's
    own split for ``run.seed``, what validation reads, in order) written to ``path`` as JSONL."""
    from rlvr.config import GeneratedTaskConfig
    from rlvr.data.generated import generated_split

    cfg = GeneratedTaskConfig(ops=tuple(task["ops"]), digits=task["digits"], size=task["size"], holdout=task["holdout"])
    path.write_text("".join(json.dumps(r) + "\n" for r in generated_split(cfg, seed, "holdout")))
    return path


def holdout_file(name: str, out: Path, seed: int) -> Path:
    """The held-out rows of a candidate task (rows 900-999 for ``run.seed``) as JSONL."""
    path = write_holdout(dict(CANDIDATES[name], size=SIZE, holdout=HOLDOUT), out / f"holdout_{name}.jsonl", seed)
    shown = {q for q, _ in FEW_SHOT_EXAMPLES} & {json.loads(x)["question"] for x in path.read_text().splitlines()}
    if shown:
        raise SystemExit(f"{name}: the few-shot examples {sorted(shown)} are held-out questions: change FEW_SHOT_EXAMPLES")
    return path


RLVR = [sys.executable, "-c", "import sys; from rlvr.cli import main; sys.exit(main())"]
"""The ``rlvr`` command of this interpreter and of the rlvr tree this script belongs to (``PYTHONPATH`` wins)."""


def _run(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ)).returncode
    if rc != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"{' '.join(cmd[3:6])} ... failed (rc {rc}); the end of {log}:\n{tail}")
    return time.perf_counter() - t0


def probe(args: argparse.Namespace, out: Path) -> None:
    """Stage 1 (module docstring): ``rlvr eval`` of the starting model on each candidate's held-out problems."""
    rows = []
    for name in args.tasks:
        data = holdout_file(name, out, args.seed)
        dest = out / f"probe_{name}"
        seconds = _run([*RLVR, "eval", "smollm2-135m-instruct", "--data", str(data),
                        "--n", str(args.n), "--limit", str(args.problems), "--max-new-tokens", str(args.max_new_tokens),
                        "--prompt-template", TEMPLATES[args.template], "--threads", "2", "--seed", str(args.seed),
                        "--output", str(dest)], out / f"probe_{name}.log")  # fmt: skip
        res = json.loads((dest / "results.json").read_text())
        m = res["overall"]["metrics"]
        samples = [json.loads(x) for x in (dest / "samples.jsonl").read_text().splitlines() if x.strip()]
        answers: dict[int, set] = {}
        for s in samples:
            answers.setdefault(s["row"], set()).add(s["parsed"])
        distinct = sum(len(a - {None}) for a in answers.values()) / max(1, len(answers))
        mean_tokens = sum(s["tokens"] for s in samples) / max(1, len(samples))
        truncated = sum(s["finish_reason"] == "length" for s in samples) / max(1, len(samples))
        rows.append({"task": name, "metrics": m, "distinct": distinct, "tokens": mean_tokens,
                     "truncated": truncated, "seconds": seconds})  # fmt: skip
    n = args.n
    ks = sorted({k for k in (1, 4, 16, n) if k <= n})
    print(f"\n## The starting model on the candidate tasks ({args.problems} held-out problems x n = {n}, T = 1, "
          f"at most {args.max_new_tokens} new tokens)\n")
    head = " | ".join(f"pass@{k}" for k in ks)
    print(f"| task | {head} | maj@{n} | distinct answers / problem | tokens / sample | truncated | s |")
    print("|" + "---|" * (len(ks) + 6))
    for r in rows:
        cells = " | ".join(_cell(r["metrics"][f"pass@{k}"]) for k in ks)
        print(f"| {r['task']} | {cells} | {_cell(r['metrics'][f'maj@{n}'])} | {r['distinct']:.1f} | "
              f"{r['tokens']:.1f} | {r['truncated']:.0%} | {r['seconds']:.0f} |")
    (out / "probe.json").write_text(json.dumps(rows, indent=2))


def common_overrides(args: argparse.Namespace, method: str, out: Path) -> list[str]:
    """The recipe overrides every method shares: same task, template, start, seed, batch, steps and validation."""
    return [
        f"run.name={method}", f"run.output_dir={out / 'runs'}", f"run.seed={args.seed}", f"run.steps={args.steps}",
        f"data.generated={task_settings(args.task)}", f"data.prompt_template={json.dumps(TEMPLATES[args.template])}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"rollout.prompts_per_step={args.prompts_per_step}",
        f"rollout.samples_per_prompt={args.group}", f"trainer.lr={args.lr}",
        f"validation.every_steps={args.val_every}", "validation.at_start=false", f"validation.limit={args.problems}",
        f"validation.samples={args.n}", "metrics.samples_every=0", "checkpoint.every_steps=0", "checkpoint.keep_last=1",
        "run.save_final=false",
    ]  # fmt: skip


def train(args: argparse.Namespace, out: Path, overrides=None) -> None:
    """Stage 2 (module docstring): one ``rlvr train`` per method, one after the other, with ``overrides(args,
    method, out)`` (default :func:`common_overrides`) and ``args.set`` on top of ``recipes/methods/<method>.yaml``."""
    overrides = overrides or common_overrides
    for method in args.methods:
        run_dir = out / "runs" / method
        if (run_dir / "validation.jsonl").exists() and not args.again:
            print(f"{method}: {run_dir} exists, kept (--again to rerun)")
            continue
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        cmd = [*RLVR, "train", str(REPO / "recipes" / "methods" / f"{method}.yaml"),
               *overrides(args, method, out), *args.set]
        seconds = _run(cmd, out / f"train_{method}.log")
        print(f"{method}: {seconds:.0f} s", flush=True)
        (run_dir / "wall_s.txt").write_text(f"{seconds:.1f}\n")


def start_record(probe_dir: Path) -> dict[str, Any]:
    """The starting model's outcomes on the held-out problems from the probe's ``rlvr eval`` ``samples.jsonl``, in
    the form of a ``validation.jsonl`` line at step 0 (problems keyed by their held-out row, which is the index
    validation gives them: both read the same holdout rows in order)."""
    problems: dict[int, dict[str, Any]] = {}
    for line in (probe_dir / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        p = problems.setdefault(s["row"], {"index": s["row"], "gold": s["gold"], "correct": [], "parsed": []})
        p["correct"].append(bool(s["correct"]))
        p["parsed"].append(s["parsed"])
    n = {len(p["correct"]) for p in problems.values()}
    if len(n) != 1:
        raise SystemExit(f"{probe_dir}: problems with different sample counts {sorted(n)}")
    return {"step": 0, "n": n.pop(), "problems": list(problems.values())}


def method_table(run_dir: Path, ks: list[int], start: dict[str, Any] | None = None) -> dict[int, dict[str, list[float]]]:
    """Per validation step: per-problem ``pass@k`` (each k in ``ks``) and ``maj@n`` values [P] from
    ``RUN/validation.jsonl`` (:func:`rlvr.runtime.validation.problem_metrics`, as ``rlvr eval``)."""
    from rlvr.runtime.validation import problem_metrics

    out = {}
    records = [json.loads(line) for line in (run_dir / "validation.jsonl").read_text().splitlines()]
    if start is not None and all(r["step"] != 0 for r in records):
        records.insert(0, start)
    for rec in records:
        n = rec["n"]
        probs = sorted(rec["problems"], key=lambda p: p["index"])
        per = problem_metrics([p["correct"] for p in probs], [p["parsed"] for p in probs], sorted(set(ks) | {n}))
        out[rec["step"]] = {**{f"pass@{k}": per[f"pass@{k}"] for k in ks}, f"maj@{n}": per[f"maj@{n}"]}
    return out


def report(args: argparse.Namespace, out: Path) -> None:
    """Stage 3 (module docstring): the table, ``results.json`` and the figure."""
    import numpy as np

    from rlvr.metrics.intervals import bootstrap_ci

    n = args.n
    ks = [k for k in [1] + [2**i for i in range(1, 12)] if k < n] + [n]
    probe_dir = out / f"probe_{args.task}"
    start = start_record(probe_dir) if (probe_dir / "samples.jsonl").exists() else None
    tables = {m: method_table(out / "runs" / m, ks, start) for m in args.methods
              if (out / "runs" / m / "validation.jsonl").exists()}
    if not tables:
        raise SystemExit(f"no runs under {out / 'runs'}: run the train stage first")
    keys = [f"pass@{k}" for k in ks] + [f"maj@{n}"]
    results: dict[str, Any] = {"settings": vars(args) | {"out": str(out)}, "methods": {}}
    for m, per_step in tables.items():
        results["methods"][m] = {}
        for step, per in sorted(per_step.items()):
            vals = np.array([per[k] for k in keys]).T  # [P, M]
            lo, hi = bootstrap_ci(vals)
            row = {k: {"value": float(vals[:, i].mean()), "ci": [float(lo[i]), float(hi[i])]} for i, k in enumerate(keys)}
            base = tables.get("grpo", {}).get(step)
            if m != "grpo" and base is not None and len(base[keys[0]]) == len(per[keys[0]]):
                diff = vals - np.array([base[k] for k in keys]).T  # paired: the same problems, in index order
                dlo, dhi = bootstrap_ci(diff)
                for i, k in enumerate(keys):
                    row[k]["minus_grpo"] = {"value": float(diff[:, i].mean()), "ci": [float(dlo[i]), float(dhi[i])]}
            results["methods"][m][step] = row
    (out / "results.json").write_text(json.dumps(results, indent=2))
    show = ["pass@1", f"pass@{ks[len(ks) // 2]}", f"pass@{n}", f"maj@{n}"]
    print(f"\n## Held-out {args.problems} problems x n = {n} (95% bootstrap intervals over problems)\n")
    print("| method | step | " + " | ".join(show) + f" | pass@{n} - GRPO's (paired) |")
    print("|" + "---|" * (len(show) + 3))
    for m, steps in results["methods"].items():
        for step, row in steps.items():
            d = row[f"pass@{n}"].get("minus_grpo")
            dcell = f"{d['value']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]" if d else ""
            print(f"| {m} | {step} | " + " | ".join(_cell(row[k]) for k in show) + f" | {dcell} |")
    figure(results, n, out / "passk_preservation.png")
    print(f"\nresults: {out / 'results.json'}\nfigure: {out / 'passk_preservation.png'}")


def figure(results: dict[str, Any], n: int, path: Path) -> None:
    """pass@1 (left) and pass@n (right) against the step for every method, 95% interval bands (matplotlib Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    for j, key in enumerate(["pass@1", f"pass@{n}"]):
        ax = fig.add_subplot(1, 2, j + 1)
        for m, steps in results["methods"].items():
            xs = sorted(steps)
            ys = [steps[s][key]["value"] for s in xs]
            lo = [steps[s][key]["ci"][0] for s in xs]
            hi = [steps[s][key]["ci"][1] for s in xs]
            (line,) = ax.plot(xs, ys, marker="o", label=m)
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.12)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"held-out {key}")
        ax.set_title(f"{key} (95% bootstrap interval over problems)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_run_args(ap: argparse.ArgumentParser, *, methods: tuple[str, ...], steps: int, val_every: int, problems: int,
                 n: int, max_new_tokens: int) -> None:
    """The options every method-comparison benchmark shares (this one and ``distill_vs_grpo.py``): seed, steps,
    validation cadence and size, the response budget, extra overrides, rerunning."""
    ap.add_argument("--methods", nargs="+", default=list(methods))
    ap.add_argument("--seed", type=int, default=1, help="run.seed of every method (the methods' recipes use 1)")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--val-every", type=int, default=val_every)
    ap.add_argument("--problems", type=int, default=problems, help="held-out problems validated")
    ap.add_argument("--n", type=int, default=n, help="validation samples per problem (pass@k for k <= n)")
    ap.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    ap.add_argument("--set", nargs="*", default=[], help="more recipe overrides for every method")
    ap.add_argument("--again", action="store_true", help="train: rerun methods whose run exists")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="+", choices=["probe", "train", "report"])
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "passk_preservation")
    ap.add_argument("--tasks", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES), help="probe: candidates")
    ap.add_argument("--task", default="plus2", choices=list(CANDIDATES), help="train: the task")
    add_run_args(ap, methods=METHODS, steps=8, val_every=4, problems=32, n=16, max_new_tokens=32)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--group", type=int, default=8, help="samples per prompt in training (G)")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--template", default="plain", choices=list(TEMPLATES), help="the user message (fewshot: issue 30)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for stage in args.stages:
        {"probe": probe, "train": train, "report": report}[stage](args, args.out)


if __name__ == "__main__":
    main()
