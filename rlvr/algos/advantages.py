"""Advantage estimators: per-group rewards -> per-sample advantages, registered by name.

Every estimator has one signature, ``fn(rewards: Tensor [P, G], cfg: AlgorithmConfig) -> Tensor [P, G]``
(float32, same device), where P = prompts and G = samples per prompt (group size). Row ``p`` holds the G
samples of prompt ``p``; flatten with ``.reshape(-1)`` to get the [B] advantages of sequence ``p * G + g``.

Every statistic is taken over one group (a row), never over the whole batch (case A3). A group with one
sample, or whose rewards are all equal, carries no signal: its advantages are exactly 0, never NaN (case A2).

Errors: ``ValueError`` when ``rewards`` is not 2-D or holds NaN/inf.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.config import AlgorithmConfig
from rlvr.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")

STD_EPS = 1e-6
"""Added to the group's std before dividing (GRPO), so a near-constant group cannot explode."""


def _rewards_f32(rewards: Tensor) -> Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G] (prompts x samples per prompt), got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float32)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards hold NaN or inf; a verifier must return a finite score for every sample")
    return r


def _no_signal(r: Tensor) -> Tensor:
    """[P, 1] bool: True where the group's rewards are all equal (G = 1 included)."""
    return r.amax(dim=-1, keepdim=True) == r.amin(dim=-1, keepdim=True)


def _centred(r: Tensor) -> Tensor:
    """[P, G] rewards minus their group mean (normaliser: G, per group)."""
    return r - r.mean(dim=-1, keepdim=True)


@ADVANTAGES.register("grpo")
def grpo(rewards: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """GRPO outcome advantages (Shao et al. 2024, "DeepSeekMath", sec. 4.1.2).

    ``A[p, g] = (r[p, g] - mean_g r[p]) / (std_g r[p] + STD_EPS)`` when ``cfg.std_normalize``, with the
    group's UNBIASED std (normaliser G - 1); otherwise ``r[p, g] - mean_g r[p]`` (normaliser G).
    rewards: [P, G] -> advantages: [P, G] float32. Case A1: (1,1,1,0,0,0,0,0) -> +1.2076 / -0.7246.
    """
    r = _rewards_f32(rewards)
    adv = _centred(r)
    if cfg.std_normalize and r.shape[-1] > 1:
        adv = adv / (r.std(dim=-1, keepdim=True, correction=1) + STD_EPS)
    return torch.where(_no_signal(r), torch.zeros_like(adv), adv)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(rewards: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """Dr. GRPO advantages: mean-centring only, no std division (Liu et al. 2025, "Understanding R1-Zero-Like
    Training: A Critical Perspective", sec. 3.2); ``cfg.std_normalize`` is ignored.

    ``A[p, g] = r[p, g] - mean_g r[p]`` (normaliser G). Pair it with the ``seq_mean_token_sum_norm`` loss
    aggregation to remove the paper's length bias as well. rewards: [P, G] -> [P, G] float32.
    Case A1: (1,1,1,0,0,0,0,0) -> +0.625 / -0.375.
    """
    r = _rewards_f32(rewards)
    adv = _centred(r)
    return torch.where(_no_signal(r), torch.zeros_like(adv), adv)


@ADVANTAGES.register("rloo")
def rloo(rewards: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024, "Back to Basics", eq. 6).

    ``A[p, g] = r[p, g] - (sum_{j != g} r[p, j]) / (G - 1)``, which equals ``G / (G - 1) * (r - mean)``.
    G = 1 has no other sample to compare with: 0. rewards: [P, G] -> [P, G] float32.
    Case A1: (1,1,1,0,0,0,0,0) -> +0.7143 / -0.4286.
    """
    r = _rewards_f32(rewards)
    g = r.shape[-1]
    if g < 2:
        return torch.zeros_like(r)
    adv = _centred(r) * (g / (g - 1))
    return torch.where(_no_signal(r), torch.zeros_like(adv), adv)
