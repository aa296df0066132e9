"""DAPO's sample-level tools (rlvr.algos.dapo) and their recipe fields (rlvr.config.AlgorithmConfig).

Expected values are worked by hand from DAPO (Yu et al. 2025, arXiv 2503.14476) sec. 3.2 and eq. 13:
R_length(L) = 0 for L <= L_max - L_cache, ((L_max - L_cache) - L) / L_cache * penalty up to L_max, -penalty past it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.algos import ADVANTAGES, LOSS_AGGREGATIONS
from rlvr.algos.advantages import GRPOSettings
from rlvr.algos.dapo import informative_groups, overlong_mask, overlong_penalty, select_groups
from rlvr.config import RecipeError
from rlvr.recipe import load_recipe

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"  # G = 4, max_new_tokens = 8


# -- informative_groups (dynamic sampling) ----------------------------------------------------------------


def test_informative_groups_brief_example_float64():
    r = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.5, 0.5 + 1e-9]], dtype=torch.float64)
    assert informative_groups(r).tolist() == [False, True, False]


def test_informative_groups_float32_and_ints():
    r = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.5, 0.5 + 1e-9]], dtype=torch.float32)
    assert informative_groups(r).tolist() == [False, True, False]
    assert informative_groups(torch.tensor([[0, 0, 0], [0, 1, 0], [1, 1, 1]])).tolist() == [False, True, False]


def test_informative_groups_eps_is_the_threshold():
    r = torch.tensor([[0.5, 0.5 + 1e-9], [0.0, 2e-6], [0.0, 1e-6]], dtype=torch.float64)
    assert informative_groups(r).tolist() == [False, True, False]  # spread 1e-9, 2e-6 > 1e-6, 1e-6 == eps
    assert informative_groups(r, eps=0.0).tolist() == [True, True, True]
    assert informative_groups(r, eps=1e-5).tolist() == [False, False, False]


def test_informative_groups_single_sample_groups_never_informative():
    assert informative_groups(torch.tensor([[1.0], [0.0]])).tolist() == [False, False]


def test_informative_groups_match_zero_grpo_advantages():
    # case A1 and A2 groups: the filter keeps exactly the groups whose GRPO advantages are not all 0
    r = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [1] * 8, [0] * 8, [0, 0, 0, 0, 0, 0, 0, 1]], dtype=torch.float32)
    keep = informative_groups(r)
    assert keep.tolist() == [True, False, False, True]
    adv = ADVANTAGES.get("grpo")(r, GRPOSettings())
    assert ((adv != 0).any(dim=-1) == keep).all()


@pytest.mark.parametrize(
    "bad, eps, match",
    [
        (torch.tensor([1.0, 0.0]), 1e-6, r"\[P, G\]"),
        (torch.tensor([[1.0, float("nan")]]), 1e-6, "NaN"),
        (torch.tensor([[1.0, 0.0]]), -1.0, "eps"),
    ],
)
def test_informative_groups_errors(bad, eps, match):
    with pytest.raises(ValueError, match=match):
        informative_groups(bad, eps)


# -- select_groups (filling the batch) ---------------------------------------------------------------------


def test_select_groups_informative_first_then_earliest_uninformative():
    inf = torch.tensor([False, True, False, True, True])
    assert select_groups(inf, 2).tolist() == [1, 3]
    assert select_groups(inf, 3).tolist() == [1, 3, 4]
    assert select_groups(inf, 4).tolist() == [1, 3, 4, 0]  # round cap reached: one zero-advantage group fills
    assert select_groups(inf, 5).tolist() == [1, 3, 4, 0, 2]
    assert select_groups(inf, 0).tolist() == []


def test_select_groups_errors():
    with pytest.raises(ValueError, match="need 6 groups from 5"):
        select_groups(torch.zeros(5, dtype=torch.bool), 6)
    with pytest.raises(ValueError, match=r"\[N\]"):
        select_groups(torch.zeros(2, 2, dtype=torch.bool), 1)


# -- overlong_penalty (soft overlong punishment, eq. 13) ---------------------------------------------------


def test_overlong_penalty_hand_values():
    # L_max 64, L_cache 16 -> free up to 48; ramp (48 - L) / 16
    lengths = torch.tensor([0, 40, 48, 49, 56, 63, 64, 70])
    got = overlong_penalty(lengths, max_new_tokens=64, buffer=16, penalty=1.0)
    want = torch.tensor([0.0, 0.0, 0.0, -1 / 16, -0.5, -15 / 16, -1.0, -1.0])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)


def test_overlong_penalty_scales_with_penalty_and_paper_lengths():
    # penalty 0.5: L = 52 -> (48 - 52) / 16 * 0.5 = -0.125
    got = overlong_penalty(torch.tensor([52.0, 64.0]), 64, 16, 0.5)
    torch.testing.assert_close(got, torch.tensor([-0.125, -0.5]), rtol=0, atol=1e-7)
    # the paper's setting: L_max 20,480 with L_cache 4,096 -> 0 at 16,384, -0.5 at 18,432, -1 at 20,480
    paper = overlong_penalty(torch.tensor([10000, 16384, 18432, 20480]), 20480, 4096, 1.0)
    torch.testing.assert_close(paper, torch.tensor([0.0, 0.0, -0.5, -1.0]), rtol=0, atol=1e-7)


def test_overlong_penalty_buffer_zero_is_off():
    assert overlong_penalty(torch.tensor([0, 63, 64]), 64, 0, 1.0).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "lengths, max_new, buffer, penalty, match",
    [
        (torch.tensor([[1, 2]]), 64, 16, 1.0, r"\[B\]"),
        (torch.tensor([-1]), 64, 16, 1.0, ">= 0"),
        (torch.tensor([1]), 0, 0, 1.0, "max_new_tokens"),
        (torch.tensor([1]), 64, 65, 1.0, "buffer"),
        (torch.tensor([1]), 64, -1, 1.0, "buffer"),
        (torch.tensor([1]), 64, 16, -0.5, "penalty"),
    ],
)
def test_overlong_penalty_errors(lengths, max_new, buffer, penalty, match):
    with pytest.raises(ValueError, match=match):
        overlong_penalty(lengths, max_new, buffer, penalty)


# -- overlong_mask (overlong filtering) --------------------------------------------------------------------


def test_overlong_mask_values():
    assert overlong_mask(torch.tensor([True, False, True])).tolist() == [0.0, 1.0, 0.0]
    assert overlong_mask(torch.tensor([0, 1])).tolist() == [1.0, 0.0]


def test_overlong_mask_removes_truncated_tokens_from_the_token_mean():
    # token losses [[1,1,1],[2,2,pad]]: token_mean over 5 tokens = 7/5; with row 0 truncated and filtered,
    # the normaliser is row 1's 2 tokens: 4/2 = 2
    token_loss = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    agg = LOSS_AGGREGATIONS.get("token_mean")
    before = agg(token_loss, mask, num_tokens=float(mask.sum()), num_seqs=2, max_len=3)
    filtered = mask * overlong_mask(torch.tensor([True, False])).unsqueeze(-1)
    after = agg(token_loss, filtered, num_tokens=float(filtered.sum()), num_seqs=2, max_len=3)
    assert float(before) == pytest.approx(1.4)
    assert float(after) == pytest.approx(2.0)


def test_overlong_mask_errors():
    with pytest.raises(ValueError, match=r"\[B\]"):
        overlong_mask(torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="0/1"):
        overlong_mask(torch.tensor([0, 2]))


# -- config fields -----------------------------------------------------------------------------------------


def test_dapo_fields_default_off():
    al = load_recipe(TINY).algorithm
    assert (al.dynamic_sampling, al.dynamic_sampling_max_rounds) == (False, 3)
    assert (al.overlong_filter, al.overlong_buffer, al.overlong_penalty) == (False, 0, 1.0)


def test_dapo_fields_load_from_overrides():
    r = load_recipe(
        TINY,
        [
            "algorithm.dynamic_sampling=true",
            "algorithm.dynamic_sampling_max_rounds=5",
            "algorithm.overlong_filter=true",
            "algorithm.overlong_buffer=2",
            "algorithm.overlong_penalty=0.5",
        ],
    )
    al = r.algorithm
    assert (al.dynamic_sampling, al.dynamic_sampling_max_rounds, al.overlong_filter) == (True, 5, True)
    assert (al.overlong_buffer, al.overlong_penalty) == (2, 0.5)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algorithm.overlong_buffer=8"], r"overlong_buffer=8 must be in \[0, rollout.max_new_tokens - 1 = 7\].*=2"),
        (["algorithm.overlong_buffer=-1"], "overlong_buffer=-1"),
        (["algorithm.overlong_penalty=-1"], "overlong_penalty=-1.0 must be >= 0"),
        (["algorithm.dynamic_sampling=true", "algorithm.dynamic_sampling_max_rounds=0"], "max_rounds >= 1"),
        (["algorithm.dynamic_sampling_max_rounds=-1"], "max_rounds=-1 must be >= 0"),
        (
            ["algorithm.dynamic_sampling=true", "algorithm.advantage=reinforce_pp_global", "rollout.samples_per_prompt=1"],
            "samples_per_prompt >= 2 or algorithm.dynamic_sampling=false",
        ),
        (["algorithm.advantage=passk", "algorithm.advantage.k=2", "algorithm.overlong_buffer=2"], "overlong_buffer=0"),
    ],
)
def test_dapo_fields_invalid(overrides, match):
    with pytest.raises(RecipeError, match=match):
        load_recipe(TINY, overrides)


def test_dapo_fields_valid_edges():
    load_recipe(TINY, ["algorithm.overlong_buffer=7"])  # max_new_tokens 8: a one-token free zone is allowed
    load_recipe(TINY, ["algorithm.dynamic_sampling_max_rounds=0"])  # off: 0 is fine
    # a zero penalty cannot make rewards fractional, so pass@k may keep a buffer
    load_recipe(TINY, ["algorithm.advantage=passk", "algorithm.advantage.k=2", "algorithm.overlong_buffer=2",
                       "algorithm.overlong_penalty=0"])


# -- refill_groups: the controller's dynamic-sampling loop, with a fake rollout role ---------------------------

from rlvr.data.sampler import PromptSampler  # noqa: E402
from rlvr.reward.pool import Scored  # noqa: E402
from rlvr.runtime.rollout_stage import refill_groups, shaped_rewards  # noqa: E402
from rlvr.types import Completion, Prompt, SamplingConfig, VerifyResult  # noqa: E402


def _comp(p, j, length):
    return Completion(prompt_index=p, sample_index=j, prompt_ids=[1], token_ids=[5] * length, logprobs=[-1.0] * length,
                      text="x", finish_reason="stop", policy_version=0)  # fmt: skip


def _scored(score):
    return Scored(reward=score, results={"math": VerifyResult(score=score)}, latency_s=0.0)


class _FakeRoles:
    """generate_and_score answers from a script: one list of (score, length) per prompt per call; records calls."""

    def __init__(self, script):
        self.script, self.calls = list(script), []

    def generate_and_score(self, prompts, sampling):
        self.calls.append([p.index for p in prompts])
        groups = self.script.pop(0)
        comps = [_comp(p.index, j, n) for p, grp in zip(prompts, groups) for j, (_, n) in enumerate(grp)]
        return comps, [_scored(s) for grp in groups for s, _ in grp], {}


def _dapo_recipe(*extra):
    # max_new_tokens 8, overlong_buffer 4, penalty 0.12: eq. 13 ramps over the last 4 tokens, so a 5-token
    # response gets ((8 - 4) - 5) / 4 * 0.12 = -0.03, a 2-token one 0
    return load_recipe(TINY, ["rollout.prompts_per_step=1", "rollout.samples_per_prompt=4", "algorithm.dynamic_sampling=true",
                              "algorithm.dynamic_sampling_max_rounds=1", "algorithm.overlong_buffer=4",
                              "algorithm.overlong_penalty=0.12", *extra])  # fmt: skip


@pytest.mark.parametrize("filter_,kept_first", [("correct", False), ("reward", True)])
def test_refill_filters_on_correctness_not_on_a_length_penalty(filter_, kept_first):
    """Issue 9 item 2: an all-correct group with one response in the overlong ramp has shaped rewards
    [1, 1, 1, 0.97]. The paper's rule (0 < #correct < G) drops it and draws another round; the `reward` filter keeps it
    (and GRPO would then turn the 0.03 penalty into advantages [+0.5, +0.5, +0.5, -1.5])."""
    r = _dapo_recipe(f"algorithm.dynamic_sampling_filter={filter_}")
    prompts = [Prompt(index=i, text="q", prompt_ids=[1], gold="1") for i in range(4)]
    sampler = PromptSampler(4, 1, seed=0, shuffle=False)
    first = [[(1.0, 2), (1.0, 2), (1.0, 2), (1.0, 5)]]  # all correct, one 5-token response: reward 0.97
    second = [[(1.0, 2), (0.0, 2), (0.0, 2), (0.0, 2)]]  # one of four correct: informative either way
    roles = _FakeRoles([second])
    batch_prompts = [prompts[i] for i in sampler.next_batch()]
    comps, scored, _ = _FakeRoles([first]).generate_and_score(batch_prompts, None)
    rewards = shaped_rewards(comps, scored, r)
    assert rewards.tolist() == [[1.0, 1.0, 1.0, pytest.approx(0.97)]]
    sampling = SamplingConfig(n=4, max_new_tokens=8)
    c, s, rw, m = refill_groups(roles.generate_and_score, prompts, sampler, sampling, comps, scored, rewards, r, step=1, primary="math")
    if kept_first:
        assert roles.calls == [] and m["dynamic_sampling/rounds"] == 0.0
        assert rw.tolist() == [[1.0, 1.0, 1.0, pytest.approx(0.97)]]
    else:
        assert roles.calls == [[1]] and m["dynamic_sampling/rounds"] == 1.0  # a second round drew prompt 1
        assert rw.tolist() == [[1.0, 0.0, 0.0, 0.0]] and [x.prompt_index for x in c] == [1, 1, 1, 1]
        assert m["dynamic_sampling/informative_frac"] == 0.5 and m["dynamic_sampling/shortfall"] == 0.0
