"""Policy losses (per token) and loss aggregations (tokens -> one scalar), each registered by name.

Dimensions: B = sequences in a micro-batch, T = response tokens (padded). ``mask: [B, T]`` is 1 (or True) on
the response tokens that count (see :func:`rlvr.algos.logprobs.response_mask`), 0 on padding.

Policy loss: ``fn(logprobs [B, T], old_logprobs [B, T], advantages [B], mask [B, T], cfg) ->
(token_loss [B, T], stats)``. ``token_loss`` is 0 where ``mask`` is 0; ``stats`` maps names to detached
per-token [B, T] tensors (0 where masked), to be reduced with
``rlvr.algos.logprobs.masked_mean(stats[name], mask)`` for metrics.

Loss aggregation: ``fn(token_loss [B, T], mask [B, T], *, num_tokens, num_seqs, max_len) -> scalar``.
``num_tokens`` (masked tokens) and ``num_seqs`` (sequences) are the GLOBAL counts of the whole mini-batch
(all micro-batches, all ranks), so each micro-batch's result is its share of the mini-batch loss and the SUM of
the results over micro-batches and ranks equals the loss of the whole mini-batch, however it is split.
The caller therefore must not average again: DeepSpeed's ``engine.backward`` divides by the gradient
accumulation steps (``scale_wrt_gas``) and data-parallel all-reduce averages over the W ranks, so multiply
the loss by ``grad_accum_steps * W`` before such a backward (or turn those scalings off).
A count of 0 (nothing to train on) divides by 1 instead: the masked sum is then 0 and so is the loss.

Errors: ``ValueError`` on mismatched shapes, a negative or non-finite count, or ``max_len`` shorter than T.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlvr.config import AlgorithmConfig
from rlvr.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
LOSS_AGGREGATIONS: Registry = Registry("loss aggregation")

LOG_RATIO_CLAMP = 20.0
"""|log(pi / pi_old)| bound applied before exp, so one stale token cannot overflow the ratio."""


def _check_bt(name: str, x: Tensor, like: Tensor) -> None:
    if x.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected [B, T] = {tuple(like.shape)}")


def _advantages_b1(advantages: Tensor, like: Tensor) -> Tensor:
    """[B] (or [B, T]) advantages -> a tensor that broadcasts over [B, T]."""
    if advantages.dim() == 1 and advantages.shape[0] == like.shape[0]:
        return advantages.unsqueeze(-1)
    if advantages.shape == like.shape:
        return advantages
    raise ValueError(
        f"advantages have shape {tuple(advantages.shape)}; expected [B] = [{like.shape[0]}] or [B, T] = {tuple(like.shape)}"
    )


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: AlgorithmConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, negated for descent (Schulman et al. 2017, eq. 7), with an asymmetric clip
    range ``[1 - cfg.clip_low, 1 + cfg.clip_high]`` (as in DAPO, Yu et al. 2025, eq. 10).

    ``ratio = exp(clamp(logprobs - old_logprobs, +-LOG_RATIO_CLAMP))``;
    ``token_loss = -min(ratio * A, clip(ratio) * A)``, 0 where ``mask`` is 0.
    logprobs, old_logprobs, mask: [B, T]; advantages: [B] (one per sequence) or [B, T].

    stats (detached, [B, T], 0 where masked, float):
      ``clipped``: 1 where clipping changed the objective, i.e. ``A > 0 and ratio > 1 + clip_high`` or
      ``A < 0 and ratio < 1 - clip_low`` (case A6; counting by the ratio alone is wrong);
      ``clipped_high`` / ``clipped_low``: the two halves of ``clipped``;
      ``ratio``: the importance ratio; ``approx_kl``: k3 estimate of KL(pi_old || pi) per token
      (tokens were sampled from pi_old: ``r = pi / pi_old``, ``k3 = r - 1 - log r``, Schulman 2020).
    """
    _check_bt("old_logprobs", old_logprobs, logprobs)
    _check_bt("mask", mask, logprobs)
    adv = _advantages_b1(advantages, logprobs).to(logprobs.dtype)
    m = mask.bool()
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(lo, hi)
    token_loss = torch.where(m, torch.maximum(unclipped, clipped), torch.zeros_like(unclipped))
    with torch.no_grad():
        clip_high = (adv > 0) & (ratio > hi) & m
        clip_low = (adv < 0) & (ratio < lo) & m
        zero = torch.zeros_like(log_ratio)
        stats = {
            "clipped": (clip_high | clip_low).float(),
            "clipped_high": clip_high.float(),
            "clipped_low": clip_low.float(),
            "ratio": torch.where(m, ratio, zero).detach(),
            "approx_kl": torch.where(m, torch.expm1(log_ratio) - log_ratio, zero).detach(),
        }
    return token_loss, stats


# ------------------------------------------------------------------------------------------------------
# aggregations


def _count(value: float, name: str) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite count >= 0 (global over the mini-batch), got {value!r}")
    return max(v, 1.0)


def _masked_loss(token_loss: Tensor, mask: Tensor) -> Tensor:
    _check_bt("mask", mask, token_loss)
    return torch.where(mask.bool(), token_loss, torch.zeros_like(token_loss))


@LOSS_AGGREGATIONS.register("token_mean")
def token_mean(token_loss: Tensor, mask: Tensor, *, num_tokens: float, num_seqs: float, max_len: int) -> Tensor:
    """Every token of the mini-batch weighs the same: ``sum(token_loss * mask) / num_tokens``
    (normaliser: masked tokens of the whole mini-batch; DAPO, Yu et al. 2025, eq. 8). Case A4: 1/10 per token.
    """
    return _masked_loss(token_loss, mask).sum() / _count(num_tokens, "num_tokens")


@LOSS_AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    token_loss: Tensor, mask: Tensor, *, num_tokens: float, num_seqs: float, max_len: int
) -> Tensor:
    """Mean over tokens within each sequence, then mean over sequences (GRPO, Shao et al. 2024, eq. 3):
    ``sum_i (sum_t token_loss[i, t] * mask[i, t] / len_i) / num_seqs`` with ``len_i`` the masked tokens of
    sequence i (a sequence lies in one micro-batch; an empty one counts as length 1, contributing 0) and
    ``num_seqs`` the sequences of the whole mini-batch. Case A4: 1/4 and 1/16 per token.
    """
    per_token = _masked_loss(token_loss, mask)
    lengths = mask.to(per_token.dtype).sum(dim=-1).clamp(min=1.0)
    return (per_token.sum(dim=-1) / lengths).sum() / _count(num_seqs, "num_seqs")


@LOSS_AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum(
    token_loss: Tensor, mask: Tensor, *, num_tokens: float, num_seqs: float, max_len: int
) -> Tensor:
    """Sum over tokens within each sequence, mean over sequences: ``sum(token_loss * mask) / num_seqs``
    (normaliser: sequences of the whole mini-batch). Case A4: 1/2 per token.
    """
    return _masked_loss(token_loss, mask).sum() / _count(num_seqs, "num_seqs")


@LOSS_AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(
    token_loss: Tensor, mask: Tensor, *, num_tokens: float, num_seqs: float, max_len: int
) -> Tensor:
    """Dr. GRPO's constant normaliser (Liu et al. 2025, "Understanding R1-Zero-Like Training", eq. 3):
    ``sum(token_loss * mask) / (num_seqs * max_len)``, with ``max_len`` the configured maximum response
    length (a constant, not the longest sequence seen). Case A4: 1/32 per token (2 sequences, max_len 16).
    """
    if max_len < token_loss.shape[-1]:
        raise ValueError(f"max_len ({max_len}) is shorter than the padded response length T ({token_loss.shape[-1]})")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    return _masked_loss(token_loss, mask).sum() / (_count(num_seqs, "num_seqs") * max_len)
