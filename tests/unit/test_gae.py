"""GAE, token rewards, whitening and the clipped value loss against values worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algos.gae import CRITIC_ADVANTAGES, GAESettings, gae_advantages, outcome_token_rewards, value_loss, whiten
from rlvr.config import RecipeError
from rlvr.recipe import load_recipe


def test_outcome_reward_sits_on_the_last_response_token():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    out = outcome_token_rewards(torch.tensor([1.0, 2.0, 5.0]), mask)
    assert out.tolist() == [[0, 0, 1, 0], [0, 0, 0, 2], [0, 0, 0, 0]]  # an empty response gets nothing


def _one(vals, rews, gamma, lam, pad_left=0, pad_right=0):
    t = len(vals)
    mask = torch.tensor([[0.0] * pad_left + [1.0] * t + [0.0] * pad_right])
    v = torch.tensor([[9.0] * pad_left + vals + [7.0] * pad_right])  # junk outside the mask must be ignored
    r = torch.tensor([[3.0] * pad_left + rews + [4.0] * pad_right])
    a, ret = gae_advantages(r, v, mask, gamma, lam)
    sl = slice(pad_left, pad_left + t)
    return a[0, sl].tolist(), ret[0, sl].tolist(), a, ret, mask


@pytest.mark.parametrize(
    "gamma,lam,adv,ret",
    [
        # gamma = lam = 1: A_t = sum of rewards to go - V_t = 1 - V_t; returns = 1
        (1.0, 1.0, [0.5, 0.4, 0.2], [1.0, 1.0, 1.0]),
        # deltas 0.1, 0.2, 0.2 (V_next - V_t, last: 1 - 0.8); A2 = 0.2, A1 = 0.2 + 0.5*0.2, A0 = 0.1 + 0.5*0.3
        (1.0, 0.5, [0.25, 0.3, 0.2], [0.75, 0.9, 1.0]),
        # lam = 1: A_t = gamma^(2-t) * 1 - V_t: 0.81 - 0.5, 0.9 - 0.6, 1 - 0.8
        (0.9, 1.0, [0.31, 0.3, 0.2], [0.81, 0.9, 1.0]),
        # lam = 0: one-step TD errors
        (1.0, 0.0, [0.1, 0.2, 0.2], [0.6, 0.8, 1.0]),
    ],
)
def test_gae_by_hand(gamma, lam, adv, ret):
    for pads in ((0, 0), (2, 3)):  # a prompt before and padding after do not change anything
        a, r, a_full, r_full, mask = _one([0.5, 0.6, 0.8], [0.0, 0.0, 1.0], gamma, lam, *pads)
        assert a == pytest.approx(adv, abs=1e-6)
        assert r == pytest.approx(ret, abs=1e-6)
        assert float((a_full * (1 - mask)).abs().sum()) == 0.0 and float((r_full * (1 - mask)).abs().sum()) == 0.0


def test_whiten_by_hand_and_constant_batch():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 2.0, 100.0], [3.0, -50.0, 0.0]])
    w = whiten(adv, mask)
    s = (2.0 / 3.0) ** 0.5  # population std of 1, 2, 3
    assert w.flatten().tolist() == pytest.approx([-1 / s, 0.0, 0.0, 1 / s, 0.0, 0.0], abs=1e-5)
    assert whiten(torch.full((2, 3), 4.0), mask).abs().max() == 0.0


def test_value_loss_clipped_by_hand():
    mask = torch.ones(1, 2)
    v = torch.tensor([[1.5, 0.9]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0]])
    ret = torch.tensor([[2.0, 0.0]])
    loss, st_ = value_loss(v, old, ret, mask, 0.2)
    # token 0: plain (1.5-2)^2 = 0.25, clipped V = 1.2 -> 0.64: the max is 0.64, loss 0.32, clipped
    # token 1: V - V_old = -0.1 is inside the clip: 0.5 * 0.81
    assert loss.tolist()[0] == pytest.approx([0.32, 0.405])
    assert st_["value_clip_frac"].tolist() == [[1.0, 0.0]]
    loss.sum().backward()
    assert v.grad.tolist()[0] == pytest.approx([0.0, 0.9])  # the clipped branch carries no gradient to V
    plain, _ = value_loss(v.detach(), old, ret, mask, 0.0)
    assert plain.tolist()[0] == pytest.approx([0.125, 0.405])


def test_gae_registry_entry_whitens_and_keeps_returns():
    cfg = GAESettings(gamma=1.0, lam=1.0, whiten=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.6, 0.8, 0.0]])
    adv, ret = CRITIC_ADVANTAGES.get("gae")(r, v, mask, cfg)
    assert ret[0, :3].tolist() == pytest.approx([1.0, 1.0, 1.0])
    raw = torch.tensor([0.5, 0.4, 0.2])
    expect = (raw - raw.mean()) / raw.std(unbiased=False)
    assert adv[0, :3].tolist() == pytest.approx(expect.tolist(), abs=1e-5)
    off = dataclasses.replace(cfg, whiten=False)
    assert CRITIC_ADVANTAGES.get("gae")(r, v, mask, off)[0][0, :3].tolist() == pytest.approx(raw.tolist())


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.floats(-1e3, 1e3)), min_size=1, max_size=5),
    gamma=st.floats(0, 1), lam=st.floats(0, 1),
)
def test_gae_finite_and_zero_values_give_discounted_rewards(rows, gamma, lam):
    t = 10
    mask = torch.zeros(len(rows), t)
    rewards = torch.zeros(len(rows))
    for i, (start, n, rew) in enumerate(rows):
        mask[i, start : start + n] = 1.0
        rewards[i] = rew
    tok = outcome_token_rewards(rewards, mask)
    adv, ret = gae_advantages(tok, torch.zeros_like(mask), mask, gamma, lam)
    assert bool(torch.isfinite(adv).all()) and bool(torch.isfinite(ret).all())
    for i, (start, n, rew) in enumerate(rows):
        for j in range(n):  # V = 0: delta_t = r_t, so A_t = R_t = (gamma * lam)^(steps to the end) * reward
            expect = rew * (gamma * lam) ** (n - 1 - j)
            assert float(adv[i, start + j]) == pytest.approx(expect, rel=1e-4, abs=1e-4)
    assert bool(torch.isfinite(whiten(adv, mask)).all())


def test_recipe_checks_for_critic_settings():
    with pytest.raises(RecipeError, match="policy_loss=gspo needs one advantage per sequence"):
        load_recipe(None, ["algorithm.advantage=gae", "algorithm.policy_loss=gspo"])
    with pytest.raises(RecipeError, match="did you mean 'gae'"):
        load_recipe(None, ["algorithm.advantage=gea"])
    with pytest.raises(RecipeError, match="dph_coef > 0"):
        load_recipe(None, ["algorithm.dph_divergence=js"])
    r = load_recipe(None, ["algorithm.advantage=gae", "rollout.samples_per_prompt=1"])
    assert r.algorithm.advantage.name == "gae"  # a critic needs no group
