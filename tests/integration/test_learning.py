"""A learning test: GRPO through the real loop (vLLM engine, verifier pool, trainer, weight sync) raises the reward.

Task: ``tiny-random`` (a random-init, character-level 2-layer Llama) on generated one-digit addition, scored by
the ``numeric`` verifier. At the start the model emits random characters and the last number it writes matches
the sum ~1-2% of the time; within tens of steps GRPO teaches it to answer with short digit strings, and the reward
rises several-fold. lr 5e-3: at 1e-2 the policy's entropy collapsed (0.09 nats) onto one answer after ~40 steps
in one of three runs (every group then all-wrong, no signal: reward 0 for the last 20 steps), a trajectory a change
of the engine's KV block size alone (128 -> 32 tokens) was enough to select. Measured at lr 5e-3, 60 steps, first
10 / last 10 steps' mean reward: seed 0 0.008 / 0.091 (block 32), 0.011 / 0.091 (block 128); seed 1 0.021 / 0.076.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.recipe import load_recipe

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_grpo_raises_reward_on_tiny_addition(tmp_path):
    from rlvr.runtime.controller import train

    recipe = load_recipe(
        REPO / "recipes" / "tiny_test.yaml",
        [
            "run.executor=local",
            f"run.output_dir={tmp_path}",
            "run.steps=60",
            "run.save_final=false",
            "rollout.prompts_per_step=16",
            "rollout.samples_per_prompt=8",
            "rollout.max_new_tokens=4",
            "trainer.lr=5e-3",
            "trainer.micro_batch_size=128",
        ],
    )
    result = train(recipe)
    rows = [json.loads(line) for line in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert first < 0.05, f"the random model should start near chance, got {first:.3f}"
    assert last > first + 0.03, f"reward did not rise: first 10 steps {first:.3f}, last 10 {last:.3f}: {rewards}"
    assert rows[-1]["policy_version"] == 60
