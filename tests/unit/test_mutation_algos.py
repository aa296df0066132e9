"""Values of the advantage estimators, policy losses and KL terms that the earlier tests left open (issue 23:
the mutants of ``rlvr/algos/{advantages,losses,kl}.py`` they let live; ``benchmarks/mutation_score.py``,
docs/mutation.md lists the equivalent ones).

Every expected value is worked out by hand in the comment beside it, from the formula in the docstring of the
function under test and its paper (GRPO: Shao et al. 2024; RLOO: Ahmadian et al. 2024; REINFORCE++: Hu 2025;
PPO clip: Schulman et al. 2017; GSPO: Zheng et al. 2025; CISPO: MiniMax 2025; KL: Schulman 2020)."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest
import torch

from rlvr.algos.advantages import (
    ADVANTAGES,
    GRPOSettings,
    PassKSettings,
    PKPOSettings,
    comb_ratio,
    grpo,
    normalise_token_advantages,
    reinforce_pp,
    reinforce_pp_global,
    rloo,
)
from rlvr.algos.kl import entropy_bonus, kl_as_reward
from rlvr.algos.losses import LOSS_AGGREGATIONS, POLICY_LOSSES, CISPOSettings, GSPOSettings, PPOClipSettings
from rlvr.registry import NoSettings

NO = NoSettings()


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# ------------------------------------------------------------------------------------------------------
# advantages


def test_std_eps_is_added_so_a_near_constant_group_stays_bounded():
    # rewards (0, 1e-6): centred -+5e-7, unbiased std 7.0711e-7; / (std + 1e-6) -> -+0.29289 (not -+1.707)
    a = 0.5 / (math.sqrt(0.5) + 1.0)
    assert torch.allclose(grpo(_t([[0.0, 1e-6]]), GRPOSettings()), _t([[-a, a]]), atol=1e-4)
    # REINFORCE++: the same single group is the whole batch, so the batch std is the group's: -+0.29289
    assert torch.allclose(reinforce_pp(_t([[0.0, 1e-6]]), NO), _t([[-a, a]]), atol=1e-4)
    # REINFORCE++ without a group baseline, and its token form: the same two values, the same -+0.29289
    assert torch.allclose(reinforce_pp_global(_t([[0.0, 1e-6]]), NO), _t([[-a, a]]), atol=1e-4)
    assert torch.allclose(normalise_token_advantages(_t([[0.0, 1e-6]]), _t([[1.0, 1.0]])), _t([[-a, a]]), atol=1e-4)


def test_reinforce_pp_global_all_equal_batch_is_exactly_zero():
    # 0.9 three times: the float32 mean is 0.9 + 6e-8, so (r - mean) / (0 + 1e-6) would give 0.06, not 0
    assert reinforce_pp_global(_t([[0.9, 0.9, 0.9]]), NO).tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("name,cfg", [("grpo", GRPOSettings()), ("dr_grpo", NO), ("rloo", NO)])
def test_a_flat_group_beside_a_varied_one_is_exactly_zero(name, cfg):
    # the no-signal check is per group. Group 0 is flat at 0.9, whose float32 mean is 0.9 + 6e-8, so only the
    # check makes it exactly 0 (GRPO would give -6e-8 / (0 + 1e-6) = -0.06); a batch-wide max/min would see
    # group 1's spread and skip it
    out = ADVANTAGES.get(name)(_t([[0.9, 0.9, 0.9], [1.0, 0.0, 0.0]]), cfg)
    assert out[0].tolist() == [0.0, 0.0, 0.0]
    assert (out[1] != 0).all()


def test_two_sample_groups_are_compared():
    # RLOO, G = 2: A = r - the other sample: (1, 0) -> (+1, -1); (0.5, 2) -> (-1.5, +1.5)
    assert torch.allclose(rloo(_t([[1.0, 0.0], [0.5, 2.0]]), NO), _t([[1.0, -1.0], [-1.5, 1.5]]))
    # REINFORCE++ with B = 2: centred (0.5, -0.5), unbiased std sqrt(0.5) -> -+0.70711
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert torch.allclose(reinforce_pp(_t([[1.0, 0.0]]), NO), _t([[s, -s]]), atol=1e-6)


def test_token_normalisation_two_tokens_and_masked_values():
    # two response tokens (1, 2) and a masked-out 100: mean 1.5, unbiased std sqrt(0.5) -> (-0.70711, +0.70711, 0)
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    out = normalise_token_advantages(_t([[1.0, 2.0, 100.0]]), _t([[1.0, 1.0, 0.0]]))
    assert torch.allclose(out, _t([[-s, s, 0.0]]), atol=1e-6)


def test_token_normalisation_with_unit_variance():
    # tokens (0, 1, 2): mean 1, unbiased variance (1 + 0 + 1) / 2 = 1 -> (x - 1) / (1 + 1e-6)
    out = normalise_token_advantages(_t([[0.0, 1.0], [2.0, 0.0]]), _t([[1.0, 1.0], [1.0, 0.0]]))
    assert torch.allclose(out, _t([[-1.0, 0.0], [1.0, 0.0]]), atol=1e-5)


# ------------------------------------------------------------------------------------------------------
# settings checks at their boundary values (G = 4)

_G4 = SimpleNamespace(rollout=SimpleNamespace(samples_per_prompt=4))
_W = "algorithm.advantage"


@pytest.mark.parametrize("k,ok,fix", [(0, False, 1), (1, True, None), (4, True, None), (5, False, 4)])
def test_passk_k_boundaries(k, ok, fix):
    errs = PassKSettings(k=k).errors(_G4, _W)
    assert errs == [] if ok else errs == [f"{_W}.k={k} must be in [1, rollout.samples_per_prompt=4]: set {_W}.k={fix}"]


@pytest.mark.parametrize("baseline,k,ok", [
    ("loo_minus_one", 1, False), ("loo_minus_one", 2, True), ("loo_minus_one", 4, True), ("loo_minus_one", 5, False),
    ("loo", 0, False), ("loo", 1, True), ("loo", 3, True), ("loo", 4, False),
])  # fmt: skip
def test_pkpo_k_boundaries(baseline, k, ok):
    errs = PKPOSettings(k=k, baseline=baseline).errors(_G4, _W)
    assert (errs == []) == ok, errs
    if baseline == "loo_minus_one" and not ok:  # the fix named is the nearest k in [2, G]
        assert errs[0].endswith(f"set {_W}.k={2 if k < 2 else 4}" + (" (k = 1 has no baseline; use baseline=loo)"
                                                                        if k == 1 else ""))


def test_comb_ratio_refuses_k_over_b_and_negative_k():
    with pytest.raises(ValueError, match="comb_ratio needs 0 <= k <= b, got k = 3, b = 2"):
        comb_ratio(torch.tensor([1.0]), 2, 3)
    with pytest.raises(ValueError, match="got k = -1, b = 2"):
        comb_ratio(torch.tensor([1.0]), 2, -1)


@pytest.mark.parametrize("name,cfg,what", [
    ("passk", PassKSettings(k=9), "advantage 'passk' needs 1 <= algorithm.advantage.k <= 8"),
    ("pkpo", PKPOSettings(k=9), "advantage 'pkpo (baseline=loo_minus_one)' needs 2 <= algorithm.advantage.k <= 8"),
    ("pkpo", PKPOSettings(k=8, baseline="loo"), "advantage 'pkpo (baseline=loo)' needs 1 <= algorithm.advantage.k <= 7"),
])  # fmt: skip
def test_passk_errors_name_the_estimator(name, cfg, what):
    r = _t([[1, 1, 1, 0, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match=re.escape(what)):
        ADVANTAGES.get(name)(r, cfg)
    with pytest.raises(ValueError, match=f"advantage '{name}' is defined for binary rewards"):
        ADVANTAGES.get(name)(r * 0.5, dataclasses.replace(cfg, k=2))


# ------------------------------------------------------------------------------------------------------
# policy losses: which tokens count as clipped, at and around the boundaries

# (ratio, advantage) with clip [0.8, 1.2]; -min(r A, clip(r) A) and the PPO halves (case A6: only where the clip
# changes the objective): r > 1.2 with A > 0 -> high; r < 0.8 with A < 0 -> low; A = 0 or the other sign -> none
_RA = [(1.5, 1.0), (1.5, -1.0), (1.5, 0.0), (0.5, 0.0), (0.5, 0.5), (0.5, -1.0), (0.5, 1.0)]
_LOSS = [-1.2, 1.5, 0.0, 0.0, -0.25, 0.8, -0.5]
_HIGH = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
_LOW = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def _one_token_rows(pairs, name, cfg, **kw):
    lp = torch.tensor([[math.log(r)] for r, _ in pairs])
    return POLICY_LOSSES.get(name)(lp, torch.zeros_like(lp), torch.tensor([a for _, a in pairs]),
                                   torch.ones_like(lp), cfg, **kw)  # fmt: skip


@pytest.mark.parametrize("name,cfg", [("ppo_clip", PPOClipSettings(clip_low=0.2, clip_high=0.2)),
                                      ("gspo", GSPOSettings(clip_low=0.2, clip_high=0.2))])
def test_clip_flags_follow_the_sign_of_the_advantage(name, cfg):
    # one token per sequence: GSPO's sequence ratio is the token's ratio, so both losses agree
    loss, stats = _one_token_rows(_RA, name, cfg)
    assert loss.flatten().tolist() == pytest.approx(_LOSS, abs=1e-6)
    assert stats["clipped_high"].flatten().tolist() == _HIGH
    assert stats["clipped_low"].flatten().tolist() == _LOW
    assert stats["clipped"].flatten().tolist() == [h + lo for h, lo in zip(_HIGH, _LOW)]


@pytest.mark.parametrize("name,cfg,expect", [
    ("ppo_clip", PPOClipSettings(clip_low=0.0, clip_high=0.0), [-1.0, 1.0]),
    ("gspo", GSPOSettings(clip_low=0.0, clip_high=0.0), [-1.0, 1.0]),
    ("cispo", CISPOSettings(clip_low=0.0, clip_high=0.0), [0.0, 0.0]),  # -w A log pi with log pi = log 1 = 0
])  # fmt: skip
def test_a_ratio_exactly_at_the_clip_bound_is_not_clipped(name, cfg, expect):
    # clip range [1, 1] and ratio exactly 1: the clip changes nothing, so nothing is flagged; loss -A (PPO, GSPO)
    loss, stats = _one_token_rows([(1.0, 1.0), (1.0, -1.0)], name, cfg)
    assert [abs(x) for x in loss.flatten().tolist()] == [abs(x) for x in expect]
    assert stats["clipped"].flatten().tolist() == [0.0, 0.0]
    assert stats["clipped_low"].flatten().tolist() == stats["clipped_high"].flatten().tolist() == [0.0, 0.0]


def test_dual_clip_only_for_negative_advantages_and_ratios_over_c():
    # c = 2, clip [0.8, 1.2]. (1, 0.5): -0.5, untouched (A > 0 is never dual-clipped, not even for A < 1).
    # (2, -1): ratio exactly c: PPO loss min(-(2)(-1), -(1.2)(-1)) -> max = 2 = -c A: equal, not flagged.
    # (4, -1): PPO loss 4 capped at -c A = 2, flagged. (4, 0) and (4, 0.5): A >= 0, not flagged
    # ((4, 0.5): -min(2, 0.6) = -0.6).
    cfg = PPOClipSettings(clip_low=0.2, clip_high=0.2, dual_clip_c=2.0)
    loss, stats = _one_token_rows([(1.0, 0.5), (2.0, -1.0), (4.0, -1.0), (4.0, 0.0), (4.0, 0.5)], "ppo_clip", cfg)
    assert loss.flatten().tolist() == pytest.approx([-0.5, 2.0, 2.0, 0.0, -0.6], abs=1e-6)
    assert stats["clipped_dual"].flatten().tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert stats["clipped"].flatten().tolist() == [0.0, 0.0, 1.0, 0.0, 1.0]


def test_gspo_sequence_ratio_uses_old_logprobs_and_the_masked_length():
    # seq 0: lp - old = (0.1, 0.3) on its 2 masked tokens (the masked-out 5.0 is ignored) -> s = e^0.2, A = +1
    # seq 1: one token, lp - old = 0.1 -> s = e^0.1 (length 1, not floored at more), A = -1
    # clip [0.5, 1.5] leaves both unclipped: loss -s A on the masked tokens
    old = _t([[-1.0, -2.0, -3.0], [-0.5, -1.0, -1.0]])
    lp = old + _t([[0.1, 0.3, 5.0], [0.1, 0.0, 0.0]])
    mask = _t([[1, 1, 0], [1, 0, 0]])
    loss, stats = POLICY_LOSSES.get("gspo")(lp, old, _t([1.0, -1.0]), mask, GSPOSettings(clip_low=0.5, clip_high=0.5))
    s0, s1 = math.exp(0.2), math.exp(0.1)
    assert torch.allclose(loss, _t([[-s0, -s0, 0.0], [s1, 0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(stats["ratio"], _t([[s0, s0, 0.0], [s1, 0.0, 0.0]]), atol=1e-6)


@pytest.mark.parametrize("name,cfg", [("ppo_clip", PPOClipSettings()), ("gspo", GSPOSettings()),
                                      ("cispo", CISPOSettings())])
def test_shape_errors_name_the_argument(name, cfg):
    z = torch.zeros(1, 2)
    f = POLICY_LOSSES.get(name)
    with pytest.raises(ValueError, match=re.escape("old_logprobs has shape (1, 3), expected [B, T] = (1, 2)")):
        f(z, torch.zeros(1, 3), torch.ones(1), torch.ones(1, 2), cfg)
    with pytest.raises(ValueError, match=re.escape("mask has shape (1, 3), expected [B, T] = (1, 2)")):
        f(z, z, torch.ones(1), torch.ones(1, 3), cfg)
    with pytest.raises(ValueError, match=re.escape("rollout_logprobs has shape (1, 3), expected [B, T] = (1, 2)")):
        f(z, z, torch.ones(1), torch.ones(1, 2), cfg, rollout_logprobs=torch.zeros(1, 3))


def test_cispo_weight_clip_flags_whatever_the_sign():
    # clip [0.8, 1.2] on the weight, flagged by the ratio alone: 0.5 -> low, 1.0 -> none, 1.5 -> high (A of
    # either sign); loss -clip(r) A log pi with log pi = log r (old = 0): -0.8 * 1 * log 0.5, 0, -1.2 * (-1) * log 1.5
    cfg = CISPOSettings(clip_low=0.2, clip_high=0.2)
    loss, stats = _one_token_rows([(0.5, 1.0), (1.0, -1.0), (1.5, -1.0)], "cispo", cfg)
    assert loss.flatten().tolist() == pytest.approx([-0.8 * math.log(0.5), 0.0, 1.2 * math.log(1.5)], abs=1e-6)
    assert stats["clipped_low"].flatten().tolist() == [1.0, 0.0, 0.0]
    assert stats["clipped_high"].flatten().tolist() == [0.0, 0.0, 1.0]


# ------------------------------------------------------------------------------------------------------
# rollout correction at a cap of 1 (the smallest tis_cap a recipe allows) and at a weight exactly on the cap

# old - rollout = (0, log 2, -log 2): raw weights (1, 2, 0.5); logprobs = old (ratio 1), A = 1: PPO loss -1 per
# token, times the weight
_GAPS = [0.0, math.log(2.0), -math.log(2.0)]


@pytest.mark.parametrize("mode,weights,capped", [
    ("tis", [1.0, 1.0, 0.5], [0.0, 1.0, 0.0]),  # min(raw, 1); a weight exactly at the cap is not "capped"
    ("decoupled", [1.0, 0.0, 0.5], [0.0, 1.0, 0.0]),  # over the cap -> 0; exactly at it -> kept
])  # fmt: skip
def test_a_cap_of_one(mode, weights, capped):
    old = torch.zeros(1, 3)
    loss, stats = POLICY_LOSSES.get("ppo_clip")(old, old, torch.ones(1), torch.ones(1, 3), PPOClipSettings(),
                                                rollout_logprobs=old - _t([_GAPS]), tis_cap=1.0,
                                                rollout_correction=mode)  # fmt: skip
    assert loss.flatten().tolist() == pytest.approx([-w for w in weights], abs=1e-6)
    assert stats["tis_weight"].flatten().tolist() == pytest.approx(weights, abs=1e-6)
    assert stats["tis_capped"].flatten().tolist() == capped


# ------------------------------------------------------------------------------------------------------
# settings checks of the losses at their boundary values


def test_clip_ranges_accept_zero_and_refuse_negatives():
    for cls in (PPOClipSettings, GSPOSettings, CISPOSettings):
        assert cls(clip_low=0.0, clip_high=0.0).errors(_G4, "p") == []
        msg = ["p.clip_low and p.clip_high must be >= 0"]
        assert cls(clip_low=-0.1, clip_high=0.0).errors(_G4, "p") == msg
        assert cls(clip_low=0.0, clip_high=-0.1).errors(_G4, "p") == msg


@pytest.mark.parametrize("c,ok", [(0.0, True), (0.5, False), (1.0, False), (1.5, True), (3.0, True)])
def test_dual_clip_c_is_off_or_over_one(c, ok):
    errs = PPOClipSettings(dual_clip_c=c).errors(_G4, "p")
    assert errs == ([] if ok else [f"p.dual_clip_c={c} must be 0 (off) or > 1 (Ye et al. 2020 use 3)"])


# ------------------------------------------------------------------------------------------------------
# loss aggregations


@pytest.mark.parametrize("name", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"])
def test_aggregation_errors_name_the_count_and_the_mask(name):
    f = LOSS_AGGREGATIONS.get(name)
    with pytest.raises(ValueError, match=re.escape("mask has shape (1, 3), expected [B, T] = (1, 2)")):
        f(torch.zeros(1, 2), torch.ones(1, 3), num_tokens=2, num_seqs=1, max_len=4)
    bad = "num_tokens" if name == "token_mean" else "num_seqs"
    counts = {"num_tokens": 2, "num_seqs": 1, bad: -1}
    with pytest.raises(ValueError, match=f"{bad} must be a finite count >= 0"):
        f(torch.zeros(1, 2), torch.ones(1, 2), **counts, max_len=4)


def test_sum_norm_accepts_a_budget_of_one_token_and_refuses_zero():
    # two one-token responses, losses 3 and 5, max_len 1: (3 + 5) / (2 sequences * 1)
    f = LOSS_AGGREGATIONS.get("seq_mean_token_sum_norm")
    assert f(_t([[3.0], [5.0]]), torch.ones(2, 1), num_tokens=2, num_seqs=2, max_len=1).item() == 4.0
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        f(_t([[3.0]]), torch.zeros(1, 1), num_tokens=0, num_seqs=1, max_len=0)


# ------------------------------------------------------------------------------------------------------
# KL terms


def test_kl_as_reward_beta_zero_is_no_penalty_and_negative_is_refused():
    lp, ref = _t([[-1.0, -2.0]]), _t([[-1.5, -1.0]])
    assert kl_as_reward(lp, ref, torch.ones(1, 2), 0.0).abs().sum().item() == 0.0
    with pytest.raises(ValueError, match="beta must be >= 0, got -0.1"):
        kl_as_reward(lp, ref, torch.ones(1, 2), -0.1)


def test_entropy_bonus_value():
    # -coef * entropy: coef 0.1, entropy (2, 4) nats -> (-0.2, -0.4); a masked token -> 0
    out = entropy_bonus(_t([[2.0, 4.0, 3.0]]), _t([[1.0, 1.0, 0.0]]), coef=0.1)
    assert torch.allclose(out, _t([[-0.2, -0.4, 0.0]]))
