"""Infrastructure failures are never trained as the policy's outcome, and a trajectory's length is held to its own
limit (issue 38, items 2 and 3). Every value worked out by hand.

The rule (rlvr.runtime.rollout_stage.infra_failed): a sample whose environment failed is left out of the update (loss
mask 0), out of its group's baseline (the group is estimated over its other samples), out of every batch statistic
and out of the reward and pass@k metrics, and counted (rollout/excluded_frac)."""

from __future__ import annotations

import pytest
import torch

from rlvr.algos.advantages import PassKSettings, PKPOSettings, valid_advantages
from rlvr.algos.dapo import informative_groups
from rlvr.metrics import names as mn
from rlvr.recipe import load_recipe
from rlvr.registry import NoSettings
from rlvr.reward.pool import Scored
from rlvr.runtime.advantage_stage import form_advantages
from rlvr.runtime.rollout_stage import _no_spread_from, budget_lengths, infra_valid, rollout_metrics, shaped_rewards
from rlvr.train.batch import pack
from rlvr.types import Completion, VerifyResult
from rlvr.algos.advantages import GRPOSettings

TINY = "recipes/tiny_test.yaml"


def _c(i: int, g: int, n_tokens: int = 2, failure: str | None = None, end: str | None = "done", sampled=None,
       turns: int = 1) -> Completion:
    mask = None if sampled is None else [1] * sampled + [0] * (n_tokens - sampled)
    return Completion(prompt_index=i // g, sample_index=i % g, prompt_ids=[1, 5], token_ids=[7] * n_tokens,
                      logprobs=[-0.5] * n_tokens, text="", finish_reason="stop", policy_version=0, loss_mask=mask,
                      end_reason=end if failure is None else f"env: {failure}", failure=failure, turns=turns)


def _scored(r: float) -> Scored:
    return Scored(reward=r, results={"m": VerifyResult(score=r)}, latency_s=0.0)


# -- item 3: the advantages over the valid samples --------------------------------------------------------------


def test_grpo_rloo_and_dr_grpo_estimate_a_group_over_its_valid_samples_only():
    """Group (1, 0, 0, 1) with the last sample failed is the group (1, 0, 0): mean 1/3, unbiased std sqrt(1/3)
    = 0.57735 -> GRPO (2/3, -1/3, -1/3) / 0.57735 = (+1.1547, -0.5774, -0.5774), the failed one 0 (with all four
    it would be +-0.866). Dr. GRPO: (+0.6667, -0.3333, -0.3333, 0). RLOO on (1, 0, 1, x): each minus the mean of
    the other two valid ones -> (1 - 0.5, 0 - 1, 1 - 0.5) = (+0.5, -1, +0.5), 0."""
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    valid = torch.tensor([[True, True, True, False]])
    got = valid_advantages("grpo", r, valid, GRPOSettings())
    assert torch.allclose(got, torch.tensor([[1.1547, -0.57735, -0.57735, 0.0]]), atol=1e-4)
    assert torch.allclose(valid_advantages("grpo", r, None, GRPOSettings()), torch.tensor([[0.866, -0.866, -0.866, 0.866]]), atol=1e-3)
    got = valid_advantages("dr_grpo", r, valid, NoSettings())
    assert torch.allclose(got, torch.tensor([[2 / 3, -1 / 3, -1 / 3, 0.0]]), atol=1e-6)
    got = valid_advantages("rloo", torch.tensor([[1.0, 0.0, 1.0, 0.0]]), valid, NoSettings())
    assert torch.allclose(got, torch.tensor([[0.5, -1.0, 0.5, 0.0]]), atol=1e-6)
    # groups of different valid sizes in one batch; a group with no valid sample is all 0
    r2 = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    v2 = torch.tensor([[True, True, True, False], [True, True, True, True], [False] * 4])
    got = valid_advantages("dr_grpo", r2, v2, NoSettings())
    assert torch.allclose(got, torch.tensor([[2 / 3, -1 / 3, -1 / 3, 0], [0.5, -0.5, 0.5, -0.5], [0, 0, 0, 0]]), atol=1e-6)


def test_pass_at_k_estimators_count_over_the_valid_samples_and_skip_groups_too_small_for_k():
    """passk k = 2 on (1, 0, 0, x): N = 3, N_neg = 2: 1 - R = C(2,2)/C(3,2) = 1/3, s = sqrt(1/3 * 2/3) = 0.4714;
    A_pos = (1/3) / s = 0.7071, A_neg = (1/3 - C(1,1)/C(2,1)) / s = -0.3536. k = 4 needs 4 valid samples: 0.
    pkpo loo (k = 2) needs k + 1 = 3: a group with 2 valid gets 0."""
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    valid = torch.tensor([[True, True, True, False]])
    got = valid_advantages("passk", r, valid, PassKSettings(k=2))
    assert torch.allclose(got, torch.tensor([[0.70711, -0.35355, -0.35355, 0.0]]), atol=1e-4)
    assert torch.equal(valid_advantages("passk", r, valid, PassKSettings(k=4)), torch.zeros(1, 4))
    # pkpo loo k = 2 on (1, 0, 0, x): n = 3 = k + 1 is enough. c = 1: correct (k/n) C(n-c, k)/C(n-1, k)
    # = (2/3) C(2,2)/C(2,2) = 2/3; incorrect (k/n) (C(n-c-1, k)/C(n-1, k) - C(n-c-1, k-1)/C(n-1, k-1))
    # = (2/3) (C(1,2)/C(2,2) - C(1,1)/C(2,1)) = (2/3) (0 - 1/2) = -1/3
    got = valid_advantages("pkpo", r, valid, PKPOSettings(k=2, baseline="loo"))
    assert torch.allclose(got, torch.tensor([[2 / 3, -1 / 3, -1 / 3, 0.0]]), atol=1e-6)
    two = torch.tensor([[True, True, False, False]])
    assert torch.equal(valid_advantages("pkpo", r, two, PKPOSettings(k=2, baseline="loo")), torch.zeros(1, 4))
    # loo_minus_one k = 2 on (1, 0, x, x): n = 2, c = 1: correct (k/n) C(n-c, k-1)/C(n-1, k-1) = 1 * 1/1 = 1
    got = valid_advantages("pkpo", r, two, PKPOSettings(k=2, baseline="loo_minus_one"))
    assert torch.allclose(got, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_batch_normalised_estimators_normalise_over_the_valid_samples_of_the_batch():
    """reinforce_pp_global on (1, 0 | 1, x): the batch (1, 0, 1): mean 2/3, unbiased std sqrt(1/3) ->
    (+0.5774, -1.1547 | +0.5774, 0). reinforce_pp on (1, 0, 0 | 1, 0, x): group-centred (2/3, -1/3, -1/3 | 1/2,
    -1/2), batch mean 0, unbiased variance (4/9 + 1/9 + 1/9 + 1/4 + 1/4) / 4 = 7/24, std 0.54006 ->
    (+1.2344, -0.6172, -0.6172 | +0.9258, -0.9258, 0). A group whose valid rewards are equal stays 0:
    (1, 0, 0 | 1, 1, x): flat (2/3, -1/3, -1/3, 0, 0), variance (6/9) / 4 = 1/6, std 0.40825 ->
    (+1.6330, -0.8165, -0.8165 | 0, 0, 0)."""
    got = valid_advantages("reinforce_pp_global", torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
                           torch.tensor([[True, True], [True, False]]), NoSettings())  # fmt: skip
    assert torch.allclose(got, torch.tensor([[0.57735, -1.1547], [0.57735, 0.0]]), atol=1e-4)
    v = torch.tensor([[True, True, True], [True, True, False]])
    got = valid_advantages("reinforce_pp", torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 1.0]]), v, NoSettings())
    assert torch.allclose(got, torch.tensor([[1.2344, -0.6172, -0.6172], [0.9258, -0.9258, 0.0]]), atol=1e-4)
    got = valid_advantages("reinforce_pp", torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]), v, NoSettings())
    assert torch.allclose(got, torch.tensor([[1.63299, -0.8165, -0.8165], [0.0, 0.0, 0.0]]), atol=1e-4)
    # exactly 0, whatever the rounding of the batch mean (0.7 - 0.2 - 0.1 - 0.4 is not 0 in float32)
    got = valid_advantages("reinforce_pp", torch.tensor([[0.7, 0.2, 0.1], [0.3, 0.3, 0.0]]), v, NoSettings())
    assert torch.equal(got[1], torch.zeros(3)) and got[0].abs().min() > 0.1


def test_the_update_equals_the_update_without_the_failed_trajectories():
    """A crashed trajectory in a group of 4 (its verifier even scored it 1): the advantages of the other three, and
    their loss mask, are those of the same group drawn with 3 samples, and the crashed one carries no loss. Group
    (1, 0, 0 | crashed, scored 1) -> (+1.1547, -0.5774, -0.5774) as by hand above."""
    r = load_recipe(TINY, ["rollout.samples_per_prompt=4", "rollout.prompts_per_step=1", "algorithm.advantage=grpo"])
    comps = [_c(0, 4), _c(1, 4, n_tokens=3), _c(2, 4), _c(3, 4, failure="crashed")]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    batch = pack(comps, torch.zeros(4), 0, 8)
    assert batch.loss_mask[3].sum() == 0 and batch.loss_mask[:3].sum() == 2 + 3 + 2
    out, _, _ = form_advantages(batch, rewards, r, valid=infra_valid(comps, 4))
    r3 = load_recipe(TINY, ["rollout.samples_per_prompt=3", "rollout.prompts_per_step=1", "algorithm.advantage=grpo"])
    ref, _, _ = form_advantages(pack(comps[:3], torch.zeros(3), 0, 8), rewards[:, :3], r3)
    assert torch.allclose(out.advantages[:3], ref.advantages) and out.advantages[3] == 0
    assert torch.allclose(out.advantages, torch.tensor([1.1547, -0.57735, -0.57735, 0.0]), atol=1e-4)
    assert infra_valid(comps[:3], 3) is None  # nothing failed: the estimator as ever


def test_the_kl_in_reward_path_normalises_over_the_valid_tokens():
    """reinforce_pp with the KL in the reward and kl_coef 0: raw token advantages are the group-centred rewards of
    the valid samples, normalised over the valid tokens. Group (1, 0, x): centred (0.5, -0.5), tokens 2 + 2, mean 0,
    unbiased std over 4 tokens sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.8660 on the valid rows, 0 on the failed one."""
    r = load_recipe(TINY, ["rollout.samples_per_prompt=3", "rollout.prompts_per_step=1",
                           "algorithm.advantage=reinforce_pp", "algorithm.kl_penalty=reward", "algorithm.kl_coef=1e-9"])
    comps = [_c(0, 3), _c(1, 3), _c(2, 3, failure="timeout")]
    batch = pack(comps, torch.zeros(3), 0, 8)
    out, _, _ = form_advantages(batch, torch.tensor([[1.0, 0.0, 1.0]]), r, ref_logprobs=batch.rollout_logprobs,
                                valid=infra_valid(comps, 3))  # fmt: skip
    a = out.advantages * batch.loss_mask
    assert torch.allclose(a.sum(-1), torch.tensor([2 * 0.86603, -2 * 0.86603, 0.0]), atol=1e-4)


def test_rollout_metrics_leave_failures_out_of_reward_and_pass_at_k_and_count_them():
    """Two groups of 3: (1, 0, crashed scored 1) and (crashed, crashed, 1). Kept: 1, 0, 1 -> reward mean 2/3,
    correct 2/3. Every pass@k over both groups: pass@1 (1/2 + 1) / 2 = 0.75; pass@2: group 1 (n' = 2, c = 1) 1.0,
    group 2 (n' = 1 < 2) its pass@1 = 1 -> 1.0; pass@3: group 1 its pass@2 = 1, group 2 1 -> 1.0. Excluded 3/6, env
    failures 3/6."""
    comps = [_c(0, 3), _c(1, 3), _c(2, 3, failure="crashed"), _c(3, 3, failure="timeout"),
             _c(4, 3, failure="timeout"), _c(5, 3)]  # fmt: skip
    sc = [_scored(x) for x in (1.0, 0.0, 1.0, 0.0, 0.0, 1.0)]
    m = rollout_metrics(comps, sc, (1, 2, 3), 3, "m")
    assert m[mn.REWARD_MEAN] == pytest.approx(2 / 3) and m[mn.REWARD_CORRECT_FRAC] == pytest.approx(2 / 3)
    assert m[mn.passk(1)] == pytest.approx(0.75) and m[mn.passk(2)] == pytest.approx(1.0)
    assert m[mn.passk(3)] == pytest.approx(1.0)
    # the same groups for every k: (0, 1, crashed) and (0, 0, 0): pass@1 (1/2 + 0) / 2, pass@2 (1 + 0) / 2, pass@3
    # the first group's pass@2 = 1: (1 + 0) / 2; never below pass@2 (before, pass@3 averaged group 2 alone: 0)
    comps2 = [_c(0, 3), _c(1, 3), _c(2, 3, failure="crashed"), _c(3, 3), _c(4, 3), _c(5, 3)]
    m2 = rollout_metrics(comps2, [_scored(x) for x in (0.0, 1.0, 1.0, 0.0, 0.0, 0.0)], (1, 2, 3), 3, "m")
    assert [m2[mn.passk(k)] for k in (1, 2, 3)] == [pytest.approx(0.25), pytest.approx(0.5), pytest.approx(0.5)]
    assert m[mn.ROLLOUT_EXCLUDED_FRAC] == pytest.approx(0.5) and m[mn.ROLLOUT_ENV_FAILED_FRAC] == pytest.approx(0.5)
    assert m[mn.GROUPS_ALL_CORRECT_FRAC] == pytest.approx(0.5)  # group 2's one kept sample is correct


def test_dynamic_sampling_sees_no_spread_from_a_failed_sample():
    """(1, 1, crashed scored 0) has no spread among its valid samples: not informative; (1, 0, crashed) is."""
    signal = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    valid = torch.tensor([[True, True, False], [True, True, False], [False, False, False]])
    out = _no_spread_from(signal, valid)
    assert out.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert informative_groups(out).tolist() == [False, True, False]
    assert _no_spread_from(signal, None) is signal


# -- item 2: DAPO's overlong penalty against the limit that applies -------------------------------------------------


def test_the_overlong_penalty_holds_a_trajectory_to_its_token_budget():
    """L_max = environment.max_tokens = 200, buffer 16, free 184. A correct 3-turn trajectory of 60 tokens (30
    sampled, over one turn's max_new_tokens 16): no penalty (before: 30 > 16 -> -1 = reward 0). One of 192 tokens:
    (184 - 192) / 16 = -0.5. Without an environment a sample of 30 response tokens against max_new_tokens 32 and
    buffer 16 (free 16): (16 - 30) / 16 = -0.875."""
    r = load_recipe(TINY, ["environment.name=guess", "environment.max_tokens=200", "rollout.max_new_tokens=16",
                           "algorithm.overlong_buffer=16", "algorithm.overlong_penalty=1",
                           "rollout.samples_per_prompt=2", "rollout.prompts_per_step=1"])  # fmt: skip
    comps = [_c(0, 2, n_tokens=60, sampled=30, turns=3), _c(1, 2, n_tokens=192, sampled=40, turns=3)]
    assert budget_lengths(comps).tolist() == [60, 192]
    got = shaped_rewards(comps, [_scored(1.0), _scored(1.0)], r)
    assert got.tolist() == [[1.0, 0.5]]
    r1 = load_recipe(TINY, ["rollout.max_new_tokens=32", "algorithm.overlong_buffer=16", "algorithm.overlong_penalty=1",
                            "rollout.samples_per_prompt=2", "rollout.prompts_per_step=1"])  # fmt: skip
    single = [_c(0, 2, n_tokens=30, end=None), _c(1, 2, n_tokens=10, end=None)]
    assert shaped_rewards(single, [_scored(1.0), _scored(1.0)], r1).tolist() == [[pytest.approx(0.125), 1.0]]


def test_the_overlong_buffer_is_checked_against_the_budget_that_applies():
    over = ["environment.name=guess", "environment.max_tokens=200", "rollout.max_new_tokens=16"]
    load_recipe(TINY, [*over, "algorithm.overlong_buffer=100"])  # > max_new_tokens, < the budget: accepted
    with pytest.raises(ValueError, match=r"overlong_buffer=200 must be in \[0, environment.max_tokens - 1 = 199\]"):
        load_recipe(TINY, [*over, "algorithm.overlong_buffer=200"])
    with pytest.raises(ValueError, match=r"overlong_buffer=16 must be in \[0, rollout.max_new_tokens - 1 = 15\]"):
        load_recipe(TINY, ["rollout.max_new_tokens=16", "algorithm.overlong_buffer=16"])


def test_refill_draws_again_when_a_group_is_informative_only_through_a_failure():
    """(1, 1, 1, crashed scored 0): all valid samples correct, so DAPO's filter finds no signal and draws a second
    round, whose group (1, 0, 0, 0) is kept. Counting the crash as the policy's 0 would have kept the first."""
    import dataclasses

    from rlvr.data.sampler import PromptSampler
    from rlvr.runtime.rollout_stage import refill_groups
    from rlvr.types import Prompt, SamplingConfig

    r = load_recipe(TINY, ["rollout.prompts_per_step=1", "rollout.samples_per_prompt=4",
                           "algorithm.dynamic_sampling=true", "algorithm.dynamic_sampling_max_rounds=1"])  # fmt: skip
    prompts = [Prompt(index=i, text="q", prompt_ids=[1], gold="1") for i in range(4)]
    sampler = PromptSampler(4, 1, seed=0, shuffle=False)
    first = [_c(0, 4), _c(1, 4), _c(2, 4), _c(3, 4, failure="crashed")]
    calls = []

    def generate(ps, sampling):
        calls.append([p.index for p in ps])
        comps = [dataclasses.replace(_c(j, 4), prompt_index=ps[0].index) for j in range(4)]
        return comps, [_scored(x) for x in (1.0, 0.0, 0.0, 0.0)], {}

    sampler.next_batch()
    scored = [_scored(x) for x in (1.0, 1.0, 1.0, 0.0)]
    rewards = shaped_rewards(first, scored, r)
    c, s, rw, m = refill_groups(generate, prompts, sampler, SamplingConfig(n=4, max_new_tokens=8), first, scored,
                                rewards, r, step=1, primary="m")  # fmt: skip
    assert calls == [[1]] and rw.tolist() == [[1.0, 0.0, 0.0, 0.0]] and m[mn.DYNAMIC_SAMPLING_SHORTFALL] == 0.0
