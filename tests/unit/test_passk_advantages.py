"""pass@k advantages (passk: Chen et al. 2025; pkpo: Walder & Karkhanis 2025) and REINFORCE++, against
numbers worked out by hand, a brute-force enumeration of k-subsets, and the recipe invariants."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algos import ADVANTAGES
from rlvr.algos.advantages import PassKSettings, PKPOSettings, comb_ratio
from rlvr.algos.losses import GSPOSettings, PPOClipSettings
from rlvr.config import AlgorithmConfig, Recipe, RecipeError, RolloutConfig, Spec
from rlvr.recipe import resolve, validate
from rlvr.registry import NoSettings

A1 = torch.tensor([[1.0, 1, 1, 0, 0, 0, 0, 0]])  # N = 8, 3 correct, 5 incorrect


def _passk(k: int) -> PassKSettings:
    return PassKSettings(k=k)


def _pkpo(k: int, baseline: str = "loo_minus_one") -> PKPOSettings:
    return PKPOSettings(k=k, baseline=baseline)


def _pos_neg(adv: torch.Tensor) -> tuple[float, float]:
    assert torch.allclose(adv[0, :3], adv[0, :1].expand(3)) and torch.allclose(adv[0, 3:], adv[0, 3:4].expand(5))
    return adv[0, 0].item(), adv[0, -1].item()


def test_registry_names():
    assert {"reinforce_pp", "reinforce_pp_global", "passk", "pkpo"} <= set(ADVANTAGES.names())


# ---- passk (Chen et al. 2025, analytical advantage) ------------------------------------------------------


@pytest.mark.parametrize(
    "k,pos,neg",
    [
        # k = 2: C(5,2)/C(8,2) = 10/28 = 5/14, so R = 9/14 and std = sqrt(9/14 * 5/14) = sqrt(45)/14.
        #   A_pos = (5/14) / (sqrt(45)/14) = 5/sqrt(45) = 0.745356
        #   C(4,1)/C(7,1) = 4/7 = 8/14: A_neg = (5/14 - 8/14) / (sqrt(45)/14) = -3/sqrt(45) = -0.447214
        (2, 5 / math.sqrt(45), -3 / math.sqrt(45)),
        # k = 4: C(5,4)/C(8,4) = 5/70 = 1/14, R = 13/14, std = sqrt(13)/14, A_pos = 1/sqrt(13) = 0.277350
        #   C(4,3)/C(7,3) = 4/35 = 8/70: A_neg = (5/70 - 8/70) / (sqrt(13)/14) = -0.6/sqrt(13) = -0.166410
        (4, 1 / math.sqrt(13), -0.6 / math.sqrt(13)),
        # k = 1: R = 3/8, std = sqrt(15)/8 (population std): A_pos = 5/sqrt(15), A_neg = -3/sqrt(15)
        (1, 5 / math.sqrt(15), -3 / math.sqrt(15)),
    ],
)
def test_passk_case_a1_by_hand(k, pos, neg):
    adv = ADVANTAGES.get("passk")(A1, _passk(k))
    assert adv.dtype == torch.float32 and adv.shape == (1, 8)
    p, n = _pos_neg(adv)
    assert p == pytest.approx(pos, abs=1e-6) and n == pytest.approx(neg, abs=1e-6)
    assert abs(adv.sum().item()) < 1e-5  # 3 * 5 - 5 * 3 = 0


def test_passk_k1_is_grpo_with_population_std():
    rewards = torch.tensor([[1.0, 0, 0, 1, 1], [0.0, 1, 0, 0, 0]])
    adv = ADVANTAGES.get("passk")(rewards, _passk(1))
    mean = rewards.mean(-1, keepdim=True)
    assert torch.allclose(adv, (rewards - mean) / rewards.std(-1, keepdim=True, correction=0), atol=1e-6)


def test_passk_every_k_subset_passes_is_zero():
    # k = 6 > N_neg = 5: every 6-subset holds a correct sample, R = 1, std = 0 -> no signal, not NaN
    adv = ADVANTAGES.get("passk")(A1, _passk(6))
    assert torch.equal(adv, torch.zeros_like(adv))
    # k = G = 8 with one correct sample: R = 1 as well
    assert torch.equal(ADVANTAGES.get("passk")(torch.tensor([[1.0] + [0.0] * 7]), _passk(8)), torch.zeros(1, 8))


def _subset_mean_and_neg_term(rewards: list[int], k: int) -> tuple[Fraction, Fraction]:
    """R and C(N_neg-1, k-1)/C(N-1, k-1) by enumerating subsets, in exact fractions."""
    n = len(rewards)
    subsets = list(itertools.combinations(range(n), k))
    r_mean = Fraction(sum(max(rewards[i] for i in s) for s in subsets), len(subsets))
    neg = [i for i in range(n) if rewards[i] == 0]
    if not neg:
        return r_mean, Fraction(0)
    i0 = neg[0]  # subsets of size k-1 of the others that are all incorrect
    others = [j for j in range(n) if j != i0]
    sub = list(itertools.combinations(others, k - 1))
    return r_mean, Fraction(sum(all(rewards[j] == 0 for j in s) for s in sub), len(sub))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1]), min_size=1, max_size=9).flatmap(
        lambda r: st.tuples(st.just(r), st.integers(1, len(r)))
    )
)
def test_passk_property_against_enumeration(case):
    rewards, k = case
    adv = ADVANTAGES.get("passk")(torch.tensor([rewards], dtype=torch.float32), _passk(k))[0]
    assert torch.isfinite(adv).all()
    r_mean, neg_term = _subset_mean_and_neg_term(rewards, k)
    std = math.sqrt(float(r_mean * (1 - r_mean)))
    for g, r in enumerate(rewards):
        expected = 0.0 if std == 0 else float(1 - r_mean - (0 if r else neg_term)) / std
        assert adv[g].item() == pytest.approx(expected, abs=1e-5)
    assert abs(adv.sum().item()) < 1e-4


# ---- pkpo (Walder & Karkhanis 2025) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "k,baseline,pos,neg",
    [
        # loo_minus_one, correct: (k/n) C(n-c, k-1)/C(n-1, k-1); incorrect: 0
        (2, "loo_minus_one", 2 / 8 * 5 / 7, 0.0),  # 0.25 * C(5,1)/C(7,1) = 5/28 = 0.178571
        (4, "loo_minus_one", 4 / 8 * 10 / 35, 0.0),  # 0.5 * C(5,3)/C(7,3) = 0.5 * 10/35 = 1/7
        # loo, k = 2: s_pos = 2/8; baseline (2/8) rho(7, 2, 2) = 0.25 * (1 - C(5,2)/C(7,2)) = 0.25 * 11/21
        #   -> A_pos = 0.25 * 10/21 = 5/42 = 0.119048
        #   s_neg = 0.25 * rho(7, 3, 1) = 0.25 * 3/7; baseline 0.25 * rho(7, 3, 2) = 0.25 * (1 - 6/21) = 0.25 * 15/21
        #   -> A_neg = 0.25 * (9/21 - 15/21) = -1/14 = -0.071429
        (2, "loo", 5 / 42, -1 / 14),
        # loo, k = 4: A_pos = 0.5 * C(5,4)/C(7,4) = 0.5 * 5/35 = 1/14
        #   A_neg = 0.5 * (C(4,4)/C(7,4) - C(4,3)/C(7,3)) = 0.5 * (1/35 - 4/35) = -3/70
        (4, "loo", 1 / 14, -3 / 70),
        # loo, k = 1: RLOO / n = (r - mean) / (n - 1): 0.625/7, -0.375/7
        (1, "loo", 0.625 / 7, -0.375 / 7),
    ],
)
def test_pkpo_case_a1_by_hand(k, baseline, pos, neg):
    adv = ADVANTAGES.get("pkpo")(A1, _pkpo(k, baseline))
    p, n = _pos_neg(adv)
    assert p == pytest.approx(pos, abs=1e-6) and n == pytest.approx(neg, abs=1e-6)
    if baseline == "loo":
        assert abs(adv.sum().item()) < 1e-6


def test_pkpo_loo_matches_passk_direction():
    # both papers' estimators of grad pass@k are the same up to a positive per-group scale (case A1: 5 : -3)
    for k in (2, 3, 4, 5):
        a = ADVANTAGES.get("pkpo")(A1, _pkpo(k, "loo"))[0]
        b = ADVANTAGES.get("passk")(A1, _passk(k))[0]
        assert torch.allclose(a / a[0], b / b[0], atol=1e-5)


def test_pkpo_k_equals_g():
    # k = n = 4, loo_minus_one: a sole correct sample gets (4/4) C(3,3)/C(3,3) = 1; two correct get 0 each
    sole = torch.tensor([[0.0, 1, 0, 0]])
    assert torch.allclose(ADVANTAGES.get("pkpo")(sole, _pkpo(4)), sole)
    assert torch.equal(ADVANTAGES.get("pkpo")(torch.tensor([[1.0, 1, 0, 0]]), _pkpo(4)), torch.zeros(1, 4))


def _brute_loo_minus_one(rewards: list[int], k: int) -> list[float]:
    """(1/C(n,k)) sum over k-subsets I containing i of [max_I r - max_{I minus i} r] (PKPO's s^(loo-1))."""
    n = len(rewards)
    subsets = list(itertools.combinations(range(n), k))
    out = []
    for i in range(n):
        total = sum(max(rewards[j] for j in s) - max(rewards[j] for j in s if j != i) for s in subsets if i in s)
        out.append(total / len(subsets))
    return out


def _brute_loo(rewards: list[int], k: int) -> list[float]:
    """s_i - (k/n) * (mean over k-subsets of the other n-1 samples of their max)."""
    n = len(rewards)
    subsets = list(itertools.combinations(range(n), k))
    out = []
    for i in range(n):
        s_i = sum(max(rewards[j] for j in s) for s in subsets if i in s) / len(subsets)
        other = list(itertools.combinations([j for j in range(n) if j != i], k))
        rho = sum(max(rewards[j] for j in s) for s in other) / len(other)
        out.append(s_i - k / n * rho)
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0, 1]), min_size=2, max_size=8), st.data())
def test_pkpo_property_against_enumeration(rewards, data):
    n = len(rewards)
    r = torch.tensor([rewards], dtype=torch.float32)
    k = data.draw(st.integers(2, n))
    adv = ADVANTAGES.get("pkpo")(r, _pkpo(k))[0]
    assert torch.allclose(adv, torch.tensor(_brute_loo_minus_one(rewards, k)), atol=1e-6)
    assert (adv >= 0).all()  # not zero-sum: incorrect samples get exactly 0
    k = data.draw(st.integers(1, n - 1))
    adv = ADVANTAGES.get("pkpo")(r, _pkpo(k, "loo"))[0]
    assert torch.allclose(adv, torch.tensor(_brute_loo(rewards, k)), atol=1e-6)
    assert abs(adv.sum().item()) < 1e-6


# ---- shared edge cases -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,cfg",
    [("passk", _passk(2)), ("pkpo", _pkpo(2)), ("pkpo", _pkpo(2, "loo")), ("reinforce_pp", NoSettings())],
)
def test_equal_rewards_exactly_zero(name, cfg):
    rewards = torch.tensor([[1.0, 1, 1, 1], [0.0, 0, 0, 0]])
    assert torch.equal(ADVANTAGES.get(name)(rewards, cfg), torch.zeros(2, 4))


def test_g1():
    one = torch.tensor([[1.0], [0.0]])
    assert torch.equal(ADVANTAGES.get("passk")(one, _passk(1)), torch.zeros(2, 1))
    assert torch.equal(ADVANTAGES.get("reinforce_pp")(one, NoSettings()), torch.zeros(2, 1))
    # the batch baseline still separates them: mean 0.5, unbiased std 0.7071
    glob = ADVANTAGES.get("reinforce_pp_global")(one, NoSettings())
    assert torch.allclose(glob, torch.tensor([[0.7071], [-0.7071]]), atol=1e-4)
    with pytest.raises(ValueError):
        ADVANTAGES.get("pkpo")(one, _pkpo(1, "loo"))  # k <= G - 1 = 0 impossible


@pytest.mark.parametrize(
    "name,cfg",
    [("passk", _passk(9)), ("passk", _passk(0)), ("pkpo", _pkpo(9)), ("pkpo", _pkpo(1)), ("pkpo", _pkpo(8, "loo"))],
)
def test_k_out_of_range_raises(name, cfg):
    with pytest.raises(ValueError, match="algorithm.advantage.k"):
        ADVANTAGES.get(name)(A1, cfg)


@pytest.mark.parametrize("name", ["passk", "pkpo"])
def test_non_binary_rewards_raise(name):
    with pytest.raises(ValueError, match="binary"):
        ADVANTAGES.get(name)(torch.tensor([[1.0, 0.5, 0.0]]), _passk(2) if name == "passk" else _pkpo(2))


def test_comb_ratio_products():
    # C(5,2)/C(8,2) = 10/28; C(3,4) = 0; k = 0 -> 1; C(40,20)/C(60,20) without overflow
    a = torch.tensor([5.0, 3.0])
    assert torch.allclose(comb_ratio(a, 8, 2), torch.tensor([10 / 28, 3 / 28], dtype=torch.float64))
    assert comb_ratio(torch.tensor([3.0]), 8, 4).item() == 0.0
    assert comb_ratio(torch.tensor([3.0]), 8, 0).item() == 1.0
    exact = Fraction(math.comb(400, 200), math.comb(600, 200))
    assert comb_ratio(torch.tensor([400.0]), 600, 200).item() == pytest.approx(float(exact), rel=1e-9)


# ---- REINFORCE++ -----------------------------------------------------------------------------------------


def test_reinforce_pp_batch_std_not_group_std():
    # group 1 = A1 (centred: +0.625 x3, -0.375 x5), group 2 all 1 (centred: 0 x8).
    # batch of 16: sum of squares 3 * 0.390625 + 5 * 0.140625 = 1.875, unbiased var 1.875 / 15 = 0.125
    # -> +0.625 / 0.353553 = +1.767767, -0.375 / 0.353553 = -1.060660 (GRPO alone would give 1.2076 / -0.7246)
    rewards = torch.cat([A1, torch.ones(1, 8)])
    adv = ADVANTAGES.get("reinforce_pp")(rewards, NoSettings())
    assert adv[0, 0].item() == pytest.approx(0.625 / math.sqrt(0.125), abs=1e-5)
    assert adv[0, 7].item() == pytest.approx(-0.375 / math.sqrt(0.125), abs=1e-5)
    assert torch.equal(adv[1], torch.zeros(8))


def test_reinforce_pp_global_by_hand():
    # rewards 1, 0, 0, 1, 1, 1: mean 2/3, unbiased std sqrt((4 * 1/9 + 2 * 4/9) / 5) = sqrt(12/45) = 0.516398
    adv = ADVANTAGES.get("reinforce_pp_global")(torch.tensor([[1.0, 0], [0.0, 1], [1.0, 1]]), NoSettings())
    s = math.sqrt(12 / 45)
    assert torch.allclose(adv, torch.tensor([[1 / 3, -2 / 3], [-2 / 3, 1 / 3], [1 / 3, 1 / 3]]) / s, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(-10, 10), min_size=3, max_size=3), min_size=1, max_size=6))
def test_reinforce_pp_property(rows):
    rewards = torch.tensor(rows, dtype=torch.float32)
    adv = ADVANTAGES.get("reinforce_pp")(rewards, NoSettings())
    assert torch.isfinite(adv).all()
    assert torch.allclose(adv.sum(-1), torch.zeros(len(rows)), atol=1e-3)
    centred = rewards - rewards.mean(-1, keepdim=True)
    if centred.reshape(-1).std(correction=1) > 1e-2:  # unit (unbiased) batch std, up to STD_EPS
        assert adv.reshape(-1).std(correction=1).item() == pytest.approx(1.0, abs=1e-3)


# ---- recipe invariants -----------------------------------------------------------------------------------


def _recipe(g: int, **algo) -> Recipe:
    """A recipe with G = g, resolved as load_recipe does (each Spec's settings to its dataclass)."""
    return resolve(Recipe(rollout=RolloutConfig(samples_per_prompt=g), algorithm=AlgorithmConfig(**algo)))


@pytest.mark.parametrize(
    "g,algo,fragment",
    [
        (4, dict(advantage=Spec("passk", _passk(5))),
         "algorithm.advantage.k=5 must be in [1, rollout.samples_per_prompt=4]"),
        (4, dict(advantage=Spec("pkpo", _pkpo(1))), "k = 1 has no baseline; use baseline=loo"),
        (4, dict(advantage=Spec("pkpo", _pkpo(4, "loo"))), "needs 1 <= k <= samples_per_prompt - 1 (3)"),
        (4, dict(policy_loss=Spec("ppo_clip", PPOClipSettings(dual_clip_c=0.5))),
         "algorithm.policy_loss.dual_clip_c=0.5 must be 0 (off) or > 1"),
        (4, dict(tis_cap=0.5), "algorithm.tis_cap=0.5 must be 0 (off) or >= 1"),
        (4, dict(tis_cap=1.0, rollout_correction="decoupled"),
         "algorithm.tis_cap=1.0 with rollout_correction=decoupled must be 0 (no cap) or > 1"),
        (4, dict(policy_loss=Spec("gspo", GSPOSettings(clip_low=-1.0))),
         "algorithm.policy_loss.clip_low and algorithm.policy_loss.clip_high must be >= 0"),
        (1, dict(advantage=Spec("passk", _passk(1))), "compares samples within a group"),
    ],
)
def test_validate_rejects(g, algo, fragment):
    with pytest.raises(RecipeError) as ei:
        validate(_recipe(g, **algo))
    assert fragment in str(ei.value)


def test_validate_accepts_defaults_and_k_equals_g():
    validate(_recipe(4))
    validate(_recipe(4, advantage=Spec("passk", _passk(4))))
    validate(_recipe(4, advantage=Spec("pkpo", _pkpo(4))))
    validate(_recipe(4, advantage=Spec("pkpo", _pkpo(1, "loo"))))
    # dual_clip_c is a ppo_clip setting now; gspo has none
    validate(_recipe(4, policy_loss=Spec("ppo_clip", PPOClipSettings(dual_clip_c=3.0)), tis_cap=2.0))
    validate(_recipe(4, policy_loss=Spec("gspo"), tis_cap=2.0))
