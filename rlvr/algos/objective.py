"""The trainer's loss for one micro-batch, assembled in one pure function (tensors in, tensors out).

``loss = agg(policy_loss + kl_coef * KL [if algorithm.kl_penalty = loss] - entropy_coef * H) + DPH term``, where
``agg`` is the recipe's loss aggregation with the *whole* mini-batch's normalisers (so micro-batches and ranks
sum to the mini-batch's loss), and the loss a rank back-propagates is ``loss * world_size`` (data-parallel
gradients are averaged over ranks). Sources: PPO-clip and its variants in :mod:`rlvr.algos.losses`; the KL term
(Shao et al. 2024, DeepSeekMath, eq. 3) and estimators in :mod:`rlvr.algos.kl`; the entropy bonus (Schulman et al.
2017, eq. 9); the DPH-RL term (Li et al. 2025, arXiv 2509.07430, sec. 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from rlvr.algos.kl import KL_ESTIMATORS, entropy_bonus
from rlvr.algos.losses import LOSS_AGGREGATIONS, POLICY_LOSSES, correction_cap

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.config import AlgorithmConfig


@dataclass(frozen=True)
class MicroBatchLoss:
    """``backward``: what this rank back-propagates (``loss * world_size``); ``loss``: this micro-batch's share of
    the mini-batch loss (scalar); ``stats``: the policy loss's statistics ([B, T] tensors or scalars) and ``kl``
    ([B, T]) when a reference was given."""

    backward: Tensor
    loss: Tensor
    stats: dict[str, Tensor | float]


def micro_batch_loss(
    cfg: "AlgorithmConfig",
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_logprobs: Tensor,
    num_tokens: float,
    num_seqs: float,
    max_len: int,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    dph_loss: Tensor | None = None,
    world_size: int = 1,
) -> MicroBatchLoss:
    """The loss of one micro-batch (see the module docstring).

    logprobs, old_logprobs, rollout_logprobs, mask, ref_logprobs, entropy: [B, T] (T: the shifted sequence,
    prompt and response; ``mask`` 1 on response tokens); advantages: [B] or [B, T]. ``num_tokens`` /
    ``num_seqs``: the whole mini-batch's response tokens / sequences (all ranks); ``max_len``: the response
    budget (``seq_mean_token_sum_norm``). ``ref_logprobs``: the reference's, for the KL term (added to the loss
    when ``cfg.kl_coef > 0`` and ``cfg.kl_penalty == "loss"``; its per-token value is in ``stats["kl"]``
    either way); ``entropy``: with gradient, for the bonus when ``cfg.entropy_coef > 0``; ``dph_loss``: the DPH-RL
    term of this micro-batch (:func:`dph_term`), added as is.
    ``cfg.policy_loss`` is a resolved :class:`rlvr.config.Spec` (its ``settings`` the loss's own dataclass).
    Errors: ``ValueError`` from the policy loss or aggregation on mismatched shapes; ``KeyError`` on an unknown
    name in ``cfg``.
    """
    token_loss, stats = POLICY_LOSSES.get(cfg.policy_loss.name)(
        logprobs, old_logprobs, advantages, mask, POLICY_LOSSES.settings_of(cfg.policy_loss),
        rollout_logprobs=rollout_logprobs,
        tis_cap=correction_cap(cfg.tis_cap, cfg.rollout_correction),  # as resolved at load; None: the mode's default
        # passed only when set, so a user's loss written before the option keeps working with the default
        # (``none`` is ``tis`` at tis_cap 0, which the recipe checks enforce; ``auto`` is resolved at recipe load,
        # and a settings object built by hand without it reads as ``tis``)
        **({"rollout_correction": cfg.rollout_correction} if cfg.rollout_correction == "decoupled" else {}),
    )
    stats = dict(stats)
    if ref_logprobs is not None:
        kl = KL_ESTIMATORS.get(cfg.kl_estimator)(logprobs, ref_logprobs)  # [B, T]
        stats["kl"] = kl
        if cfg.kl_coef > 0 and cfg.kl_penalty == "loss":
            token_loss = token_loss + cfg.kl_coef * kl
    if cfg.entropy_coef > 0:
        if entropy is None:
            raise ValueError("algorithm.entropy_coef > 0 needs the policy's entropy [B, T] with gradient")
        token_loss = token_loss + entropy_bonus(entropy, mask, cfg.entropy_coef)
    loss = LOSS_AGGREGATIONS.get(cfg.loss_agg)(token_loss, mask, num_tokens=num_tokens, num_seqs=num_seqs,
                                               max_len=max_len)  # fmt: skip
    if dph_loss is not None:
        loss = loss + dph_loss
    return MicroBatchLoss(backward=loss * world_size, loss=loss, stats=stats)


def dph_term(divergence: Callable[[Tensor, Tensor], Tensor], logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor,
             coef: float, total_tokens: float, weight: float = 1.0) -> tuple[Tensor, Tensor]:
    """DPH-RL's term on this rank's share of the starting policy's samples: ``weight * coef * sum(div * mask) /
    total_tokens`` (token mean over the whole DPH batch), and the per-token divergence [B, T] (masked).
    ``divergence``: :func:`rlvr.algos.kl.dph_forward_kl` or :func:`rlvr.algos.kl.dph_js`; ``weight`` 0 for a rank
    with no share (it still runs the forward, for ZeRO-3's collective gathers)."""
    div = divergence(logprobs, ref_logprobs) * mask
    return weight * coef * div.sum() / total_tokens, div
