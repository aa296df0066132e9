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

The second run (issue 30, docs/passk_preservation.md): a start already in format (``--template chat``: worked
examples as chat turns), one-digit mixed arithmetic split by question (255 distinct questions, 60 held out), two
seeds per method, 20 steps, n = 64:

    .venv/bin/python benchmarks/passk_preservation.py probe --template chat --tasks mixed1 --n 64 --problems 60 \\
        --out runs/pk2
    .venv/bin/python benchmarks/passk_preservation.py train report --template chat --task mixed1 --seeds 1 2 \\
        --steps 20 --val-every 10 --n 64 --problems 60 --prompts-per-step 4 --group 8 --lr 3e-5 --out runs/pk2
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
TEMPLATES = {"plain": TEMPLATE, "fewshot": FEW_SHOT, "chat": TEMPLATE}
"""The user message: a short answer keeps responses (and so every stage) short on a CPU; the ``math`` verifier
reads the last ``\\boxed{}`` (or the last number)."""
CHAT_SYSTEM = "Answer with only the final number, in \\boxed{}."
CHAT_EXAMPLES = (("What is 23 plus 45?", "68"), ("What is 57 minus 19?", "38"), ("What is 12 times 13?", "156"))
"""``--template chat`` (issue 30's second run): :data:`CHAT_SYSTEM` as the system message, then these worked
examples as user/assistant turns (the bare question, the answer ``\\boxed{N}``), then the question's own user turn:
120 prompt tokens with SmolLM2's template (the instruction in every user turn instead: 175, and the trainer's step
grows with them). Operands of two digits, so that no one-digit task's question is among them. Measured 2026-12-03
on plus2 (instruction in each user turn): the model then answers in form (8.5 tokens, 0.4% cut) where the plain
template leaves 61% of samples cut at 32 tokens."""
CANDIDATES: dict[str, dict[str, Any]] = {
    "plus1": {"kind": "arithmetic", "ops": ["plus"], "digits": 1},
    "times1": {"kind": "arithmetic", "ops": ["times"], "digits": 1},
    "mixed1": {"kind": "arithmetic", "ops": ["plus", "minus", "times"], "digits": 1},
    "plus2": {"kind": "arithmetic", "ops": ["plus"], "digits": 2},
    "mixed2": {"kind": "arithmetic", "ops": ["plus", "minus"], "digits": 2},
    "plus3": {"kind": "arithmetic", "ops": ["plus"], "digits": 3},
}
"""Candidate generated tasks (``data.generated`` settings), each with :data:`SIZE` rows, the last :data:`HOLDOUT` held out."""
QUESTION_TASKS: dict[str, dict[str, Any]] = {
    "mixed1": {"ops": ["plus", "minus", "times"], "digits": [1, 1]},
    "times1": {"ops": ["times"], "digits": [1, 1]},
    "times21": {"ops": ["times"], "digits": [2, 1]},
    "plus21": {"ops": ["plus", "minus"], "digits": [2, 1]},
}
"""``--template chat``'s tasks: every distinct question of the operands' digits (first, second operand; minus with
the larger first), split by question (:func:`question_split`), so that no held-out question is ever trained on."""
SIZE, HOLDOUT = 1000, 100
"""Rows of every candidate task and how many of them (the last) are held out for validation."""
METHODS = ("grpo", "passk", "pkpo", "dph")
"""``recipes/methods/<name>.yaml``; every one runs with :func:`common_overrides` on top of its own settings."""
VARIANTS: dict[str, tuple[str, list[str]]] = {"grpo_nokl": ("grpo", ["algorithm.kl_coef=0.0"])}
"""Controls: a name -> (the method recipe, overrides on top). ``grpo_nokl``: GRPO without its KL-to-reference term
(the other three recipes have none), so that GRPO's difference from them is the advantage alone."""


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


def all_questions(name: str) -> list[dict[str, str]]:
    """Every distinct question of a :data:`QUESTION_TASKS` task, ``{"question", "answer"}``, in a fixed order
    (rows by :func:`rlvr.data.generated.question_row`, as the generated task writes them)."""
    from rlvr.data.generated import question_row

    task = QUESTION_TASKS[name]
    spans = [range(0 if d == 1 else 10 ** (d - 1), 10**d) for d in task["digits"]]
    rows: dict[str, dict[str, str]] = {}
    for op in task["ops"]:
        for a in spans[0]:
            for b in spans[1]:
                r = question_row(op, a, b)
                rows.setdefault(r["question"], {"question": r["question"], "answer": r["answer"]})
    return list(rows.values())


def question_split(name: str, holdout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) of a :data:`QUESTION_TASKS` task: its distinct questions shuffled with
    ``random.Random(seed)``, the first ``holdout`` held out, the rest trained on (disjoint by question), each row
    opening with :data:`CHAT_EXAMPLES` as chat turns (a ``messages`` field, read by ``rlvr train`` and ``rlvr
    eval`` as the row's own opening)."""
    import random

    rows = all_questions(name)
    if not 0 < holdout < len(rows):
        raise SystemExit(f"{name} has {len(rows)} distinct questions: --holdout {holdout} must be in (0, {len(rows)})")
    random.Random(seed).shuffle(rows)
    shots = [{"role": "system", "content": CHAT_SYSTEM}] + [
        m for q, a in CHAT_EXAMPLES for m in ({"role": "user", "content": q}, {"role": "assistant", "content": f"\\boxed{{{a}}}"})]
    out = [dict(r, messages=[*shots, {"role": "user", "content": r["question"]}]) for r in rows]
    if {q for q, _ in CHAT_EXAMPLES} & {r["question"] for r in out}:
        raise SystemExit(f"{name}: a worked example of CHAT_EXAMPLES is one of the task's questions")
    return out[holdout:], out[:holdout]


def chat_files(name: str, out: Path, holdout: int, seed: int) -> tuple[Path, Path]:
    """:func:`question_split` written as ``out/train_<name>.jsonl`` and ``out/holdout_<name>.jsonl``."""
    paths = out / f"train_{name}.jsonl", out / f"holdout_{name}.jsonl"
    for path, rows in zip(paths, question_split(name, holdout, seed)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


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
        chat = args.template == "chat"
        data = chat_files(name, out, args.holdout, args.split_seed)[1] if chat else holdout_file(name, out, args.seed)
        dest = out / f"probe_{name}"
        template = [] if chat else ["--prompt-template", TEMPLATES[args.template]]  # chat rows carry their messages
        seconds = _run([*RLVR, "eval", "smollm2-135m-instruct", "--data", str(data), *template,
                        "--n", str(args.n), "--limit", str(args.problems), "--max-new-tokens", str(args.max_new_tokens),
                        "--threads", "2", "--seed", str(args.seed),
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
    if args.template == "chat":  # files split by question; each row opens with its own few-shot messages
        train_rows, held = chat_files(args.task, out, args.holdout, args.split_seed)
        data = [f"data.source={train_rows}", f"validation.source={held}", "data.max_prompt_tokens=160"]  # 120 here
    else:
        data = [f"data.generated={task_settings(args.task)}",
                f"data.prompt_template={json.dumps(TEMPLATES[args.template])}"]
    return [
        f"run.name={method}{getattr(args, 'tag', '')}", f"run.output_dir={out / 'runs'}", f"run.seed={args.seed}", f"run.steps={args.steps}",
        *data,
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
        run_dir = out / "runs" / f"{method}{getattr(args, 'tag', '')}"
        if (run_dir / "validation.jsonl").exists() and not args.again:
            print(f"{method}: {run_dir} exists, kept (--again to rerun)")
            continue
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        recipe, extra = VARIANTS.get(method, (method, []))
        cmd = [*RLVR, "train", str(REPO / "recipes" / "methods" / f"{recipe}.yaml"),
               *overrides(args, method, out), *extra, *args.set]
        seconds = _run(cmd, out / f"train_{run_dir.name}.log")
        print(f"{run_dir.name}: {seconds:.0f} s", flush=True)
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
    ``RUN/validation.jsonl`` (:func:`rlvr.runtime.validation.problem_metrics`, as ``rlvr eval``), and ``distinct``:
    the number of different parsed answers among each problem's n samples (the policy's spread)."""
    from rlvr.runtime.validation import problem_metrics

    out = {}
    records = [json.loads(line) for line in (run_dir / "validation.jsonl").read_text().splitlines()]
    if start is not None and all(r["step"] != 0 for r in records):
        records.insert(0, start)
    for rec in records:
        n = rec["n"]
        probs = sorted(rec["problems"], key=lambda p: p["index"])
        per = problem_metrics([p["correct"] for p in probs], [p["parsed"] for p in probs], sorted(set(ks) | {n}))
        distinct = [len({x for x in p["parsed"] if x is not None}) for p in probs]  # different answers in n samples
        out[rec["step"]] = {**{f"pass@{k}": per[f"pass@{k}"] for k in ks}, f"maj@{n}": per[f"maj@{n}"],
                            "distinct": distinct}
    return out


def report(args: argparse.Namespace, out: Path) -> None:
    """Stage 3 (module docstring): the table, ``results.json`` and the figure. With ``--seeds`` each method's
    per-problem values are averaged over its seeds' runs (at the steps every seed reached) before the bootstrap
    over problems, and each row also lists the per-seed means (``seeds``: the spread between seeds)."""
    import numpy as np

    from rlvr.metrics.intervals import bootstrap_ci

    n = args.n
    ks = [k for k in [1] + [2**i for i in range(1, 12)] if k < n] + [n]
    probe_dir = out / f"probe_{args.task}"
    start = start_record(probe_dir) if (probe_dir / "samples.jsonl").exists() else None
    keys = [f"pass@{k}" for k in ks] + [f"maj@{n}", "distinct"]
    tags = [f"_s{seed}" for seed in args.seeds] if args.seeds else [""]
    tables: dict[str, dict[int, np.ndarray]] = {}  # method -> step -> [P, M], the mean over seeds
    seed_means: dict[str, dict[int, np.ndarray]] = {}  # method -> step -> [S, M], each seed's mean over problems
    for m in args.methods:
        runs = [method_table(out / "runs" / f"{m}{t}", ks, start) for t in tags
                if (out / "runs" / f"{m}{t}" / "validation.jsonl").exists()]
        if not runs:
            continue
        steps = sorted(set.intersection(*(set(r) for r in runs)))
        per_seed = {st: np.stack([np.array([r[st][k] for k in keys], dtype=float).T for r in runs]) for st in steps}
        tables[m] = {st: v.mean(0) for st, v in per_seed.items()}  # [S, P, M] -> [P, M]
        seed_means[m] = {st: v.mean(1) for st, v in per_seed.items()}  # [S, M]
    if not tables:
        raise SystemExit(f"no runs under {out / 'runs'}: run the train stage first")
    results: dict[str, Any] = {"settings": vars(args) | {"out": str(out)}, "methods": {}}
    for m, per_step in tables.items():
        results["methods"][m] = {}
        for step, vals in per_step.items():
            lo, hi = bootstrap_ci(vals)
            row = {k: {"value": float(vals[:, i].mean()), "ci": [float(lo[i]), float(hi[i])],
                       "seeds": [float(x) for x in seed_means[m][step][:, i]]} for i, k in enumerate(keys)}
            # paired differences (the same problems, in index order): to GRPO at the same step, and to the start
            for name, base in (("minus_grpo", tables.get("grpo", {}).get(step) if m != "grpo" else None),
                               ("minus_start", per_step.get(0) if step != 0 else None)):
                if base is not None and base.shape == vals.shape:
                    diff = vals - base
                    dlo, dhi = bootstrap_ci(diff)
                    for i, k in enumerate(keys):
                        row[k][name] = {"value": float(diff[:, i].mean()), "ci": [float(dlo[i]), float(dhi[i])]}
            results["methods"][m][step] = row
    (out / "results.json").write_text(json.dumps(results, indent=2))
    show = [f"pass@{k}" for k in sorted({k for k in (1, 4, 16, n) if k <= n})] + [f"maj@{n}", "distinct"]
    seeds = f", mean of {len(tags)} seeds per method; [per-seed pass@{n}]" if len(tags) > 1 else ""
    print(f"\n## Held-out {args.problems} problems x n = {n} (95% bootstrap intervals over problems{seeds})\n")
    print("| method | step | " + " | ".join(show) + f" | pass@{n} - GRPO's (paired) |" + (" seeds |" if seeds else ""))
    print("|" + "---|" * (len(show) + 3 + bool(seeds)))
    for m, steps in results["methods"].items():
        for step, row in steps.items():
            d = row[f"pass@{n}"].get("minus_grpo")
            dcell = f"{d['value']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]" if d else ""
            scell = (" " + ", ".join(f"{x:.3f}" for x in row[f"pass@{n}"]["seeds"]) + " |") if seeds else ""
            print(f"| {m} | {step} | " + " | ".join(_cell(row[k]) for k in show) + f" | {dcell} |" + scell)
    last = min(max(steps) for steps in results["methods"].values())
    print(f"\nPaired differences at step {last} (the same problems resampled for both; 95% intervals):\n")
    print("| method | vs | " + " | ".join(show) + " |")
    print("|" + "---|" * (len(show) + 2))
    for m, steps in results["methods"].items():
        for name, vs in (("minus_start", "start"), ("minus_grpo", "grpo")):
            if name in steps[last]["pass@1"]:
                cells = [steps[last][k][name] for k in show]
                print(f"| {m} | {vs} | " + " | ".join(f"{c['value']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]"
                                                       for c in cells) + " |")
    figure(results, n, out / "passk_preservation.png")
    print(f"\nresults: {out / 'results.json'}\nfigure: {out / 'passk_preservation.png'}")


def figure(results: dict[str, Any], n: int, path: Path) -> None:
    """pass@1 (left) and pass@n (middle) against the step for every method, 95% interval bands, each seed's mean as
    a small dot; pass@k against k at the last step shared by every method, with the start's curve (right)
    (matplotlib Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 4.4))
    FigureCanvasAgg(fig)
    colors = {}
    for j, key in enumerate(["pass@1", f"pass@{n}"]):
        ax = fig.add_subplot(1, 3, j + 1)
        for m, steps in results["methods"].items():
            xs = sorted(steps)
            ys = [steps[s][key]["value"] for s in xs]
            lo = [steps[s][key]["ci"][0] for s in xs]
            hi = [steps[s][key]["ci"][1] for s in xs]
            (line,) = ax.plot(xs, ys, marker="o", label=m, color=colors.get(m))
            colors[m] = line.get_color()
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.12)
            for s in xs:
                if len(steps[s][key].get("seeds", [])) > 1:
                    ax.plot([s] * len(steps[s][key]["seeds"]), steps[s][key]["seeds"], ".", color=line.get_color(), ms=4)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"held-out {key}")
        ax.set_title(f"{key} (95% bootstrap interval over problems)")
        ax.grid(alpha=0.3)
        ax.legend()
    ax = fig.add_subplot(1, 3, 3)
    last = min(max(steps) for steps in results["methods"].values())
    for m, steps in results["methods"].items():
        for step, style in ((last, "-"), (0, ":")):
            if step not in steps or (step == 0 and m != next(iter(results["methods"]))):
                continue
            ks = sorted(int(k.split("@")[1]) for k in steps[step] if k.startswith("pass@"))
            ax.plot(ks, [steps[step][f"pass@{k}"]["value"] for k in ks], style, marker=".",
                    color="black" if step == 0 else colors[m], label="start" if step == 0 else f"{m}, step {step}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("held-out pass@k")
    ax.set_title(f"pass@k against k: the start and step {last}")
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
    tasks = list(dict.fromkeys([*CANDIDATES, *QUESTION_TASKS]))  # mixed1 and times1 are in both (chat: by question)
    ap.add_argument("--tasks", nargs="+", default=list(CANDIDATES), choices=tasks, help="probe: candidates")
    ap.add_argument("--task", default="plus2", choices=tasks, help="train: the task")
    ap.add_argument("--holdout", type=int, default=60, help="--template chat: distinct questions held out")
    ap.add_argument("--split-seed", type=int, default=1, help="--template chat: the shuffle of the question split")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="train/report: run.seed of each run (runs METHOD_s<seed>); default: --seed alone (runs METHOD)")
    add_run_args(ap, methods=METHODS, steps=8, val_every=4, problems=32, n=16, max_new_tokens=32)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--group", type=int, default=8, help="samples per prompt in training (G)")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--template", default="plain", choices=list(TEMPLATES), help="the user message (fewshot: issue 30)")
    args = ap.parse_args()
    chat = args.template == "chat"
    for name in args.tasks if "probe" in args.stages else [args.task]:
        if name not in (QUESTION_TASKS if chat else CANDIDATES):
            ap.error(f"task {name}: --template chat takes {list(QUESTION_TASKS)}, the other templates {list(CANDIDATES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for stage in args.stages:
        if stage == "train" and args.seeds:
            for seed in args.seeds:  # every method at one seed, then the next seed: a stopped run stays balanced
                train(argparse.Namespace(**{**vars(args), "seed": seed, "tag": f"_s{seed}"}), args.out)
        else:
            {"probe": probe, "train": train, "report": report}[stage](args, args.out)


if __name__ == "__main__":
    main()
