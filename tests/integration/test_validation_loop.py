"""Validation in the real loop, end to end (issue 9): ``validation.every_steps``, ``at_start`` and the
``checkpoint.best_metric`` pruning that reads the validation metric.

Tiny model, local executor, vLLM engine, binary ``has_digit`` reward (a random model earns it about half the
time, so val/pass@1 is neither 0 nor 1 and moves between validations).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.recipe import load_recipe

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
VERIFIER = f"{Path(__file__).parent / 'shaping_verifiers.py'}:has_digit"


def test_validation_every_at_start_and_best_metric_pruning(tmp_path):
    from rlvr.runtime.controller import train

    recipe = load_recipe(ROOT / "recipes" / "tiny_test.yaml", [
        f"run.output_dir={tmp_path}", "run.steps=4", "run.executor=local",
        "data.generated.holdout=16", f"reward.verifiers=[{{name: '{VERIFIER}'}}]",
        "validation.every_steps=2", "validation.at_start=true", "validation.limit=8", "validation.samples=4",
        "checkpoint.every_steps=1", "checkpoint.keep_last=1", "checkpoint.best_metric=val/pass@1",
    ])  # fmt: skip
    result = train(recipe)
    rows = [json.loads(line) for line in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    with_val = [r["step"] for r in rows if "val/pass@1" in r]
    assert with_val == [0, 2, 4]  # at the start, then every 2 steps (the last step is one of them)
    for r in rows:
        if "val/pass@1" in r:
            assert 0.0 <= r["val/pass@1"] <= r["val/pass@2"] <= r["val/pass@4"] <= 1.0
            assert "val/maj@4" in r and "val/mean@4" in r
    assert rows[0]["policy_version"] == 0.0
    # RUN/validation.jsonl holds each validation's per-problem outcomes: recomputing pass@k from them gives the
    # logged val/pass@k (pass@k of one problem by Chen et al.'s estimator, mean over the 8 problems)
    from math import comb

    records = [json.loads(line) for line in Path(result.run_dir, "validation.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in records] == [0, 2, 4]
    logged = {r["step"]: r for r in rows}
    for rec in records:
        assert rec["n"] == 4 and len(rec["problems"]) == 8
        for k in (1, 2, 4):
            cs = [sum(p["correct"]) for p in rec["problems"]]
            mean = sum(1 - comb(4 - c, k) / comb(4, k) for c in cs) / 8
            assert mean == pytest.approx(logged[rec["step"]][f"val/pass@{k}"], abs=1e-12)
    # keep_last 1 keeps step 4; best_metric keeps the checkpoint with the highest val/pass@1 among those that
    # logged it (steps 2 and 4; step 0 is the starting policy, not a checkpoint), the earliest on a tie
    val = {r["step"]: r["val/pass@1"] for r in rows if r["step"] in (2, 4)}
    best = 2 if val[2] >= val[4] else 4
    kept = sorted(p.name for p in Path(result.run_dir, "checkpoints").iterdir())
    assert kept == sorted({f"step_{4:06d}", f"step_{best:06d}"}), (kept, val)
