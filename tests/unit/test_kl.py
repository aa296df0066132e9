"""KL estimators against case A5 and Schulman (2020)'s definitions, with log r = ref - logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algos import KL_ESTIMATORS
from rlvr.algos.kl import dph_forward_kl, dph_js, entropy_bonus, kl_as_reward


def test_registry_names():
    assert {"k1", "k2", "k3"} <= set(KL_ESTIMATORS.names())


def test_case_a5_k3_of_log_ratio_0_1():
    lp = torch.tensor([[-1.0, -2.5]])
    kl = KL_ESTIMATORS.get("k3")(lp, lp + 0.1)  # log r = ref - logprobs = 0.1
    assert torch.allclose(kl, torch.full((1, 2), 0.005171), atol=2e-6)
    # the other direction is a different number: e^-0.1 - 1 + 0.1
    kl_rev = KL_ESTIMATORS.get("k3")(lp + 0.1, lp)
    assert torch.allclose(kl_rev, torch.full((1, 2), 0.0048374), atol=2e-6)


def test_k1_k2_by_hand():
    lp, ref = torch.tensor([[-1.0, -3.0]]), torch.tensor([[-1.5, -1.0]])
    assert torch.allclose(KL_ESTIMATORS.get("k1")(lp, ref), torch.tensor([[0.5, -2.0]]))
    assert torch.allclose(KL_ESTIMATORS.get("k2")(lp, ref), torch.tensor([[0.125, 2.0]]))


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
@pytest.mark.parametrize("lp_val,ref_val", [(-100.0, -0.01), (-0.01, -100.0)])
def test_case_a5_extreme_finite_loss_and_grad(name, lp_val, ref_val):
    lp = torch.tensor([[lp_val, -1.0]], requires_grad=True)
    ref = torch.tensor([[ref_val, -1.0]])
    loss = KL_ESTIMATORS.get(name)(lp, ref).sum()
    loss.backward()
    assert math.isfinite(loss.item())
    assert torch.isfinite(lp.grad).all()


def test_k3_clamps_before_exp():
    lp, ref = torch.tensor([[-100.0]]), torch.tensor([[-0.01]])
    # log r = 99.99 clamped to 20: e^20 - 1 - 20
    assert KL_ESTIMATORS.get("k3")(lp, ref).item() == pytest.approx(math.exp(20) - 21, rel=1e-5)


def test_shape_mismatch():
    with pytest.raises(ValueError):
        KL_ESTIMATORS.get("k3")(torch.zeros(2, 3), torch.zeros(2, 4))


def test_k3_unbiased_against_exact_kl():
    # two categoricals: E_{x~p}[k3] = KL(p || q) (Schulman 2020)
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    exact = (p * (p / q).log()).sum()
    k3 = KL_ESTIMATORS.get("k3")(p.log()[None], q.log()[None])[0]
    k1 = KL_ESTIMATORS.get("k1")(p.log()[None], q.log()[None])[0]
    assert (p * k3).sum().item() == pytest.approx(exact.item(), rel=1e-5)
    assert (p * k1).sum().item() == pytest.approx(exact.item(), rel=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e4, 0.0), min_size=1, max_size=8).flatmap(
        lambda a: st.tuples(st.just(a), st.lists(st.floats(-1e4, 0.0), min_size=len(a), max_size=len(a)))
    )
)
def test_property_nonnegative_finite(pair):
    lp, ref = (torch.tensor([x]) for x in pair)
    for name in ("k2", "k3"):
        kl = KL_ESTIMATORS.get(name)(lp, ref)
        assert torch.isfinite(kl).all() and (kl >= 0).all()


# ---- KL as a reward, DPH-RL divergences, entropy bonus -------------------------------------------------


def test_kl_as_reward_reward_to_go_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.5, -1.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = kl_as_reward(lp, ref, mask, beta=0.1)
    # k1 = lp - ref = 0.5, -0.5, (-1.5 masked); -beta k1 = -0.05, +0.05, 0; reward-to-go: 0.0, 0.05, 0
    assert torch.allclose(out, torch.tensor([[0.0, 0.05, 0.0]]), atol=1e-7)
    assert not out.requires_grad
    with pytest.raises(ValueError):
        kl_as_reward(lp, ref, mask, beta=-1.0)


def _categoricals():
    p = torch.tensor([0.5, 0.3, 0.2])  # the policy
    q = torch.tensor([0.2, 0.5, 0.3])  # the reference, which drew the samples
    return p, q


def test_dph_forward_kl_exact_under_reference_samples():
    p, q = _categoricals()
    per_token = dph_forward_kl(p.log()[None], q.log()[None])[0]
    exact = (q * (q / p).log()).sum()  # KL(q || p): mass-covering
    assert (q * per_token).sum().item() == pytest.approx(exact.item(), rel=1e-6)
    # and not the reverse KL(p || q)
    assert (q * per_token).sum().item() != pytest.approx((p * (p / q).log()).sum().item(), rel=1e-2)
    lp = p.log()[None].clone().requires_grad_(True)
    dph_forward_kl(lp, q.log()[None]).sum().backward()
    assert torch.allclose(lp.grad, -torch.ones(1, 3))  # likelihood training on the reference's samples


def test_dph_js_exact_under_reference_samples():
    p, q = _categoricals()
    per_token = dph_js(p.log()[None], q.log()[None])[0]
    m = (p + q) / 2
    exact = 0.5 * (p * (p / m).log()).sum() + 0.5 * (q * (q / m).log()).sum()
    # the generator without the 1/2 (f-GAN's table, the DPH-RL authors' code): twice the exact JS
    assert (q * per_token).sum().item() == pytest.approx(2 * exact.item(), rel=1e-6)
    assert torch.allclose(dph_js(q.log()[None], q.log()[None]), torch.zeros(1, 3), atol=1e-7)


@pytest.mark.parametrize("lp_val,ref_val", [(-100.0, -0.01), (-0.01, -100.0)])
def test_dph_js_extreme_finite_and_bounded(lp_val, ref_val):
    lp = torch.tensor([[lp_val]], requires_grad=True)
    js = dph_js(lp, torch.tensor([[ref_val]]))
    js.sum().backward()
    assert torch.isfinite(js).all() and torch.isfinite(lp.grad).all()
    # log u = lp - ref is clamped to +-20 first: f(e^-20) ~ log 2; f(e^20) = 20 u - (1 + u) log((1 + u) / 2)
    u = math.exp(20.0 if lp_val > ref_val else -20.0)
    expected = u * math.log(u) - (1 + u) * math.log((1 + u) / 2)
    assert js.item() == pytest.approx(expected, rel=1e-5)


def test_entropy_bonus():
    out = entropy_bonus(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 0.0]]), coef=0.01)
    assert torch.allclose(out, torch.tensor([[-0.01, 0.0]]))
    with pytest.raises(ValueError):
        entropy_bonus(torch.ones(1, 2), torch.ones(1, 3), coef=0.01)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-50, 0.0), min_size=1, max_size=8).flatmap(
    lambda a: st.tuples(st.just(a), st.lists(st.floats(-50, 0.0), min_size=len(a), max_size=len(a)))
))
def test_property_js_nonnegative(pair):
    lp, ref = (torch.tensor([x], dtype=torch.float64) for x in pair)
    js = dph_js(lp, ref)
    assert torch.isfinite(js).all() and (js >= -1e-12).all()
