"""Tinker's built-in losses for ``rlvr serve`` (issue 43, rlvr/algos/tinker_losses.py): each loss's value and its
gradient with respect to target_logprobs on a datum of 2-5 positions, worked out by hand in the comments (the
numbers are written here, not computed by the module), clipping hit on both sides, config defaults and
overrides, and the ValueErrors on malformed requests.

Notation: lp = target_logprobs (learner), q = loss_fn_inputs["logprobs"] (sampler), r = exp(lp - q), A = advantages.
Inputs are built from hand-picked ratios: lp = q + log(r), so r is exactly the number written.
"""

from __future__ import annotations

import math
import typing

import pytest
import torch

from rlvr.algos.tinker_losses import CONFIG_DEFAULTS, TINKER_LOSSES, required_inputs, tinker_loss

E01 = 1.1051709180756477  # e^0.1
EM01 = 0.9048374180359595  # e^-0.1


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def _run(name, lp, inputs, config=None):
    """(loss value, metrics, d loss / d lp as a list) for one datum."""
    lp = lp.clone().requires_grad_(True)
    loss, metrics = tinker_loss(name, lp, inputs, config)
    assert loss.dim() == 0
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.item(), metrics, grad.tolist()


def _rl(q, ratios, adv, **extra):
    """(lp, inputs) for an RL datum with sampling logprobs q and ratios r = p / q written by hand."""
    q_t = _t(q)
    lp = q_t + _t([math.log(r) for r in ratios])
    inputs = {"target_tokens": torch.arange(len(q), dtype=torch.int64), "logprobs": q_t, "advantages": _t(adv)}
    inputs.update({k: _t(v) for k, v in extra.items()})
    return lp, inputs


def _flat(x):
    """A nested list (an [N, K] gradient) flattened; anything else as it is."""
    return [v for row in x for v in row] if isinstance(x, list) and isinstance(x[0], list) else x


def _close(got, want, tol=1e-5):
    flat = _flat
    assert flat(got) == pytest.approx(flat(want), abs=tol), (got, want)


# ---- the names ------------------------------------------------------------------------------------------


def test_the_seven_are_the_sdks_loss_types_less_custom():
    tinker_types = pytest.importorskip("tinker.types")
    assert set(TINKER_LOSSES) == set(typing.get_args(tinker_types.LossFnType)) - {"custom"}
    assert len(TINKER_LOSSES) == 7


def test_required_inputs():
    rl = ("target_tokens", "logprobs", "advantages")
    assert required_inputs("cross_entropy") == ("target_tokens", "weights")
    for name in ("importance_sampling", "ppo", "cispo", "dro"):
        assert required_inputs(name) == rl
    assert required_inputs("gspo") == rl + ("sequence_ratio_mask",)


def test_config_defaults_are_tinkers():
    assert CONFIG_DEFAULTS["ppo"] == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert CONFIG_DEFAULTS["cispo"] == {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
    assert CONFIG_DEFAULTS["dro"] == {"beta": 0.05}
    assert CONFIG_DEFAULTS["gspo"] == pytest.approx({"clip_low_threshold": 0.9997, "clip_high_threshold": 1.0004})
    assert CONFIG_DEFAULTS["cross_entropy"] == CONFIG_DEFAULTS["importance_sampling"] == {}


# ---- cross_entropy --------------------------------------------------------------------------------------


def test_cross_entropy_value_and_gradient():
    # loss = -sum w lp = -(0 * -1 + 1 * -0.5 + 0.5 * -2) = 1.5; d/dlp = -w = [0, -1, -0.5]
    lp = _t([-1.0, -0.5, -2.0])
    inputs = {"target_tokens": _t([5, 6, 7], torch.int64), "weights": _t([0.0, 1.0, 0.5])}
    value, metrics, grad = _run("cross_entropy", lp, inputs)
    _close(value, 1.5)
    assert metrics == {"loss:sum": pytest.approx(1.5)}
    _close(grad, [0.0, -1.0, -0.5])


def test_cross_entropy_takes_any_real_weight():
    # forward_backward_custom's surrogate: weights = -dLoss/dlogprob, any sign. w = [-2, 3]:
    # loss = -(-2 * -1 + 3 * -0.5) = -(2 - 1.5) = -0.5; d/dlp = -w = [2, -3]
    lp = _t([-1.0, -0.5])
    inputs = {"target_tokens": _t([1, 2], torch.int64), "weights": _t([-2.0, 3.0])}
    value, _, grad = _run("cross_entropy", lp, inputs)
    _close(value, -0.5)
    _close(grad, [2.0, -3.0])


def test_cross_entropy_multi_target():
    # [N, K] = [2, 2]: loss = -(1 * -1 + 0 * -2 + 0.5 * -0.5 + 2 * -3) = -(-1 - 0.25 - 6) = 7.25; d/dlp = -w
    lp = _t([[-1.0, -2.0], [-0.5, -3.0]])
    w = _t([[1.0, 0.0], [0.5, 2.0]])
    value, _, grad = _run("cross_entropy", lp, {"target_tokens": _t([[1, 2], [3, 4]], torch.int64), "weights": w})
    _close(value, 7.25)
    _close(grad, [[-1.0, 0.0], [-0.5, -2.0]])


# ---- importance_sampling --------------------------------------------------------------------------------


def test_importance_sampling_is_unclipped():
    # r = [2, 0.5, 1], A = [1, -2, 3]: loss = -(2 - 1 + 3) = -4 (r = 2 is far outside any clip range);
    # d/dlp (-r A) = -r A = [-2, 1, -3]
    lp, inputs = _rl([-1.0, -2.0, -0.5], [2.0, 0.5, 1.0], [1.0, -2.0, 3.0])
    value, metrics, grad = _run("importance_sampling", lp, inputs)
    _close(value, -4.0)
    assert metrics == {"loss:sum": pytest.approx(-4.0)}
    _close(grad, [-2.0, 1.0, -3.0])


def test_importance_sampling_ratio_is_not_clamped():
    # log r = 25 (beyond rlvr's LOG_RATIO_CLAMP of 20), A = 1e-10: loss = -e^25 * 1e-10 = -7.2004899e0; grad the same
    q = _t([-30.0])
    lp = _t([-5.0])
    inputs = {"target_tokens": _t([1], torch.int64), "logprobs": q, "advantages": _t([1e-10])}
    value, _, grad = _run("importance_sampling", lp, inputs)
    _close(value, -7.2004899, tol=1e-4)
    _close(grad, [-7.2004899], tol=1e-4)


def test_importance_sampling_multi_target():
    # [2, 2]: r = [[2, 1], [0.5, 1]], A = [[1, 0], [4, -1]]: loss = -(2 + 0 + 2 - 1) = -3; d/dlp = -r A
    q = _t([[-1.0, -2.0], [-0.5, -3.0]])
    lp = q + _t([[math.log(2.0), 0.0], [math.log(0.5), 0.0]])
    inputs = {"target_tokens": _t([[1, 2], [3, 4]], torch.int64), "logprobs": q,
              "advantages": _t([[1.0, 0.0], [4.0, -1.0]])}
    value, _, grad = _run("importance_sampling", lp, inputs)
    _close(value, -3.0)
    _close(grad, [[-2.0, 0.0], [-2.0, 1.0]])


# ---- ppo ------------------------------------------------------------------------------------------------

# (r, A): clipped high (1.5, +1), clipped low (0.5, -1), high ratio with A < 0 (1.5, -2: the unclipped term is
# the smaller), low ratio with A > 0 (0.5, +2: likewise), inside the range (1.1, +1)
PPO_Q = [-1.0, -2.0, -0.3, -1.5, -0.7]
PPO_R = [1.5, 0.5, 1.5, 0.5, 1.1]
PPO_A = [1.0, -1.0, -2.0, 2.0, 1.0]


def test_ppo_defaults_clip_both_sides():
    # thresholds 0.8 / 1.2, per token -min(r A, clip(r) A):
    #   -min(1.5, 1.2) = -1.2 (grad 0) | -min(-0.5, -0.8) = 0.8 (grad 0) | -min(-3, -2.4) = 3 (grad -rA = 3)
    #   -min(1, 1.6) = -1 (grad -1)    | -min(1.1, 1.1) = -1.1 (grad -1.1)
    # loss = -1.2 + 0.8 + 3 - 1 - 1.1 = 0.5
    lp, inputs = _rl(PPO_Q, PPO_R, PPO_A)
    value, metrics, grad = _run("ppo", lp, inputs)
    _close(value, 0.5)
    assert metrics == {"loss:sum": pytest.approx(0.5, abs=1e-5)}
    _close(grad, [0.0, 0.0, 3.0, -1.0, -1.1])
    assert tinker_loss("ppo", lp, inputs, {})[0].item() == pytest.approx(0.5, abs=1e-5)  # {} keeps the defaults


def test_ppo_wide_thresholds_do_not_clip():
    # 0.4 / 1.6: no token clipped, loss = -sum r A = -(1.5 - 0.5 ... ) = -(1.5 + (-0.5) + (-3) + 1 + 1.1) = -0.1
    lp, inputs = _rl(PPO_Q, PPO_R, PPO_A)
    value, _, grad = _run("ppo", lp, inputs, {"clip_low_threshold": 0.4, "clip_high_threshold": 1.6})
    _close(value, -0.1)
    _close(grad, [-1.5, 0.5, 3.0, -1.0, -1.1])


def test_ppo_one_key_overridden_keeps_the_other_default():
    # high 1.6 (given), low 0.8 (default): token 1 unclipped (-1.5, grad -1.5), token 2 still clipped low (0.8, 0)
    # loss = -1.5 + 0.8 + 3 - 1 - 1.1 = 0.2
    lp, inputs = _rl(PPO_Q, PPO_R, PPO_A)
    value, _, grad = _run("ppo", lp, inputs, {"clip_high_threshold": 1.6})
    _close(value, 0.2)
    _close(grad, [-1.5, 0.0, 3.0, -1.0, -1.1])
    # low 0.4 (given), high 1.2 (default): token 1 clipped (-1.2, 0), token 2 unclipped (0.5, grad 0.5)
    # loss = -1.2 + 0.5 + 3 - 1 - 1.1 = 0.2
    value, _, grad = _run("ppo", lp, inputs, {"clip_low_threshold": 0.4})
    _close(value, 0.2)
    _close(grad, [0.0, 0.5, 3.0, -1.0, -1.1])


def test_ppo_equal_thresholds_are_accepted():
    # 1.0 / 1.0: clip(r) = 1. Per token -min(rA, A): -1 | 1 | 3 (grad 3) | -1 (grad -1) | -1 ; loss = 1
    lp, inputs = _rl(PPO_Q, PPO_R, PPO_A)
    value, _, grad = _run("ppo", lp, inputs, {"clip_low_threshold": 1, "clip_high_threshold": 1})  # ints accepted
    _close(value, 1.0)
    _close(grad, [0.0, 0.0, 3.0, -1.0, 0.0])


def test_ppo_log_ratio_beyond_20_nats_documented_difference():
    # rlvr's ppo_clip clamps log r to 20 before exp (module doc): log r = 25, A = -1 gives
    # -min(-e^20, -1.2) = e^20 = 485165195.4 with gradient 0 (Tinker: e^25 with gradient e^25)
    inputs = {"target_tokens": _t([1], torch.int64), "logprobs": _t([-30.0]), "advantages": _t([-1.0])}
    value, _, grad = _run("ppo", _t([-5.0]), inputs)
    assert value == pytest.approx(485165195.4, rel=1e-6)
    assert grad == [0.0]


# ---- cispo ----------------------------------------------------------------------------------------------

# lp written by hand (CISPO's loss carries lp itself); q = lp - log r
CISPO_LP = [-1.0, -2.0, -0.5]
CISPO_R = [5.0, 0.5, 2.0]
CISPO_A = [1.0, -1.0, 0.5]


def _cispo_datum():
    lp = _t(CISPO_LP)
    q = lp - _t([math.log(r) for r in CISPO_R])
    return lp, {"target_tokens": _t([1, 2, 3], torch.int64), "logprobs": q, "advantages": _t(CISPO_A)}


def test_cispo_defaults_one_sided():
    # thresholds 0 / 4: w = sg(clip(r)) = [4, 0.5, 2] (no floor: 0.5 stays 0.5); per token -w lp A:
    #   -4 * -1 * 1 = 4 | -0.5 * -2 * -1 = -1 | -2 * -0.5 * 0.5 = 0.5 ; loss = 3.5
    # d/dlp = -w A = [-4, 0.5, -1]: every token keeps a gradient, clipping only bounds its coefficient
    lp, inputs = _cispo_datum()
    value, metrics, grad = _run("cispo", lp, inputs)
    _close(value, 3.5)
    assert metrics == {"loss:sum": pytest.approx(3.5, abs=1e-5)}
    _close(grad, [-4.0, 0.5, -1.0])


def test_cispo_override_clips_both_sides():
    # 0.8 / 1.2: w = [1.2, 0.8, 1.2]; -1.2 * -1 * 1 = 1.2 | -0.8 * -2 * -1 = -1.6 | -1.2 * -0.5 * 0.5 = 0.3
    # loss = -0.1; d/dlp = -w A = [-1.2, 0.8, -0.6]
    lp, inputs = _cispo_datum()
    value, _, grad = _run("cispo", lp, inputs, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    _close(value, -0.1)
    _close(grad, [-1.2, 0.8, -0.6])


# ---- dro ------------------------------------------------------------------------------------------------

# lp, q with d = lp - q = [0.5, 0, -1]; A = [1, -1, 0] (the last position has no advantage but is penalised)
DRO_LP = [-1.0, -2.0, -1.5]
DRO_Q = [-1.5, -2.0, -0.5]
DRO_A = [1.0, -1.0, 0.0]


def _dro_datum():
    return _t(DRO_LP), {"target_tokens": _t([1, 2, 3], torch.int64), "logprobs": _t(DRO_Q), "advantages": _t(DRO_A)}


def test_dro_default_beta():
    # beta 0.05: objective per token lp A - beta/2 d^2:
    #   -1 - 0.025 * 0.25 = -1.00625 | 2 - 0 = 2 | 0 - 0.025 * 1 = -0.025 ; sum 0.96875, loss = -0.96875
    # d loss/dlp = -A + beta d = [-1 + 0.025, 1, -0.05]
    lp, inputs = _dro_datum()
    value, metrics, grad = _run("dro", lp, inputs)
    _close(value, -0.96875)
    assert metrics == {"loss:sum": pytest.approx(-0.96875, abs=1e-5)}
    _close(grad, [-0.975, 1.0, -0.05])


def test_dro_beta_override():
    # beta 1: -1 - 0.5 * 0.25 = -1.125 | 2 | -0.5 ; sum 0.375, loss = -0.375; d/dlp = -A + d = [-0.5, 1, -1]
    lp, inputs = _dro_datum()
    value, _, grad = _run("dro", lp, inputs, {"beta": 1.0})
    _close(value, -0.375)
    _close(grad, [-0.5, 1.0, -1.0])
    # beta 0 (accepted): loss = -sum lp A = -(-1 + 2 + 0) = -1; d/dlp = -A
    value, _, grad = _run("dro", lp, inputs, {"beta": 0})
    _close(value, -1.0)
    _close(grad, [-1.0, 1.0, 0.0])


# ---- gspo -----------------------------------------------------------------------------------------------


def _gspo_datum():
    # position 0: prompt (mask 0, A 0, log r 5: must not enter the mean); 1-3: the sequence ratio's tokens,
    # log r = [0.3, -0.1, 0.1] -> mean 0.1, s = e^0.1 = 1.1051709; position 4: outside the mask (log r 2), A = -1
    return _rl([-1.0, -2.0, -0.5, -1.5, -3.0], [math.exp(5.0), math.exp(0.3), math.exp(-0.1), math.exp(0.1),
                                                 math.exp(2.0)],
               [0.0, 1.0, -1.0, 0.5, -1.0], sequence_ratio_mask=[0.0, 1.0, 1.0, 1.0, 0.0])


def test_gspo_defaults_clip_the_sequence_ratio():
    # every token's ratio is s = 1.1051709 > 1.0004, its gradient d s_t/d lp_t = s (its own log-prob, GSPO-token):
    #   t0: A 0 -> 0 | t1: -min(s, 1.0004) = -1.0004 (grad 0) | t2: -min(-s, -1.0004) = s (grad -A s = s)
    #   t3: -min(0.5 s, 0.5 * 1.0004) = -0.5002 (grad 0) | t4: A = -1 as t2: s (grad s; its own log r 2 is ignored)
    # loss = -1.0004 + 1.1051709 - 0.5002 + 1.1051709 = 0.7097418
    lp, inputs = _gspo_datum()
    value, metrics, grad = _run("gspo", lp, inputs)
    _close(value, 0.7097418)
    assert metrics == {"loss:sum": pytest.approx(0.7097418, abs=1e-5)}
    _close(grad, [0.0, 0.0, E01, 0.0, E01])


def test_gspo_wide_thresholds():
    # 0.5 / 2: nothing clipped; loss = -s sum A = -s (0 + 1 - 1 + 0.5 - 1) = 0.5 s = 0.5525855; d/dlp = -A s
    lp, inputs = _gspo_datum()
    value, _, grad = _run("gspo", lp, inputs, {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0})
    _close(value, 0.5 * E01)
    _close(grad, [0.0, -E01, E01, -0.5 * E01, E01])


def test_gspo_low_side():
    # log r = [-0.2, 0] -> s = e^-0.1 = 0.9048374 < 0.9997; A = [1, -1]:
    #   t0: -min(s, 0.9997) = -s (grad -s) | t1: -min(-s, -0.9997) = 0.9997 (grad 0) ; loss = 0.9997 - s = 0.0948626
    lp, inputs = _rl([-1.0, -2.0], [math.exp(-0.2), 1.0], [1.0, -1.0], sequence_ratio_mask=[1.0, 1.0])
    value, _, grad = _run("gspo", lp, inputs)
    _close(value, 0.9997 - EM01)
    _close(grad, [-EM01, 0.0])


# ---- dtype, sums ----------------------------------------------------------------------------------------


def test_float64_logprobs_take_float32_inputs():
    # as test_importance_sampling_is_unclipped, in float64: loss -4, the gradient float64
    lp, inputs = _rl([-1.0, -2.0, -0.5], [2.0, 0.5, 1.0], [1.0, -2.0, 3.0])
    lp64 = lp.double().requires_grad_(True)
    loss, _ = tinker_loss("importance_sampling", lp64, inputs, None)
    assert loss.dtype == torch.float64
    (grad,) = torch.autograd.grad(loss, lp64)
    assert grad.dtype == torch.float64
    _close(loss.item(), -4.0)


def test_datums_add():
    # the loss is a sum over positions: two datums split from one give the whole datum's loss
    lp, inputs = _rl(PPO_Q, PPO_R, PPO_A)
    whole = tinker_loss("ppo", lp, inputs, None)[0].item()
    head = tinker_loss("ppo", lp[:2], {k: v[:2] for k, v in inputs.items()}, None)[0].item()
    tail = tinker_loss("ppo", lp[2:], {k: v[2:] for k, v in inputs.items()}, None)[0].item()
    _close(head + tail, whole)
    _close(whole, 0.5)


# ---- errors ---------------------------------------------------------------------------------------------


def _raises(match, name, lp, inputs, config=None):
    with pytest.raises(ValueError, match=match):
        tinker_loss(name, lp, inputs, config)


def test_unknown_loss_lists_the_seven():
    lp, inputs = _rl([-1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="unknown loss 'grpo'") as e:
        tinker_loss("grpo", lp, inputs, None)
    for name in TINKER_LOSSES:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="unknown loss"):
        required_inputs("grpo")


def test_custom_runs_client_side():
    lp, inputs = _rl([-1.0], [1.0], [1.0])
    _raises("forward_backward_custom", "custom", lp, inputs)
    with pytest.raises(ValueError, match="forward_backward_custom"):
        required_inputs("custom")


def test_stable_reinforce_is_refused_with_the_reason():
    lp, inputs = _rl([-1.0], [1.0], [1.0])
    _raises("record_stability_info", "stable_reinforce", lp, inputs, {"kl_coeff": 0.1})
    with pytest.raises(ValueError, match="'stable_reinforce' is not supported"):
        required_inputs("stable_reinforce")


def test_missing_input():
    lp, inputs = _rl([-1.0, -2.0, -0.5], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    del inputs["advantages"]
    with pytest.raises(ValueError) as e:
        tinker_loss("ppo", lp, inputs, None)
    msg = str(e.value)
    assert "loss 'ppo': loss_fn_inputs lacks 'advantages' ([N] float" in msg
    assert "ppo takes target_tokens, logprobs, advantages" in msg
    _raises(r"lacks 'weights' \(\[N\] or \[N, K\] float", "cross_entropy", lp,
            {"target_tokens": inputs["target_tokens"]})
    _raises("lacks 'sequence_ratio_mask'", "gspo", lp, {**inputs, "advantages": _t([1.0, 1.0, 1.0])})


def test_extra_input_is_refused():
    lp, inputs = _dro_datum()
    _raises("loss 'dro': loss_fn_inputs has 'weights', which dro does not take", "dro", lp,
            {**inputs, "weights": _t([1.0, 1.0, 0.0])})


def test_wrong_length_and_shape():
    lp, inputs = _rl([-1.0, -2.0, -0.5], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    _raises(r"loss_fn_inputs\['advantages'\] has shape \(2,\), expected \(3,\)", "ppo", lp,
            {**inputs, "advantages": _t([1.0, 1.0])})
    _raises(r"loss_fn_inputs\['logprobs'\] has shape list", "ppo", lp, {**inputs, "logprobs": [-1.0, -2.0, -0.5]})
    _raises("target_logprobs must be a float tensor", "ppo", lp.reshape(3, 1),
            {k: v.reshape(3, 1) for k, v in inputs.items()})  # [N, K] only for cross_entropy and importance_sampling
    _raises("target_logprobs must be a float tensor", "ppo", [-1.0, -2.0, -0.5], inputs)
    _raises("target_logprobs must be a float tensor", "ppo", _t([1, 2, 3], torch.int64), inputs)
    _raises(r"target_logprobs must be a float tensor \[N\] or \[N, K\]", "importance_sampling",
            lp.reshape(1, 3, 1), {k: v.reshape(1, 3, 1) for k, v in inputs.items()})
    _raises("loss_fn_inputs must be a dict", "ppo", lp, [inputs])


def test_target_tokens_must_be_integers():
    lp, inputs = _rl([-1.0, -2.0], [1.0, 1.0], [1.0, 1.0])
    for bad in (_t([1.0, 2.0]), torch.tensor([True, False]), torch.tensor([1 + 0j, 2 + 0j])):
        _raises("'target_tokens'] must hold int64 token ids", "ppo", lp, {**inputs, "target_tokens": bad})
    tinker_loss("ppo", lp, {**inputs, "target_tokens": torch.tensor([1, 2], dtype=torch.int32)}, None)  # int32: fine


def test_non_finite_inputs():
    lp, inputs = _rl([-1.0, -2.0, -0.5], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    _raises(r"loss_fn_inputs\['advantages'\] has a non-finite value", "ppo", lp,
            {**inputs, "advantages": _t([1.0, float("nan"), 1.0])})
    _raises(r"loss_fn_inputs\['logprobs'\] has a non-finite value", "importance_sampling", lp,
            {**inputs, "logprobs": _t([-1.0, -2.0, float("-inf")])})


def test_gspo_empty_sequence_ratio_mask():
    lp, inputs = _gspo_datum()
    _raises("'sequence_ratio_mask'] marks no position", "gspo", lp, {**inputs, "sequence_ratio_mask": torch.zeros(5)})


def test_unknown_config_key():
    lp, inputs = _rl(PPO_Q, PPO_R, PPO_A)
    with pytest.raises(ValueError) as e:
        tinker_loss("ppo", lp, inputs, {"clip_ratio": 0.2})
    msg = str(e.value)
    assert "loss 'ppo': unknown loss_fn_config key 'clip_ratio'" in msg
    assert "ppo takes clip_low_threshold (default 0.8), clip_high_threshold (default 1.2)" in msg
    ce = {"target_tokens": inputs["target_tokens"], "weights": _t([1.0] * 5)}
    _raises("unknown loss_fn_config key 'beta'; cross_entropy takes no config", "cross_entropy", lp, ce, {"beta": 0.1})
    _raises("unknown loss_fn_config key 'kl_coeff'", "dro", *_dro_datum(), {"kl_coeff": 0.1})


def test_bad_config_values():
    lp, inputs = _rl(PPO_Q, PPO_R, PPO_A)
    for bad in ("0.9", True, float("nan"), float("inf"), None):
        _raises(r"loss_fn_config\['clip_low_threshold'\] must be a finite number", "ppo", lp, inputs,
                {"clip_low_threshold": bad})
    _raises("clip_low_threshold 1.3 exceeds clip_high_threshold 1.2", "ppo", lp, inputs, {"clip_low_threshold": 1.3})
    _raises("clip_low_threshold 0.9 exceeds clip_high_threshold 0.5", "cispo", lp, inputs,
            {"clip_low_threshold": 0.9, "clip_high_threshold": 0.5})
    _raises(r"loss_fn_config\['beta'\] must be >= 0", "dro", *_dro_datum(), {"beta": -0.01})
    _raises("loss_fn_config must be a dict", "ppo", lp, inputs, [("clip_low_threshold", 0.9)])


def test_trained_positions_by_hand():
    """Which positions carry a gradient: weights != 0 (cross_entropy), advantages != 0 (the policy-gradient losses,
    gspo included), every position (dro: its penalty acts where the advantage is 0)."""
    from rlvr.algos.tinker_losses import POSITIONWISE, trained_positions

    tt = torch.tensor([5, 6, 7, 8])
    ce = {"target_tokens": tt, "weights": torch.tensor([0.0, 0.0, 1.0, -0.5])}
    assert trained_positions("cross_entropy", ce).tolist() == [False, False, True, True]
    rl = {"target_tokens": tt, "logprobs": torch.zeros(4), "advantages": torch.tensor([0.0, 2.0, 0.0, -1.0])}
    for name in ("importance_sampling", "ppo", "cispo"):
        assert trained_positions(name, rl).tolist() == [False, True, False, True], name
    assert trained_positions("gspo", {**rl, "sequence_ratio_mask": torch.ones(4)}).tolist() == [False, True, False, True]
    assert trained_positions("dro", rl).tolist() == [True, True, True, True]
    multi = {"target_tokens": torch.zeros(3, 2, dtype=torch.long), "weights": torch.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]])}
    assert trained_positions("cross_entropy", multi).tolist() == [True, False, True]
    assert POSITIONWISE == {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"}
    with pytest.raises(ValueError, match="stable_reinforce"):
        trained_positions("stable_reinforce", rl)


def test_a_positionwise_loss_of_datums_end_to_end_is_the_sum_of_theirs():
    """The trainer's one call per micro-batch: for every POSITIONWISE loss, [N1 + N2] inputs end to end give the sum
    of the two datums' losses, and gspo (a mean over each datum) does not."""
    from rlvr.algos.tinker_losses import POSITIONWISE

    g = torch.Generator().manual_seed(3)
    def datum(n):
        return {"target_tokens": torch.arange(n), "logprobs": -torch.rand(n, generator=g),
                "advantages": torch.randn(n, generator=g), "weights": torch.rand(n, generator=g),
                "sequence_ratio_mask": torch.ones(n)}
    a, b = datum(3), datum(5)
    lpa, lpb = -torch.rand(3, generator=g), -torch.rand(5, generator=g)
    for name in sorted(POSITIONWISE | {"gspo"}):
        keys = required_inputs(name)
        one = lambda lp, d: tinker_loss(name, lp, {k: d[k] for k in keys}, None)[0]  # noqa: E731
        both = tinker_loss(name, torch.cat([lpa, lpb]), {k: torch.cat([a[k], b[k]]) for k in keys}, None)[0]
        same = torch.isclose(both, one(lpa, a) + one(lpb, b), atol=1e-6)
        assert bool(same) is (name in POSITIONWISE), name
