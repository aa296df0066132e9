"""The fault table of issue 41: one fault per run, each against the same run unfaulted, all in this process.

Each run: the tiny recipe under Ray (vLLM engine, verifier pool, trainer; fp32), ``--steps`` steps, a checkpoint
every step, ``run.max_restarts`` 2 with no backoff. One fault is injected at step ``--at`` (``rlvr.runtime.chaos``);
the table gives, per fault:

- detect s: from the fault (``Fault.fired_at``) to the first warning the run logs about it (``RUN/train.log``);
- lost s: the faulted run's wall time minus the unfaulted run's (detection, replacement or restart, redone work),
  the unfaulted run being the mean of two, after a warm-up run (the noise: their difference, printed);
- steps redone: steps begun again from a checkpoint (a rollout retried within its step is not one);
- weight diff: the largest |difference| of the final weights against the unfaulted run's (0 = bit for bit);
- rows: each step's metrics row once (yes/no).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/chaos.py [--steps 5] [--at 3]`` (~5 min on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "recipes" / "tiny_test.yaml")
SHAPING = REPO / "tests" / "integration" / "shaping_verifiers.py"


def recipe(out: Path, name: str, steps: int, extra: list[str] = ()):  # type: ignore[assignment]
    from rlvr.recipe import load_recipe

    return load_recipe(TINY, [
        "run.executor=ray", "run.num_cpus=2", "model.dtype=float32", "data.generated.size=8", f"run.steps={steps}",
        "trainer.lr=1e-2", "checkpoint.every_steps=1", "checkpoint.keep_last=2", f"run.output_dir={out}",
        f"run.name={name}", "sync.timeout_s=20", "rollout.max_restarts=3", "run.max_restarts=2",
        "run.restart_backoff_s=0", "metrics.progress=false",
        f"reward.verifiers=[{{name: '{SHAPING}:DigitShareOrDie', args: {{arm: '{out / (name + '.arm')}'}}}}]", *extra,
    ])  # fmt: skip


def run(r, plan) -> tuple[str, float]:
    """Train with ``plan``; a SIGTERM stop is relaunched with run.resume=auto (a scheduler's part). Returns the
    run folder and the wall seconds (the relaunch included)."""
    from rlvr.runtime.controller import RunInterrupted, prepare_run_dir
    from rlvr.runtime.restarts import train_with_restarts
    from rlvr.runtime.roles import default_executor

    t0 = time.perf_counter()
    run_dir = prepare_run_dir(r)
    executors = lambda: plan.wrap(default_executor(r, run_dir))  # noqa: E731
    try:
        train_with_restarts(r, run_dir, executors)
    except RunInterrupted:
        r2 = dataclasses.replace(r, run=dataclasses.replace(r.run, resume="auto"))
        train_with_restarts(r2, run_dir, executors)
    return str(run_dir), time.perf_counter() - t0


def final(run_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(Path(run_dir, "final").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def detect_s(run_dir: str, fired_at: float, says: str) -> float:
    """Seconds from ``fired_at`` to the first record of ``RUN/train.log`` after it that says ``says`` (a regex)."""
    stamp, pat = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "), re.compile(says)
    for line in Path(run_dir, "train.log").read_text().splitlines():
        m = stamp.match(line)
        if m and pat.search(line) and "chaos:" not in line:
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t >= fired_at - 0.001:
                return t - fired_at
    return float("nan")


def faults(at: int, out: Path, name: str):
    """(label, where, [Fault], what the run logs when it sees it) for each fault of the table, at step ``at``."""
    from rlvr.runtime.chaos import Fault

    return [
        ("engine killed", f"step {at}, generating", [Fault("engine0", "generate", at)], "actor died"),
        ("engine killed", f"step {at}, weight sync", [Fault("engine0", "receive_weights", at)], "actor died"),
        ("trainer rank killed", f"step {at}, update", [Fault("trainer0", "train_step", at)], "the run failed"),
        ("reward role killed", f"step {at}, scoring", [Fault("reward", "score", at)], "the run failed"),
        ("verifier worker lost", f"step {at}, a sample", [Fault("engine0", "generate", at, "touch",
                                                                path=str(out / f"{name}.arm"))], "scored again"),
        ("SIGTERM controller", f"step {at}, update", [Fault("trainer0", "train_step", at, "sigterm")],
         "SIGTERM received"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--at", type=int, default=3)
    args = ap.parse_args()
    from rlvr.runtime.chaos import Chaos

    out = Path(tempfile.mkdtemp(prefix="rlvr-chaos-"))
    run(recipe(out, "warmup", args.steps), Chaos([]))  # the first run of a process pays its cold start: not counted
    clean_dir, clean_s = run(recipe(out, "clean", args.steps), Chaos([]))
    ref = final(clean_dir)
    print(f"unfaulted: {args.steps} steps in {clean_s:.1f} s ({clean_dir})", flush=True)
    rows = []
    for i in range(len(faults(args.at, out, ""))):
        name = f"f{i}"
        label, where, fs, says = faults(args.at, out, name)[i]  # the touch fault's file is named after the run
        plan = Chaos(fs)
        run_dir, wall = run(recipe(out, name, args.steps), plan)
        w = final(run_dir)
        diff = max(float((w[k] - ref[k]).abs().max()) for k in ref)
        steps = [json.loads(x)["step"] for x in Path(run_dir, "metrics.jsonl").read_text().splitlines()]
        # steps begun again from a checkpoint: rollouts submitted beyond one a step, less the one a kill ended
        # (an engine killed mid-generation retries its rollout within the step: not a step begun again)
        killed_gen = sum(f.action == "kill" and f.method == "generate" for f in fs)
        redone = plan.calls.get(("engine0", "generate"), 0) - args.steps - killed_gen
        rows.append((label, where, detect_s(run_dir, fs[0].fired_at or float("nan"), says), wall - clean_s, redone, diff,
                     steps == list(range(1, args.steps + 1))))
        print(f"{label}, {where}: done ({run_dir})", flush=True)
    _, again_s = run(recipe(out, "clean2", args.steps), Chaos([]))  # the noise band: the unfaulted run again
    clean_s = (clean_s + again_s) / 2
    print("\n| fault | where | detect s | lost s | steps redone | final weight diff | each step once |")
    print("|---|---|---|---|---|---|---|")
    for label, where, det, lost, redone, diff, once in rows:
        print(f"| {label} | {where} | {det:.3f} | {lost:.1f} | {redone} | {diff:.1e} | {'yes' if once else 'NO'} |")
    print(f"\n(lost s: against the mean of two unfaulted runs, {clean_s:.1f} s for {args.steps} steps; they differed "
          f"by {abs(again_s - (2 * clean_s - again_s)):.1f} s, this machine's noise; python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
