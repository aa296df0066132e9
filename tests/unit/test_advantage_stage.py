"""The advantage stage: KL folded into the reward, by hand (rlvr.runtime.advantage_stage.form_advantages)."""

from __future__ import annotations

import pytest
import torch

from rlvr.recipe import load_recipe
from rlvr.runtime.advantage_stage import form_advantages
from rlvr.train.batch import TrainBatch


def _batch(rollout_lp):
    b, t = rollout_lp.shape
    return TrainBatch(input_ids=torch.zeros(b, t + 1, dtype=torch.long), attention_mask=torch.ones(b, t + 1, dtype=torch.long),
                      loss_mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]), rollout_logprobs=rollout_lp,
                      advantages=torch.zeros(b), max_new_tokens=3)  # fmt: skip


@pytest.mark.parametrize("estimator,expect_to_go", [
    # k1 = rollout - ref: row 0 [0.5, -1.0] -> penalty -0.1*k1 = [-0.05, 0.1] -> to go [0.05, 0.1];
    # row 1 [0, 0.2, -0.3] -> [0, -0.02, 0.03] -> to go [0.01, 0.01, 0.03]
    ("k1", [[0.05, 0.1, 0.0], [0.01, 0.01, 0.03]]),
    # k2 = (log r)^2 / 2: row 0 [0.125, 0.5] -> [-0.0125, -0.05] -> to go [-0.0625, -0.05];
    # row 1 [0, 0.02, 0.045] -> [0, -0.002, -0.0045] -> to go [-0.0065, -0.0065, -0.0045]
    ("k2", [[-0.0625, -0.05, 0.0], [-0.0065, -0.0065, -0.0045]]),
])
def test_kl_in_the_reward_for_a_group_estimator(estimator, expect_to_go):
    r = load_recipe(None, ["algorithm.advantage=grpo", "algorithm.kl_coef=0.1", "algorithm.kl_penalty=reward",
                           f"algorithm.kl_estimator={estimator}", "rollout.samples_per_prompt=2"])  # fmt: skip
    rollout = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.2, -0.7]])
    batch, critic_inputs, metrics = form_advantages(_batch(rollout), torch.tensor([[1.0, 0.0]]), r, ref_logprobs=ref)
    assert critic_inputs is None
    # GRPO on rewards (1, 0): mean 0.5, unbiased std 0.7071 -> +-0.7071, on the response tokens only
    a = 0.5 / (0.5**0.5 + 1e-6)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    expect = torch.tensor([[a, a, 0.0], [-a, -a, -a]]) * mask + torch.tensor(expect_to_go)
    assert torch.allclose(batch.advantages, expect, atol=1e-6), batch.advantages
    assert "train/kl" in metrics


@pytest.mark.parametrize("estimator", ["reinforce_pp", "reinforce_pp_global"])
def test_reinforce_pp_normalises_after_the_kl_penalty(estimator):
    """Issue 9 item 3, worked by hand: beta 0.1, per-token k1 [[.3, .2], [0, .1]], rewards [1, 0] (one group of 2).
    Reward-to-go of -0.1 * KL: [[-.05, -.02], [-.01, -.01]]; A_t = r + to-go = [[.95, .98], [-.01, -.01]] (the
    group-centred [.5, -.5] shifts every token alike, so both estimators agree); token mean .4775, unbiased std
    .56305 -> [[0.839, 0.893], [-0.866, -0.866]]. Normalising r first gives [[0.657, 0.687], [-0.717, -0.717]]."""
    r = load_recipe(None, [f"algorithm.advantage={estimator}", "algorithm.kl_coef=0.1", "algorithm.kl_penalty=reward",
                           "algorithm.kl_estimator=k1", "rollout.samples_per_prompt=2"])  # fmt: skip
    rollout = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    ref = rollout - torch.tensor([[0.3, 0.2], [0.0, 0.1]])  # k1 = rollout - ref
    b, t = rollout.shape
    batch = TrainBatch(input_ids=torch.zeros(b, t + 1, dtype=torch.long), attention_mask=torch.ones(b, t + 1, dtype=torch.long),
                       loss_mask=torch.ones(b, t), rollout_logprobs=rollout, advantages=torch.zeros(b), max_new_tokens=2)  # fmt: skip
    out, _, _ = form_advantages(batch, torch.tensor([[1.0, 0.0]]), r, ref_logprobs=ref)
    assert torch.allclose(out.advantages, torch.tensor([[0.839, 0.893], [-0.866, -0.866]]), atol=1e-3), out.advantages


def test_a_missing_input_is_named():
    r = load_recipe(None, ["algorithm.kl_coef=0.1", "algorithm.kl_penalty=reward", "rollout.samples_per_prompt=2"])
    rollout = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]])
    with pytest.raises(ValueError, match="reference"):
        form_advantages(_batch(rollout), torch.tensor([[1.0, 0.0]]), r)
    r = load_recipe(None, ["algorithm.advantage=gae", "rollout.samples_per_prompt=2"])
    with pytest.raises(ValueError, match="critic"):
        form_advantages(_batch(rollout), torch.tensor([[1.0, 0.0]]), r)
