"""DAPO's sample-level tools: the dynamic-sampling group filter and the two overlong-response treatments.

Source: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476.
The other two DAPO parts live elsewhere: Clip-Higher (sec. 3.1) is ``ppo_clip`` with ``algorithm.policy_loss.clip_high``
> ``clip_low`` (0.28 / 0.2), and the token-level loss (sec. 3.3, eq. 12) is the ``token_mean`` aggregation.

Dimensions: P = prompts, G = samples per prompt (group size), B = P x G responses (prompt-major).
These are pure tensor functions; the controller decides when to call them (``algorithm.dynamic_sampling``,
``algorithm.overlong_filter``, ``algorithm.overlong_buffer`` / ``overlong_penalty``).

Errors: ``ValueError`` on wrong shapes or out-of-range arguments, as each function documents.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.lazy import lazy_module

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_module("torch")


def informative_groups(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """Dynamic-sampling filter (DAPO sec. 3.2, the constraint ``0 < |{o_i : correct}| < G`` on each group):
    True for the groups whose rewards are not all equal.

    A group of equal rewards gets zero advantage under every group-baselined estimator, so it adds no gradient
    and only dilutes the batch; DAPO over-samples and keeps only the other groups. For 0/1 rewards this is the
    paper's "neither all right nor all wrong"; for shaped rewards it is ``max_g r[p] - min_g r[p] > eps``
    (robust to float noise: a spread of ``eps`` or less counts as equal). A group of one sample (G = 1) is never
    informative. Apply it to the rewards the advantage estimator sees (after any overlong penalty).

    rewards: [P, G] (any real dtype) -> [P] bool. eps: float >= 0, in reward units.
    Errors: ``ValueError`` when ``rewards`` is not 2-D, holds NaN/inf, or ``eps`` < 0.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G] (prompts x samples per prompt), got shape {tuple(rewards.shape)}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    r = rewards if rewards.is_floating_point() else rewards.to(torch.float64)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards hold NaN or inf; a verifier must return a finite score for every sample")
    if r.shape[-1] == 0:
        return torch.zeros(r.shape[0], dtype=torch.bool, device=r.device)
    return (r.amax(dim=-1) - r.amin(dim=-1)) > eps


def select_groups(informative: Tensor, need: int) -> Tensor:
    """Which of N candidate groups fill a training batch of ``need`` groups under dynamic sampling.

    Takes the informative groups first, in their order (DAPO Algorithm 1 fills its buffer in sampling order);
    when fewer than ``need`` exist (the round cap ``algorithm.dynamic_sampling_max_rounds`` was reached), the
    rest are the earliest uninformative groups, whose advantages are 0: the batch keeps its configured size
    (the trainer's mini-batch split stays valid), and the shortfall is ``need - informative.sum()``.

    informative: [N] bool (from :func:`informative_groups` over all rounds, concatenated in order);
    need: groups wanted (P). Returns [need] int64 indices into the N candidates, informative ones first.
    Errors: ``ValueError`` when ``informative`` is not 1-D or N < need or need < 0.
    """
    if informative.dim() != 1:
        raise ValueError(f"informative must be [N] bool, got shape {tuple(informative.shape)}")
    n = informative.shape[0]
    if need < 0 or n < need:
        raise ValueError(f"need {need} groups from {n} candidates: need must be in [0, {n}]")
    inf = informative.to(torch.bool)
    idx = torch.arange(n, device=informative.device)
    return torch.cat([idx[inf], idx[~inf]])[:need]


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer: int, penalty: float) -> Tensor:
    """DAPO's soft overlong punishment (sec. 3.4, eq. 13), added to each response's reward.

    With ``L_max = max_new_tokens`` and ``L_cache = buffer`` (the last ``buffer`` tokens before the limit)::

        R_length(L) = 0                                              L <= L_max - L_cache
                    = ((L_max - L_cache) - L) / L_cache * penalty    L_max - L_cache < L < L_max
                    = -penalty                                       L >= L_max

    (the paper's penalty is 1 against a +-1 correctness reward; its L_max = 20,480 with L_cache = 4,096).
    ``buffer = 0`` turns it off: all zeros. Example: L_max 64, buffer 16, penalty 1: L = 40 -> 0, 48 -> 0,
    56 -> -0.5, 64 -> -1.

    lengths: [B] response tokens per sample (integer or float, >= 0) -> [B] float32 reward units.
    Errors: ``ValueError`` when ``lengths`` is not 1-D or negative, ``max_new_tokens`` < 1,
    ``buffer`` outside [0, max_new_tokens], or ``penalty`` < 0.
    """
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be [B] (response tokens per sample), got shape {tuple(lengths.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 0 <= buffer <= max_new_tokens:
        raise ValueError(f"buffer (L_cache) must be in [0, max_new_tokens = {max_new_tokens}], got {buffer}")
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0 (it is subtracted), got {penalty}")
    length = lengths.to(torch.float32)
    if bool((length < 0).any()):
        raise ValueError("lengths must be >= 0 (response tokens)")
    if buffer == 0:
        return torch.zeros_like(length)
    free = float(max_new_tokens - buffer)  # L_max - L_cache: the longest response with no penalty
    ramp = (free - length) / float(buffer) * penalty  # normaliser: L_cache tokens
    return ramp.clamp(min=-penalty, max=0.0)


def overlong_mask(truncated: Tensor) -> Tensor:
    """DAPO's overlong filtering (sec. 3.4, "Overlong Filtering"): the loss of truncated samples is masked.

    Returns the per-sample multiplier of the loss mask: 0 for a truncated sample (stopped by the token limit,
    ``finish_reason == "length"``), 1 otherwise. Call it only when ``algorithm.overlong_filter`` is on, and
    multiply each row of the [B, T] loss mask by it, so masked samples also leave the token-count normaliser.
    truncated: [B] bool (or 0/1) -> [B] float32.
    Errors: ``ValueError`` when ``truncated`` is not 1-D or holds values other than 0/1.
    """
    if truncated.dim() != 1:
        raise ValueError(f"truncated must be [B] bool, got shape {tuple(truncated.shape)}")
    if truncated.dtype != torch.bool and not bool(((truncated == 0) | (truncated == 1)).all()):
        raise ValueError("truncated must be bool or 0/1")
    return 1.0 - truncated.to(torch.float32)
