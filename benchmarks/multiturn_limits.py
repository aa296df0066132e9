"""Multi-turn rewards at the limits and infrastructure failures, on the embedded model (issue 38's closing runs).

Stages (each run is ``recipes/multiturn_cpu.yaml``, the `feedback` environment on the smoke task, with
``environment.max_turns`` 2 so that many trajectories end at the turn limit, for ``--steps`` steps on the local
executor, in its own process; the run's rollouts are recorded by wrapping
:func:`rlvr.envs.rollout.trajectory_rewards` and the controller's :func:`form_advantages`):

1. ``modes``: one run per ``environment.reward`` mode (verifiers, environment, both). Report: the trajectories that
   ended at ``max_turns`` with a right last answer (the recipe's verifier gives the final answer full marks) and
   their rewards, against what the environment's reward was before issue 38 (its last reward before the final
   reply, which it never saw: ``turn_rewards[:-1]``). Expected: 1 (verifiers), 1 (environment: before, 0),
   2 (both: verifier + environment; before, 1).
2. ``crash``: the same recipe (reward: verifiers) with :class:`CrashyFeedback`, which raises in 25% of its steps
   (decided by a hash of the reply, so the same in every process). Report: the share of trajectories ended by the
   failure, ``rollout/excluded_frac``, one group holding a crash with its rewards, the advantages the update used
   and GRPO worked over the group's other samples, and the console warning from ``train.log`` (with
   ``environment.warn_failure_frac`` 0.1: the trajectories cut at the token limit take no step, so ~15% of them
   fail, under the default 0.25).

    PYTHONPATH=. .venv/bin/python benchmarks/multiturn_limits.py modes crash --out runs/multiturn_limits
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("verifiers", "environment", "both")
HERE = "benchmarks/multiturn_limits.py"


class CrashyFeedback:
    """The built-in `feedback` environment, raising ``RuntimeError("simulated crash")`` in the steps whose reply
    hashes to 0 mod 4 (sha256 of the reply text and the conversation's length: 25% of steps, the same decision in
    every worker process)."""

    def __init__(self, **args) -> None:
        from rlvr.envs.builtins import Feedback

        self.inner = Feedback(**args)

    def reset(self, row):
        return self.inner.reset(row)

    def step(self, history, reply):
        h = hashlib.sha256(f"{len(history)}:{reply['content']}".encode()).digest()
        if h[0] % 4 == 0:
            raise RuntimeError("simulated crash")
        return self.inner.step(history, reply)


def overrides(name: str, out: Path, steps: int, extra: list[str]) -> list[str]:
    return [f"run.name={name}", f"run.output_dir={out / 'runs'}", f"run.steps={steps}", "run.executor=local",
            "run.save_final=false", "validation.every_steps=0", "validation.at_start=false",
            "checkpoint.every_steps=0", "metrics.samples_every=0", "environment.max_turns=2", *extra]  # fmt: skip


def one(name: str, out: Path, steps: int, extra: list[str]) -> None:
    """One run in this process, recording every trajectory's outcome and every update's advantages."""
    import torch

    import rlvr.envs.rollout as env_rollout
    import rlvr.runtime.controller as controller
    from rlvr.recipe import load_recipe
    from rlvr.reward.pool import verifier_keys

    recipe = load_recipe(str(REPO / "recipes" / "multiturn_cpu.yaml"), overrides(name, out, steps, extra))
    key = verifier_keys(recipe.reward.verifiers)[0]
    record: dict[str, list] = {"trajectories": [], "updates": []}
    real_rewards, real_adv = env_rollout.trajectory_rewards, controller.form_advantages

    def trajectory_rewards(completions, scored, env):
        result = real_rewards(completions, scored, env)
        for c, s, r in zip(completions, scored, result):
            record["trajectories"].append({
                "prompt": c.prompt_index, "sample": c.sample_index, "end": c.end_reason, "turns": c.turns,
                "turn_rewards": c.turn_rewards, "right": s.results[key].score >= 1.0, "reward": r.reward,
                "failure": c.failure.splitlines()[0] if c.failure else None})  # fmt: skip
        return result

    def form_advantages(batch, rewards, r, **kw):
        out_batch, critic, metrics = real_adv(batch, rewards, r, **kw)
        valid = kw.get("valid")
        adv = out_batch.advantages
        per_seq = adv if adv.dim() == 1 else (adv * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1).clamp(min=1)
        record["updates"].append({"rewards": rewards.tolist(), "valid": None if valid is None else valid.tolist(),
                                  "advantages": per_seq.view_as(rewards).tolist(),
                                  "loss_tokens": batch.loss_mask.sum(-1).view_as(rewards).tolist()})  # fmt: skip
        return out_batch, critic, metrics

    env_rollout.trajectory_rewards, controller.form_advantages = trajectory_rewards, form_advantages
    torch.manual_seed(0)
    controller.train(recipe)
    (out / f"{name}.json").write_text(json.dumps(record))


def _spawn(name: str, out: Path, steps: int, extra: list[str]) -> None:
    import shutil

    shutil.rmtree(out / "runs" / name, ignore_errors=True)  # else the run goes to runs/<name>-2
    log = out / f"{name}.log"
    with open(log, "w") as f:
        rc = subprocess.call([sys.executable, __file__, "--one", name, "--out", str(out), "--steps", str(steps),
                              *[a for x in extra for a in ("--set", x)]], stdout=f, stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip
    if rc:
        raise SystemExit(f"{name}: the run failed (exit {rc}); see {log}")


def report_modes(out: Path) -> None:
    print("| environment.reward | trajectories | ended at max_turns | ... with a right last answer | their reward "
          "now | the environment's reward before (turn_rewards[:-1]) |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        recs = json.loads((out / f"mode_{mode}.json").read_text())["trajectories"]
        at_limit = [t for t in recs if t["end"] == "max_turns"]
        right = [t for t in at_limit if t["right"]]
        now = sorted({t["reward"] for t in right})
        before = []
        for t in right:
            given = [x for x in t["turn_rewards"][:-1] if x is not None]
            env_before = given[-1] if given else 0.0
            before.append({"verifiers": 1.0, "environment": env_before, "both": 1.0 + env_before}[mode])
        print(f"| {mode} | {len(recs)} | {len(at_limit)} | {len(right)} | {now} | {sorted(set(before))} |")


def report_crash(out: Path) -> None:
    rec = json.loads((out / "crash.json").read_text())
    trajs = rec["trajectories"]
    failed = [t for t in trajs if t["failure"]]
    print(f"crash run: {len(trajs)} trajectories, {len(failed)} ended by the environment's failure "
          f"({len(failed) / max(len(trajs), 1):.1%}); of those the verifier marked right: "
          f"{sum(t['right'] for t in failed)}")
    metrics = [json.loads(x) for x in (out / "runs" / "crash" / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        print(f"step {m.get('step')}: rollout/env_failed_frac {m.get('rollout/env_failed_frac')}, "
              f"rollout/excluded_frac {m.get('rollout/excluded_frac')}, reward/mean {m.get('reward/mean')}")
    up = rec["updates"][0]
    for p, (rw, va, ad, lt) in enumerate(zip(up["rewards"], up["valid"] or [], up["advantages"], up["loss_tokens"])):
        if all(va) or not any(va) or len(set(x for x, v in zip(rw, va) if v)) < 2:
            continue
        kept = [x for x, v in zip(rw, va) if v]
        n = len(kept)
        mean = sum(kept) / n
        std = (sum((x - mean) ** 2 for x in kept) / (n - 1)) ** 0.5
        by_hand = [round((x - mean) / (std + 1e-6), 4) if v else 0.0 for x, v in zip(rw, va)]
        print(f"group {p}: rewards {rw}\n  valid {va}\n  loss tokens {lt}\n  advantages used {[round(a, 4) for a in ad]}"
              f"\n  GRPO over the {n} valid samples by hand (mean {mean:.4f}, unbiased std {std:.4f}): {by_hand}")
        break
    lines = (out / "runs" / "crash" / "train.log").read_text().splitlines()
    warnings = [ln for ln in lines if "WARNING rlvr" in ln and "failure" in ln]
    print("console warnings (train.log):\n  " + "\n  ".join(warnings[:4]))
    first = next((i for i, ln in enumerate(lines) if "failure in" in ln), None)
    if first is not None:
        print("the first failure's text in train.log:\n  " + "\n  ".join(lines[first : first + 6]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="*", help="modes, crash, report (default: all three)")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "multiturn_limits")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="an extra recipe override (repeatable)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.stages = args.stages or ["modes", "crash"]
    if set(args.stages) - {"modes", "crash", "report"}:
        ap.error(f"unknown stage in {args.stages}: the stages are modes, crash, report")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        return one(args.one, args.out, args.steps, args.set)
    if "modes" in args.stages:
        for mode in MODES:
            _spawn(f"mode_{mode}", args.out, args.steps, [f"environment.reward={mode}", *args.set])
        report_modes(args.out)
    if "crash" in args.stages:
        # 25% of steps crash; the trajectories cut at the token limit take no step, so ~15% of trajectories fail:
        # under the default environment.warn_failure_frac (0.25) no warning; 0.1 shows it
        _spawn("crash", args.out, args.steps, [f"environment.name={HERE}:CrashyFeedback",
                                               "environment.warn_failure_frac=0.1", *args.set])
        report_crash(args.out)
    if args.stages == ["report"]:
        report_modes(args.out)
        report_crash(args.out)


if __name__ == "__main__":
    main()
