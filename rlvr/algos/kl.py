"""Per-token KL(policy || reference) estimators, registered by name (Schulman 2020, "Approximating KL
divergence", http://joschu.net/blog/kl-approx.html).

Signature: ``fn(logprobs: Tensor [B, T], ref_logprobs: Tensor [B, T]) -> Tensor [B, T]`` (nats per token,
float32 or wider). Tokens are sampled from the policy; in Schulman's notation ``r = p_ref / p_policy`` and
``log r = ref_logprobs - logprobs``. The result is unmasked and unreduced: the caller adds ``kl_coef * kl`` to the
token loss before the loss aggregation, which applies the mask and names the normaliser.

k3 clamps ``log r`` to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] BEFORE ``exp`` (case A5: a policy logprob of -100
against a reference of -0.01 gives a finite loss and gradient; outside the clamp the gradient is 0).
k1 and k2 take no ``exp`` and are not clamped.

Also here (plain functions, not registry entries): :func:`kl_as_reward` (the penalty folded into
token rewards), the DPH-RL divergences on samples of the reference :func:`dph_forward_kl` and
:func:`dph_js`, and :func:`entropy_bonus`.

Errors: ``ValueError`` when the two shapes differ.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rlvr.algos.logprobs import LOG_RATIO_CLAMP
from rlvr.lazy import lazy_module
from rlvr.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_module("torch")

KL_ESTIMATORS: Registry = Registry("KL estimator")



def _log_r(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """[B, T] ``log r = ref_logprobs - logprobs`` in at least float32."""
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} must have one shape [B, T]"
        )
    dtype = torch.promote_types(torch.promote_types(logprobs.dtype, ref_logprobs.dtype), torch.float32)
    return ref_logprobs.to(dtype) - logprobs.to(dtype)


@KL_ESTIMATORS.register("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = -log r = logprobs - ref_logprobs: unbiased, high variance, can be negative per token. [B, T]."""
    return -_log_r(logprobs, ref_logprobs)


@KL_ESTIMATORS.register("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = (log r)^2 / 2: biased, low variance, >= 0. [B, T]."""
    return 0.5 * _log_r(logprobs, ref_logprobs).square()


@KL_ESTIMATORS.register("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = (r - 1) - log r: unbiased, low variance, >= 0. [B, T].

    Computed as ``expm1(log r) - log r`` with ``log r`` clamped to +-LOG_RATIO_CLAMP first.
    Case A5: ``log r = 0.1`` (ref_logprobs - logprobs) gives 0.005171.
    """
    log_r = _log_r(logprobs, ref_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(log_r) - log_r


# ------------------------------------------------------------------------------------------------------
# KL folded into the reward, mass-covering divergences (DPH-RL), entropy bonus. Plain functions, not
# KL_ESTIMATORS entries: their inputs differ from "tokens sampled from the policy, penalty added to the loss".


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    if mask.shape != x.shape:
        raise ValueError(f"mask {tuple(mask.shape)} must have the shape [B, T] = {tuple(x.shape)}")
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def reward_to_go(per_token: Tensor, mask: Tensor) -> Tensor:
    """``out[b, t] = sum_{s >= t} mask[b, s] * per_token[b, s]`` (gamma = 1), 0 where masked.
    per_token, mask: [B, T] -> [B, T]. Errors: ``ValueError`` on a shape mismatch."""
    return _masked(_masked(per_token, mask).flip(-1).cumsum(dim=-1).flip(-1), mask)


def kl_as_reward(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, beta: float) -> Tensor:
    """The KL penalty folded into the reward instead of the loss (Ouyang et al. 2022, InstructGPT, eq. 2;
    per token with a reward-to-go as in REINFORCE++, Hu 2025, arXiv 2501.03262, sec. 3).

    Per-token reward ``-beta * k1_t`` with ``k1_t = logprobs - ref_logprobs`` (tokens sampled from the
    policy), summed from each token to the end of its sequence (gamma = 1):
    ``out[b, t] = -beta * sum_{s >= t} mask[b, s] * k1[b, s]``. Add it to the per-sequence advantages
    (``advantages[:, None] + out`` -> [B, T] token advantages) for the REINFORCE++ form
    ``A_t = r - beta * sum_{s >= t} KL_s``. Detached: a reward carries no gradient.
    logprobs, ref_logprobs, mask: [B, T] -> [B, T] float32 (nats, scaled by beta), 0 where masked.
    Errors: ``ValueError`` on shape mismatches or beta < 0.
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    with torch.no_grad():
        return reward_to_go(-beta * k1(logprobs, ref_logprobs), mask)


def dph_forward_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Forward (mass-covering) KL(pi_ref || pi) on tokens SAMPLED FROM pi_ref (DPH-RL, Li et al. 2025,
    "The Choice of Divergence", arXiv 2509.07430, sec. 4: f-divergence through its generator,
    ``D_f = E_{y ~ pi_ref}[f(pi / pi_ref)]`` with ``f(u) = -log u`` for forward KL).

    Per token: ``-log u = ref_logprobs - logprobs`` with ``u = pi / pi_ref``; its gradient is
    ``-grad log pi``: likelihood training on the reference's own samples. Data it needs: responses sampled
    ONCE from the initial policy (DPH-RL samples them offline, on prompts the initial policy already solves)
    with the logprobs pi_ref reported at sampling; no reference model during training. Our on-policy
    rollouts are samples of pi, not pi_ref, so this does not apply to them (for those use ``KL_ESTIMATORS``,
    which estimate the reverse KL(pi || pi_ref)).
    Applied per token (each token's conditional ratio); reduce with the loss aggregation and its mask.
    logprobs (current policy), ref_logprobs (stored, pi_ref): [B, T] -> [B, T], unmasked, >= -inf.
    Errors: ``ValueError`` when the shapes differ.
    """
    return _log_r(logprobs, ref_logprobs)


def dph_js(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """DPH-RL's Jensen-Shannon term on tokens SAMPLED FROM pi_ref, through its generator (Li et al. 2025,
    arXiv 2509.07430, sec. 4): ``E_{y ~ pi_ref}[f(u)]``, ``u = pi / pi_ref``, with the f-divergence generator of
    JS as the f-divergence tables write it (Nowozin et al. 2016, f-GAN, table 1) and as the DPH-RL authors' code
    computes it, WITHOUT a 1/2 factor: ``f(u) = u log u - (1 + u) log((1 + u) / 2)``.

    Its expectation is ``2 * JS(pi, pi_ref)`` (exact JS has the 1/2), bounded by ``2 log 2``; so
    ``algorithm.dph_coef`` means what it means in the authors' recipes (their coefficients carry over), and an
    exact-JS coefficient c corresponds to ``dph_coef = c / 2``. Same data as :func:`dph_forward_kl`.
    ``log u = logprobs - ref_logprobs`` is clamped to +-LOG_RATIO_CLAMP; computed as
    ``u log u - (1 + u) (softplus(log u) - log 2)``, finite everywhere. Per token, >= 0, 0 iff u = 1.
    logprobs, ref_logprobs: [B, T] -> [B, T] (nats), unmasked. Errors: ``ValueError`` when the shapes differ.
    """
    log_u = (-_log_r(logprobs, ref_logprobs)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    u = torch.exp(log_u)
    return u * log_u - (1.0 + u) * (torch.nn.functional.softplus(log_u) - math.log(2.0))


def entropy_bonus(entropy: Tensor, mask: Tensor, coef: float) -> Tensor:
    """Per-token loss term ``-coef * entropy`` (an entropy bonus, Williams & Peng 1991; the c2 S term of
    Schulman et al. 2017, eq. 9), 0 where masked; add it to the token loss before the loss aggregation,
    which names the normaliser. ``entropy`` must carry gradient (the trainer's entropy is computed on
    detached logits for metrics; a bonus needs it without the detach).
    entropy, mask: [B, T] (nats) -> [B, T]. Errors: ``ValueError`` on a shape mismatch.
    """
    return _masked(-coef * entropy, mask)
