"""Per-token KL(policy || reference) estimators, registered by name (Schulman 2020, "Approximating KL
divergence", http://joschu.net/blog/kl-approx.html).

Signature: ``fn(logprobs: Tensor [B, T], ref_logprobs: Tensor [B, T]) -> Tensor [B, T]`` (nats per token,
float32 or wider). Tokens are sampled from the policy; in Schulman's notation ``r = p_ref / p_policy`` and
``log r = ref_logprobs - logprobs``. The result is unmasked and unreduced: the caller adds ``kl_coef * kl`` to the
token loss before the loss aggregation, which applies the mask and names the normaliser.

k3 clamps ``log r`` to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] BEFORE ``exp`` (case A5: a policy logprob of -100
against a reference of -0.01 gives a finite loss and gradient; outside the clamp the gradient is 0).
k1 and k2 take no ``exp`` and are not clamped.

Errors: ``ValueError`` when the two shapes differ.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")

LOG_RATIO_CLAMP = 20.0
"""|log r| bound applied before exp (exp(20) = 4.9e8 is finite in fp32 and bf16)."""


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
