"""Policy loss (PPO clip, case A6) and loss aggregations (case A4, micro-batch invariance)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algos import LOSS_AGGREGATIONS, POLICY_LOSSES, masked_mean
from rlvr.algos.losses import CISPOSettings, GSPOSettings, PPOClipSettings

AGGS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
CFG = PPOClipSettings(clip_low=0.2, clip_high=0.2)
GSPO = GSPOSettings()  # clip 3e-4 / 4e-4
CISPO = CISPOSettings()  # weight clip [1 - 1.0, 1 + 4.0]
DEFAULTS = {"ppo_clip": PPOClipSettings(), "gspo": GSPO, "cispo": CISPO}


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
    cfg = PPOClipSettings(clip_low=0.2, clip_high=0.28)  # DAPO clip-higher
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


def test_sum_norm_counts_response_positions_not_the_prompt_offset():
    """Issue 9 item 1: the trainer passes the shifted full sequence (prompt + response). A 40-token prompt with a
    30-token response is T = 69 wide, but the response budget (max_len 64) bounds the 30 response positions only.
    Every response token's loss is -1, so the loss is -30 / (1 x 64) = -0.46875 (Liu et al. 2025, eq. 3)."""
    t, prompt, resp = 69, 40, 30
    mask = torch.zeros(1, t)
    mask[0, prompt - 1 : prompt - 1 + resp] = 1.0
    token_loss = -mask.clone()
    out = LOSS_AGGREGATIONS.get("seq_mean_token_sum_norm")(token_loss, mask, num_tokens=30, num_seqs=1, max_len=64)
    assert out.item() == pytest.approx(-30 / 64)
    mask[0, :] = 1.0  # 69 response positions do exceed a 64-token budget
    with pytest.raises(ValueError, match="more than max_len"):
        LOSS_AGGREGATIONS.get("seq_mean_token_sum_norm")(-mask, mask, num_tokens=69, num_seqs=1, max_len=64)


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


# ---- dual clip (Ye et al. 2020) -------------------------------------------------------------------------


def test_dual_clip_by_hand():
    cfg = PPOClipSettings(clip_low=0.2, clip_high=0.2, dual_clip_c=3.0)
    logprobs = torch.tensor([[4.0], [2.0], [0.5], [4.0]]).log().requires_grad_(True)
    advs = torch.tensor([-1.0, -1.0, -1.0, 1.0])
    loss, stats = POLICY_LOSSES.get("ppo_clip")(logprobs, torch.zeros(4, 1), advs, torch.ones(4, 1), cfg)
    # PPO alone: max(-rA, -clip(r)A) = 4, 2, 0.8, -1.2; the dual bound -cA = 3 caps the first (A < 0, r > c)
    assert torch.allclose(loss.flatten(), torch.tensor([3.0, 2.0, 0.8, -1.2]), atol=1e-6)
    assert stats["clipped_dual"].flatten().tolist() == [1.0, 0.0, 0.0, 0.0]
    assert stats["clipped"].flatten().tolist() == [1.0, 0.0, 1.0, 1.0]
    assert stats["clipped_low"].flatten().tolist() == [0.0, 0.0, 1.0, 0.0]
    loss.sum().backward()
    # d(-rA)/dlogp = -rA = 2 for the unclipped token; 0 where any clip is active
    assert torch.allclose(logprobs.grad.flatten(), torch.tensor([0.0, 2.0, 0.0, 0.0]), atol=1e-6)
    off, _ = _ppo([[4.0]], [-1.0])
    assert off.item() == pytest.approx(4.0)


# ---- GSPO (Zheng et al. 2025) ---------------------------------------------------------------------------


def test_gspo_sequence_ratio_and_clip_by_hand():
    cfg = GSPOSettings()  # gspo clip 3e-4 / 4e-4
    logprobs = torch.tensor([[0.1, 0.3, 9.0], [0.1, -0.1, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, stats = POLICY_LOSSES.get("gspo")(logprobs, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask, cfg)
    # seq 0: mean log ratio (0.1 + 0.3) / 2 = 0.2 (padding ignored), s = e^0.2 = 1.2214 > 1.0004: loss -1.0004
    # seq 1: mean (0.1 - 0.1 + 0) / 3 = 0, s = 1: loss -(-1) * 1 = 1
    assert torch.allclose(loss, torch.tensor([[-1.0004, -1.0004, 0.0], [1.0, 1.0, 1.0]]), atol=1e-6)
    assert torch.allclose(stats["ratio"], torch.tensor([[math.exp(0.2)] * 2 + [0.0], [1.0] * 3]), atol=1e-6)
    assert stats["clipped"].tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


def test_gspo_gradient_is_sequence_level():
    cfg = GSPOSettings(clip_low=0.9, clip_high=10.0)  # no clipping
    logprobs = torch.tensor([[0.1, 0.3, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = POLICY_LOSSES.get("gspo")(logprobs, torch.zeros(1, 3), torch.tensor([2.0]), mask, cfg)
    agg = LOSS_AGGREGATIONS.get("seq_mean_token_mean")(loss, mask, num_tokens=2, num_seqs=1, max_len=3)
    agg.backward()
    # J = -A s with s = exp(mean log ratio): dJ/dlogp_t = -A s / |y| = -2 e^0.2 / 2 on each response token
    assert agg.item() == pytest.approx(-2 * math.exp(0.2), rel=1e-6)
    assert torch.allclose(logprobs.grad, torch.tensor([[-math.exp(0.2), -math.exp(0.2), 0.0]]), atol=1e-6)


def test_gspo_refuses_token_advantages():
    with pytest.raises(ValueError, match="one advantage per sequence"):
        POLICY_LOSSES.get("gspo")(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), GSPO)


# ---- CISPO (MiniMax-M1) ---------------------------------------------------------------------------------


def test_cispo_by_hand():
    cfg = CISPOSettings(clip_low=1.0, clip_high=4.0)  # weight in [0, 5]
    ratios = torch.tensor([[0.5], [1.0], [3.0], [7.0]])
    logprobs = ratios.log().requires_grad_(True)  # old logprobs 0: logprobs = log ratio
    loss, stats = POLICY_LOSSES.get("cispo")(logprobs, torch.zeros(4, 1), torch.ones(4), torch.ones(4, 1), cfg)
    # -w A log pi with w = 0.5, 1, 3, 5 (7 capped at 5)
    expected = torch.tensor([-0.5 * math.log(0.5), 0.0, -3 * math.log(3.0), -5 * math.log(7.0)])
    assert torch.allclose(loss.flatten(), expected, atol=1e-5)
    assert stats["clipped_high"].flatten().tolist() == [0.0, 0.0, 0.0, 1.0]
    loss.sum().backward()
    # the weight is detached: d/dlogp = -w A, and the capped token still has a gradient (PPO would give 0)
    assert torch.allclose(logprobs.grad.flatten(), torch.tensor([-0.5, -1.0, -3.0, -5.0]), atol=1e-6)


def test_cispo_padding_minus_inf_is_harmless():
    logprobs = torch.tensor([[-0.5, float("-inf")]], requires_grad=True)
    old, mask = torch.tensor([[-0.5, -1.0]]), torch.tensor([[1.0, 0.0]])
    loss, _ = POLICY_LOSSES.get("cispo")(logprobs, old, torch.tensor([1.0]), mask, CISPO)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logprobs.grad).all()
    assert loss[0, 1].item() == 0.0 and logprobs.grad[0, 1].item() == 0.0


# ---- truncated importance sampling (rollout engine vs trainer) ------------------------------------------


@pytest.mark.parametrize("name", ["ppo_clip", "cispo"])
def test_tis_weight_and_mismatch_stats_by_hand(name):
    cfg = DEFAULTS[name]
    old = torch.full((1, 4), -1.0)
    rollout = torch.tensor([[-1.0, -1.5, -3.0, -50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token's huge gap is padding
    logprobs = old.clone().requires_grad_(True)  # ratio 1
    loss, stats = POLICY_LOSSES.get(name)(
        logprobs, old, torch.tensor([1.0]), mask, cfg, rollout_logprobs=rollout, tis_cap=2.0
    )
    w = torch.tensor([1.0, math.exp(0.5), 2.0, 0.0])  # min(exp(old - rollout), 2): e^0, e^0.5, e^2 -> 2
    assert torch.allclose(stats["tis_weight"][0], w, atol=1e-6)
    assert stats["tis_capped"][0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert torch.allclose(stats["rollout_gap_abs"][0], torch.tensor([0.0, 0.5, 2.0, 0.0]))
    assert stats["rollout_gap_abs_max"].dim() == 0 and stats["rollout_gap_abs_max"].item() == pytest.approx(2.0)
    # k3 of KL(pi_rollout || pi_old), log r = old - rollout: e^0.5 - 1 - 0.5, e^2 - 1 - 2
    k3 = torch.tensor([0.0, math.exp(0.5) - 1.5, math.exp(2.0) - 3.0, 0.0])
    assert torch.allclose(stats["rollout_kl_k3"][0], k3, atol=1e-6)
    loss.sum().backward()
    # ppo: d(-rA)/dlogp = -1 per token; cispo: -w_is A = -1; both times the TIS weight
    assert torch.allclose(logprobs.grad[0], -w, atol=1e-6)


def test_tis_off_keeps_loss_and_reports_mismatch():
    old = torch.full((1, 2), -1.0)
    rollout = torch.tensor([[-1.2, -0.7]])
    plain, _ = POLICY_LOSSES.get("ppo_clip")(old, old, torch.tensor([1.0]), torch.ones(1, 2), CFG)
    loss, stats = POLICY_LOSSES.get("ppo_clip")(
        old, old, torch.tensor([1.0]), torch.ones(1, 2), CFG, rollout_logprobs=rollout
    )
    assert torch.equal(loss, plain) and "tis_weight" not in stats
    assert masked_mean(stats["rollout_gap_abs"], torch.ones(1, 2)).item() == pytest.approx(0.25)
    assert stats["rollout_gap_abs_max"].item() == pytest.approx(0.3)


def test_tis_needs_rollout_logprobs():
    with pytest.raises(ValueError, match="rollout_logprobs"):
        POLICY_LOSSES.get("ppo_clip")(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), CFG, tis_cap=2.0
        )
    with pytest.raises(ValueError, match="rollout_logprobs"):
        POLICY_LOSSES.get("gspo")(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), GSPO,
            rollout_logprobs=torch.zeros(1, 3),
        )


# ---- properties of every policy loss --------------------------------------------------------------------

loss_case_st = st.integers(1, 4).flatmap(
    lambda b: st.tuples(
        st.lists(st.integers(0, 5), min_size=b, max_size=b),  # response lengths (0: empty)
        st.lists(st.floats(-3, 3), min_size=b, max_size=b),  # advantages
        st.integers(0, 2**31 - 1),
    )
)


@settings(max_examples=60, deadline=None)
@given(case=loss_case_st, name=st.sampled_from(["ppo_clip", "gspo", "cispo"]), dual=st.sampled_from([0.0, 3.0]))
def test_property_policy_losses(case, name, dual):
    lengths, advs, seed = case
    b, t = len(lengths), 5
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen) * 5
    logprobs = (old + torch.randn(b, t, generator=gen) * 2).requires_grad_(True)
    rollout = old + torch.randn(b, t, generator=gen)
    mask = (torch.arange(t)[None] < torch.tensor(lengths)[:, None]).float()
    adv = torch.tensor(advs)
    cfg = PPOClipSettings(dual_clip_c=dual) if name == "ppo_clip" else DEFAULTS[name]  # dual clip: ppo_clip only
    loss, stats = POLICY_LOSSES.get(name)(logprobs, old, adv, mask, cfg, rollout_logprobs=rollout, tis_cap=2.0)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logprobs.grad).all()
    assert torch.equal(loss[mask == 0], torch.zeros_like(loss[mask == 0]))
    assert torch.equal(logprobs.grad[mask == 0], torch.zeros_like(logprobs.grad[mask == 0]))
    for key, v in stats.items():
        assert torch.isfinite(v).all(), key
        if v.dim():
            assert torch.equal(v[mask == 0], torch.zeros_like(v[mask == 0])), key
    if name == "ppo_clip" and dual:
        # with TIS weight w <= 2, the loss of an A < 0 token never exceeds w * (-c A)
        neg = (adv[:, None] < 0) & (mask > 0)
        bound = -adv[:, None] * dual * stats["tis_weight"]
        assert (loss[neg] <= bound[neg] + 1e-5).all()
    if name == "gspo":
        # one loss per sequence: every masked token carries the same value (before TIS: divide it out)
        per_tok = torch.where(mask > 0, loss / stats["tis_weight"].clamp(min=1e-12), torch.zeros_like(loss))
        for i, n in enumerate(lengths):
            if n:
                assert torch.allclose(per_tok[i, :n], per_tok[i, :1].expand(n), rtol=1e-5, atol=1e-6)


# -- AReaL's decoupled objective (algorithm.rollout_correction: decoupled), by hand -------------------------------
# old (pi_prox) [-1.0, -2.0], rollout (pi_behav) [-1.5, -1.0]: weights exp(old - rollout) = [e^0.5, e^-1]
# = [1.6487, 0.3679]. At the first step logprobs = old (ratio 1, no clipping), so the PPO token loss is -A = -1
# and the decoupled loss is -w; its gradient in logprobs is -A * w * ratio = -w.
_OLD, _ROLL = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
_W = [math.exp(0.5), math.exp(-1.0)]


@pytest.mark.parametrize(("mode", "cap", "weights", "capped"), [
    ("decoupled", 0.0, _W, [0.0, 0.0]),          # uncapped: the full behaviour weight
    ("decoupled", 1.5, [0.0, _W[1]], [1.0, 0.0]),  # AReaL's cap: the token over it leaves the loss
    ("tis", 1.5, [1.5, _W[1]], [1.0, 0.0]),        # TIS clamps it at the cap instead
])  # fmt: skip
def test_decoupled_weights_by_hand(mode, cap, weights, capped):
    lp = _OLD.clone().requires_grad_(True)
    loss, stats = POLICY_LOSSES.get("ppo_clip")(lp, _OLD, torch.tensor([1.0]), torch.ones(1, 2), CFG,
                                                rollout_logprobs=_ROLL, tis_cap=cap, rollout_correction=mode)  # fmt: skip
    assert loss.detach().squeeze(0).tolist() == pytest.approx([-w for w in weights], abs=1e-6)
    loss.sum().backward()
    assert lp.grad.squeeze(0).tolist() == pytest.approx([-w for w in weights], abs=1e-6)
    assert stats["tis_weight"].squeeze(0).tolist() == pytest.approx(weights, abs=1e-6)
    assert stats["tis_capped"].squeeze(0).tolist() == capped
    assert float(stats["tis_weight_max"]) == pytest.approx(max(weights), abs=1e-6)


def test_decoupled_clips_against_the_proximal_policy():
    """The ratio is pi_theta / pi_prox, not pi_theta / pi_behav: logprobs 0.5 above old (ratio e^0.5 = 1.65 >
    1.2) with A > 0 is clipped (no gradient), whatever the behaviour logprobs."""
    lp = (_OLD + 0.5).requires_grad_(True)
    loss, _ = POLICY_LOSSES.get("ppo_clip")(lp, _OLD, torch.tensor([1.0]), torch.ones(1, 2), CFG,
                                            rollout_logprobs=_ROLL, rollout_correction="decoupled")  # fmt: skip
    assert loss.detach().squeeze(0).tolist() == pytest.approx([-1.2 * _W[0], -1.2 * _W[1]], abs=1e-6)
    loss.sum().backward()
    assert lp.grad.abs().max() == 0.0


def test_unknown_rollout_correction_is_refused():
    with pytest.raises(ValueError, match="rollout_correction"):
        POLICY_LOSSES.get("ppo_clip")(_OLD, _OLD, torch.tensor([1.0]), torch.ones(1, 2), CFG, rollout_logprobs=_ROLL,
                                      rollout_correction="areal")  # fmt: skip
