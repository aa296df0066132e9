"""The advantage stage's metrics, the critic path and the DPH-RL buffer, by hand (issue 23: the mutants of
``rlvr/runtime/advantage_stage.py`` that test_advantage_stage.py lets live; ``benchmarks/mutation_score.py``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from rlvr.metrics import names as mn
from rlvr.recipe import load_recipe
from rlvr.runtime.advantage_stage import build_dph_buffer, dph_batch, form_advantages, needs_reference, uses_critic
from rlvr.train.batch import TrainBatch
from rlvr.types import Completion, Prompt, SamplingConfig


def _recipe(*over):
    return load_recipe(None, ["rollout.samples_per_prompt=2", *over])


def _batch(rollout_lp, mask):
    b, t = rollout_lp.shape
    return TrainBatch(input_ids=torch.zeros(b, t + 1, dtype=torch.long), attention_mask=torch.ones(b, t + 1, dtype=torch.long),
                      loss_mask=mask, rollout_logprobs=rollout_lp, advantages=torch.zeros(b), max_new_tokens=t)  # fmt: skip


@pytest.mark.parametrize("over,ref,critic", [
    ([], False, False),
    (["algorithm.kl_coef=0.1"], False, False),  # in the loss: no reference in the advantage stage
    (["algorithm.kl_coef=0.1", "algorithm.kl_penalty=reward"], True, False),
    (["algorithm.kl_coef=0", "algorithm.kl_penalty=reward"], False, False),
    (["algorithm.advantage=gae"], False, True),
])  # fmt: skip
def test_needs_reference_and_uses_critic(over, ref, critic):
    r = _recipe(*over)
    assert (needs_reference(r), uses_critic(r)) == (ref, critic)


def test_kl_metrics_and_token_advantage_means_by_hand():
    # one group (1, 0), GRPO: +-0.70711 (= 0.5 / (sqrt 0.5 + 1e-6)); k1 = rollout - ref on the masked tokens:
    # row 0 (0.5, -1.0), row 1 (0.2, masked 9.0): KL token mean (0.5 - 1.0 + 0.2) / 3 = -0.1;
    # penalty -0.1 * k1: row sums -0.05 + 0.1 = 0.05 and -0.02 -> per-sequence mean 0.015;
    # to-go: row 0 (0.05, 0.1), row 1 (-0.02, 0): token advantages (a + 0.05, a + 0.1), (-a - 0.02, 0)
    r = _recipe("algorithm.advantage=grpo", "algorithm.kl_coef=0.1", "algorithm.kl_penalty=reward",
                "algorithm.kl_estimator=k1")  # fmt: skip
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rollout = torch.tensor([[-1.0, -2.0], [-1.0, 5.0]])
    ref = rollout - torch.tensor([[0.5, -1.0], [0.2, 9.0]])
    out, critic, m = form_advantages(_batch(rollout, mask), torch.tensor([[1.0, 0.0]]), r, ref_logprobs=ref)
    a = 0.5 / (0.5**0.5 + 1e-6)
    expect = torch.tensor([[a + 0.05, a + 0.1], [-a - 0.02, 0.0]])
    assert critic is None and torch.allclose(out.advantages, expect, atol=1e-6)
    assert m[mn.TRAIN_KL] == pytest.approx(-0.1, abs=1e-6)
    assert m[mn.REWARD_KL_PENALTY_SEQ_MEAN] == pytest.approx(0.015, abs=1e-6)
    assert m[mn.ADV_TOKEN_MEAN] == pytest.approx((a + 0.05 + a + 0.1 - a - 0.02) / 3, abs=1e-6)
    assert m[mn.ADV_TOKEN_ABS_MEAN] == pytest.approx((3 * a + 0.17) / 3, abs=1e-6)


def test_one_response_token_is_its_own_mean():
    # one masked token in the batch: the token means divide by 1 (the count), and a sequence-level advantage
    # estimator without the KL in the reward gives [B] advantages, no token metrics
    r = _recipe("algorithm.advantage=grpo", "algorithm.kl_coef=0.1", "algorithm.kl_penalty=reward",
                "algorithm.kl_estimator=k1")  # fmt: skip
    mask = torch.tensor([[1.0], [0.0]])
    rollout = torch.tensor([[-1.0], [-1.0]])
    _, _, m = form_advantages(_batch(rollout, mask), torch.tensor([[1.0, 0.0]]), r, ref_logprobs=rollout - 0.4)
    assert m[mn.TRAIN_KL] == pytest.approx(0.4, abs=1e-6)  # k1 = 0.4 on the one token
    out, _, m2 = form_advantages(_batch(rollout, mask), torch.tensor([[1.0, 0.0]]), _recipe("algorithm.advantage=grpo"))
    assert out.advantages.shape == (2,) and mn.ADV_TOKEN_MEAN not in m2


def test_critic_path_by_hand():
    # GAE with gamma = lam = 1, no whitening: returns = reward-to-go of (outcome on the last token + penalty),
    # advantages = returns - values. Rewards (1, 0); mask row 0 (1, 1), row 1 (1, 0); k1 = 0.5 on every token,
    # kl_coef 0.2 -> penalty -0.1 per masked token. Token rewards: row 0 (-0.1, 0.9), row 1 (-0.1, 0).
    # returns: row 0 (0.8, 0.9), row 1 (-0.1, 0); values 0.25 everywhere: advantages (0.55, 0.65), (-0.35, 0)
    r = _recipe("algorithm.advantage=gae", "algorithm.advantage.lam=1.0", "algorithm.advantage.whiten=false",
                "algorithm.kl_coef=0.2", "algorithm.kl_penalty=reward", "algorithm.kl_estimator=k1")  # fmt: skip
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rollout = torch.full((2, 2), -1.0)
    values = torch.full((2, 2), 0.25)
    out, critic, m = form_advantages(_batch(rollout, mask), torch.tensor([[1.0, 0.0]]), r, ref_logprobs=rollout - 0.5,
                                     values=values)  # fmt: skip
    assert set(critic) == {"values", "returns"} and critic["values"] is values
    assert torch.allclose(critic["returns"] * mask, torch.tensor([[0.8, 0.9], [-0.1, 0.0]]), atol=1e-6)
    assert torch.allclose(out.advantages * mask, torch.tensor([[0.55, 0.65], [-0.35, 0.0]]), atol=1e-6)
    assert m[mn.CRITIC_VALUE_MEAN] == pytest.approx(0.25)  # masked tokens only: 3 x 0.25 / 3
    assert m[mn.CRITIC_RETURN_MEAN] == pytest.approx((0.8 + 0.9 - 0.1) / 3, abs=1e-6)
    with pytest.raises(ValueError, match="needs the critic's values"):
        form_advantages(_batch(rollout, mask), torch.tensor([[1.0, 0.0]]), r, ref_logprobs=rollout - 0.5)


# ------------------------------------------------------------------------------------------------------
# DPH-RL buffer


def _completion(i, tokens):
    return Completion(prompt_index=i, sample_index=0, prompt_ids=[1, 2], token_ids=tokens, logprobs=[-0.5] * len(tokens),
                      text="", finish_reason="stop", policy_version=0)  # fmt: skip


def test_build_dph_buffer_keeps_the_correct_non_empty_samples():
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], gold="1") for i in range(5)]
    seen = []

    def generate(ps, sampling):
        seen.append([p.index for p in ps])
        # by position: an empty response scored 1, a response scored 0.99, then responses scored 1
        comps = [_completion(p.index, [] if j == 0 else [7]) for j, p in enumerate(ps)]
        scores = [1.0, 0.99] + [1.0] * (len(ps) - 2)
        return comps, [SimpleNamespace(results={"math": SimpleNamespace(score=s)}) for s in scores], {}

    r = _recipe("algorithm.dph_divergence=js", "algorithm.dph_coef=0.1", "algorithm.dph_prompts=3")
    kept = build_dph_buffer(generate, prompts, SamplingConfig(n=1, max_new_tokens=4), r, "math")
    # 3 of the 5 prompts asked; the first (score 1 but empty) and the second (0.99) dropped; the third kept
    assert len(seen[0]) == 3 and len(set(seen[0])) == 3
    assert [c.prompt_index for c in kept] == [seen[0][2]]
    # more prompts asked for than exist: every prompt, once
    r10 = _recipe("algorithm.dph_divergence=js", "algorithm.dph_coef=0.1", "algorithm.dph_prompts=10")
    build_dph_buffer(generate, prompts, SamplingConfig(n=1, max_new_tokens=4), r10, "math")
    assert sorted(seen[1]) == [0, 1, 2, 3, 4]


def test_dph_batch_draws_and_its_off_switches():
    buffer = [_completion(i, [5, 6, 7][: i + 1]) for i in range(3)]
    on = _recipe("algorithm.dph_divergence=js", "algorithm.dph_coef=0.1", "algorithm.dph_batch=2")
    b = dph_batch(buffer, 1, on, pad_id=0)
    assert len(b) == 2 and torch.equal(b.advantages, torch.zeros(2))
    big = _recipe("algorithm.dph_divergence=js", "algorithm.dph_coef=0.1", "algorithm.dph_batch=8")
    assert len(dph_batch(buffer, 1, big, pad_id=0)) == 3  # no more than the buffer holds
    assert dph_batch([], 1, on, pad_id=0) is None
    assert dph_batch(buffer, 1, _recipe("algorithm.dph_coef=0.1"), pad_id=0) is None  # divergence none
    off = dataclasses.replace(on, algorithm=dataclasses.replace(on.algorithm, dph_coef=0.0))  # a recipe refuses it
    assert dph_batch(buffer, 1, off, pad_id=0) is None
    assert dph_batch(buffer, 1, _recipe("algorithm.dph_divergence=forward_kl", "algorithm.dph_coef=1"), pad_id=0)


def test_reinforce_pp_token_normalisation_ignores_masked_positions():
    # rewards (1, 0) -> group-centred (0.5, -0.5); k1 = 0 (ref = rollout): no penalty, so the raw token
    # advantages are 0.5, 0.5 (row 0) and -0.5 (row 1; its second position is masked). Over the 3 masked tokens:
    # mean 1/6, deviations (1/3, 1/3, -2/3), unbiased variance (1/9 + 1/9 + 4/9) / 2 = 1/3, std 0.57735
    # -> (0.57735, 0.57735), (-1.1547, 0)
    r = _recipe("algorithm.advantage=reinforce_pp", "algorithm.kl_coef=0.1", "algorithm.kl_penalty=reward",
                "algorithm.kl_estimator=k1")  # fmt: skip
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rollout = torch.tensor([[-1.0, -2.0], [-1.0, -3.0]])
    out, _, _ = form_advantages(_batch(rollout, mask), torch.tensor([[1.0, 0.0]]), r, ref_logprobs=rollout)
    s = 3**-0.5
    assert torch.allclose(out.advantages, torch.tensor([[s, s], [-2 * s, 0.0]]), atol=1e-5)
