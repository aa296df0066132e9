"""Policy loss (PPO clip, case A6) and loss aggregations (case A4, micro-batch invariance)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algos import LOSS_AGGREGATIONS, POLICY_LOSSES, masked_mean
from rlvr.config import AlgorithmConfig

AGGS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
CFG = AlgorithmConfig(clip_low=0.2, clip_high=0.2)


def test_registry_names():
    assert "ppo_clip" in POLICY_LOSSES
    assert set(AGGS) <= set(LOSS_AGGREGATIONS.names())


# ---- PPO clip -------------------------------------------------------------------------------------------


def _ppo(ratios, advs, cfg=CFG, mask=None):
    logprobs = torch.tensor(ratios, dtype=torch.float32).log()
    old = torch.zeros_like(logprobs)
    mask = torch.ones_like(logprobs) if mask is None else mask
    return POLICY_LOSSES.get("ppo_clip")(logprobs, old, torch.tensor(advs), mask, cfg)


def test_case_a6_clip_fraction_counts_only_active_clipping():
    # one token per sequence: (ratio, advantage) = (0.7,+1), (1.3,+1), (1.3,-1), (0.7,-1)
    loss, stats = _ppo([[0.7], [1.3], [1.3], [0.7]], [1.0, 1.0, -1.0, -1.0])
    mask = torch.ones(4, 1)
    assert masked_mean(stats["clipped"], mask).item() == pytest.approx(0.5)
    assert stats["clipped"].flatten().tolist() == [0.0, 1.0, 0.0, 1.0]
    assert stats["clipped_high"].flatten().tolist() == [0.0, 1.0, 0.0, 0.0]
    assert stats["clipped_low"].flatten().tolist() == [0.0, 0.0, 0.0, 1.0]
    # -min(r A, clip(r) A): -0.7, -1.2, 1.3, 0.8
    assert torch.allclose(loss.flatten(), torch.tensor([-0.7, -1.2, 1.3, 0.8]), atol=1e-6)


def test_ppo_gradient_zero_where_clipped():
    logprobs = torch.tensor([[0.7], [1.3], [1.3], [0.7]]).log().requires_grad_(True)
    loss, _ = POLICY_LOSSES.get("ppo_clip")(
        logprobs, torch.zeros(4, 1), torch.tensor([1.0, 1.0, -1.0, -1.0]), torch.ones(4, 1), CFG
    )
    loss.sum().backward()
    # d/dlogp of -r A = -r A where unclipped; 0 where clipped
    assert torch.allclose(logprobs.grad.flatten(), torch.tensor([-0.7, 0.0, 1.3, 0.0]), atol=1e-6)


def test_ppo_asymmetric_clip():
    cfg = AlgorithmConfig(clip_low=0.2, clip_high=0.28)  # DAPO clip-higher
    loss, stats = _ppo([[1.25], [1.3], [0.75]], [1.0, 1.0, -1.0], cfg)
    assert stats["clipped"].flatten().tolist() == [0.0, 1.0, 1.0]
    assert torch.allclose(loss.flatten(), torch.tensor([-1.25, -1.28, 0.8]), atol=1e-6)


def test_ppo_mask_and_per_token_advantage_broadcast():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = _ppo([[1.0, 1.1, 5.0]], [2.0], mask=mask)
    assert torch.allclose(loss, torch.tensor([[-2.0, -2.2, 0.0]]), atol=1e-6)
    assert stats["clipped"][0, 2].item() == 0.0  # masked token never counted
    assert torch.allclose(stats["ratio"], torch.tensor([[1.0, 1.1, 0.0]]), atol=1e-6)


def test_ppo_extreme_log_ratio_is_finite():
    logprobs = torch.tensor([[-0.01, -100.0]], requires_grad=True)
    old = torch.tensor([[-100.0, -0.01]])
    loss, stats = POLICY_LOSSES.get("ppo_clip")(logprobs, old, torch.tensor([-1.0]), torch.ones(1, 2), CFG)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logprobs.grad).all()
    assert all(torch.isfinite(v).all() for v in stats.values())


def test_ppo_approx_kl_by_hand():
    _, stats = _ppo([[1.1]], [1.0])
    # k3 with r = 1.1: 0.1 - log(1.1)
    assert stats["approx_kl"].item() == pytest.approx(0.1 - math.log(1.1), abs=1e-6)


def test_ppo_bad_shapes():
    with pytest.raises(ValueError):
        POLICY_LOSSES.get("ppo_clip")(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3), CFG)


# ---- aggregations ---------------------------------------------------------------------------------------


def _a4():
    mask = torch.zeros(2, 8)
    mask[0, :2] = 1
    mask[1, :8] = 1
    return -torch.ones(2, 8), mask


@pytest.mark.parametrize(
    "name,expected,weights",
    [
        ("seq_mean_token_mean", -1.0, (1 / 4, 1 / 16)),
        ("token_mean", -1.0, (1 / 10, 1 / 10)),
        ("seq_mean_token_sum_norm", -0.3125, (1 / 32, 1 / 32)),
        ("seq_mean_token_sum", -5.0, (1 / 2, 1 / 2)),
    ],
)
def test_case_a4(name, expected, weights):
    token_loss, mask = _a4()
    token_loss.requires_grad_(True)
    out = LOSS_AGGREGATIONS.get(name)(token_loss, mask, num_tokens=10, num_seqs=2, max_len=16)
    assert out.item() == pytest.approx(expected)
    out.backward()
    # per-token weight of each sequence, 0 on padding
    assert torch.allclose(token_loss.grad[0, :2], torch.full((2,), weights[0]))
    assert torch.allclose(token_loss.grad[1], torch.full((8,), weights[1]))
    assert torch.equal(token_loss.grad[0, 2:], torch.zeros(6))


def test_padding_nan_does_not_leak():
    token_loss, mask = _a4()
    token_loss[0, 5] = float("nan")
    for name in AGGS:
        out = LOSS_AGGREGATIONS.get(name)(token_loss, mask, num_tokens=10, num_seqs=2, max_len=16)
        assert math.isfinite(out.item())


def test_sum_norm_rejects_short_max_len():
    token_loss, mask = _a4()
    with pytest.raises(ValueError):
        LOSS_AGGREGATIONS.get("seq_mean_token_sum_norm")(token_loss, mask, num_tokens=10, num_seqs=2, max_len=4)


def test_negative_count_rejected_and_zero_is_zero_loss():
    with pytest.raises(ValueError):
        LOSS_AGGREGATIONS.get("token_mean")(torch.ones(1, 2), torch.ones(1, 2), num_tokens=-1, num_seqs=1, max_len=2)
    out = LOSS_AGGREGATIONS.get("token_mean")(torch.ones(1, 2), torch.zeros(1, 2), num_tokens=0, num_seqs=1, max_len=2)
    assert out.item() == 0.0


def _reference(name, loss, mask, max_len):
    """Whole-batch loss written directly from each mode's definition, in float64."""
    loss, mask = loss.double(), mask.double()
    lens = mask.sum(-1)
    if name == "token_mean":
        return (loss * mask).sum() / mask.sum()
    if name == "seq_mean_token_mean":
        return torch.stack([(l * m).sum() / n for l, m, n in zip(loss, mask, lens) if n > 0]).sum() / len(loss)
    if name == "seq_mean_token_sum":
        return (loss * mask).sum() / len(loss)
    return (loss * mask).sum() / (len(loss) * max_len)


batch_st = st.integers(1, 8).flatmap(
    lambda b: st.tuples(
        st.lists(st.integers(1, 6), min_size=b, max_size=b),  # response lengths
        st.lists(st.integers(1, b), min_size=1, max_size=4),  # micro-batch sizes (cycled)
        st.integers(0, 2**31 - 1),  # seed for token losses
    )
)


@settings(max_examples=60, deadline=None)
@given(batch=batch_st, name=st.sampled_from(AGGS))
def test_property_micro_batch_invariance(batch, name):
    lengths, sizes, seed = batch
    b, t, max_len = len(lengths), max(lengths), 8
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(b, t, generator=gen) * 3
    mask = (torch.arange(t)[None] < torch.tensor(lengths)[:, None]).float()
    counts = dict(num_tokens=float(mask.sum()), num_seqs=float(b), max_len=max_len)
    agg = LOSS_AGGREGATIONS.get(name)
    whole = agg(loss, mask, **counts)
    parts, start, i = [], 0, 0
    while start < b:
        size = sizes[i % len(sizes)]
        mb_len = max(lengths[start : start + size])  # each micro-batch padded to its own length
        parts.append(agg(loss[start : start + size, :mb_len], mask[start : start + size, :mb_len], **counts))
        start, i = start + size, i + 1
    assert torch.stack(parts).sum().item() == pytest.approx(whole.item(), rel=1e-5, abs=1e-5)
    assert whole.item() == pytest.approx(_reference(name, loss, mask, max_len).item(), rel=1e-5, abs=1e-5)
