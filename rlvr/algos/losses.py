"""Policy losses (per token) and loss aggregations (tokens -> one scalar), each registered by name.

Dimensions: B = sequences in a micro-batch, T = token positions (padded). The trainer passes the SHIFTED full
sequence, T = S - 1 (prompt and response: position t predicts token t + 1); ``mask: [B, T]`` is 1 (or True) on
the response tokens that count (see :func:`rlvr.algos.logprobs.response_mask`), 0 on prompt tokens and padding.
Every loss and aggregation reads positions through ``mask`` only, so a response-only tensor (T = response
tokens, as in the unit tests) gives the same result; ``max_len`` is the response budget either way.

Policy loss: ``fn(logprobs [B, T], old_logprobs [B, T], advantages [B], mask [B, T], settings, *,
rollout_logprobs [B, T] | None = None, tis_cap: float = 0.0) -> (token_loss [B, T], stats)``. ``settings``: the
entry's own frozen dataclass (``policy_loss: {name: ppo_clip, clip_high: 0.28}`` in a recipe).
``rollout_logprobs`` are the engine's sampling logprobs, used for truncated importance sampling
(``tis_cap`` = ``algorithm.tis_cap``, which cuts across losses) and mismatch stats.
``token_loss`` is 0 where ``mask`` is 0; ``stats`` maps names to detached per-token [B, T] tensors (0 where
masked), to be reduced with ``rlvr.algos.logprobs.masked_mean(stats[name], mask)`` for metrics, or to 0-dim
tensors already reduced over the micro-batch (``rollout_gap_abs_max``: a max; combine micro-batches with max).

Loss aggregation: ``fn(token_loss [B, T], mask [B, T], *, num_tokens, num_seqs, max_len) -> scalar``.
``num_tokens`` (masked tokens) and ``num_seqs`` (sequences) are the GLOBAL counts of the whole mini-batch
(all micro-batches, all ranks), so each micro-batch's result is its share of the mini-batch loss and the SUM of
the results over micro-batches and ranks equals the loss of the whole mini-batch, however it is split.
The caller therefore must not average again: DeepSpeed's ``engine.backward`` divides by the gradient
accumulation steps (``scale_wrt_gas``) and data-parallel all-reduce averages over the W ranks, so multiply
the loss by ``grad_accum_steps * W`` before such a backward (or turn those scalings off).
A count of 0 (nothing to train on) divides by 1 instead: the masked sum is then 0 and so is the loss.

Errors: ``ValueError`` on mismatched shapes, a negative or non-finite count, or a response (mask row) longer than ``max_len``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.algos.logprobs import LOG_RATIO_CLAMP
from rlvr.lazy import lazy_module
from rlvr.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.config import Recipe

torch = lazy_module("torch")  # imported on first use: loading a recipe resolves these settings without torch

POLICY_LOSSES: Registry = Registry("policy loss", flags=("sequence_advantages",))
LOSS_AGGREGATIONS: Registry = Registry("loss aggregation")



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


DECOUPLED_CAP = 5.0
"""The default ``algorithm.tis_cap`` under ``rollout_correction: decoupled``: a token whose behaviour weight
pi_prox / pi_behav exceeds 5 leaves the loss. AReaL's value: its ``behave_imp_weight_cap`` defaulted to 5.0 in
``token_mask`` mode (said by AReaL's own migration warning in ``areal/api/cli_args.py``,
``PPOActorConfig.__post_init__``, inclusionAI/AReaL at 4aef98d; its replacement ``RejectionSamplingConfig.upper``
defaults to 5.0 there too), AReaL's recipes set ``behave_imp_weight_cap: 5.0`` (e.g.
``examples/math/gsm8k_grpo_megatron_lora.yaml``) and its best-practice guide recommends 5
(``docs/zh/best_practices/algo_perf.md``). Without a cap a token's weight is bounded only by
e^``LOG_RATIO_CLAMP`` = 4.9e8. (TIS clamps lower, C = 2: Yao et al. 2025; verl's ``tis_imp_ratio_cap``, now
``algorithm.rollout_correction.rollout_is_threshold: 2.0`` in verl's docs/algo/rollout_corr.md at b178a3c. TIS
stays off by default on-policy, where it would correct engine/trainer numerics only.)"""


def correction_cap(tis_cap: float | None, mode: str) -> float:
    """``algorithm.tis_cap`` as it runs under the resolved ``algorithm.rollout_correction`` ``mode``: as given when
    set; None (the default) is :data:`DECOUPLED_CAP` under ``decoupled`` and 0 (off) under ``tis`` and ``none``
    (an asynchronous ``tis`` at 0 is refused at load, :func:`rlvr.recipe.correction_errors`)."""
    if tis_cap is not None:
        return float(tis_cap)
    return DECOUPLED_CAP if mode == "decoupled" else 0.0


def _rollout_correction(
    old_logprobs: Tensor, rollout_logprobs: Tensor | None, mask: Tensor, tis_cap: float, mode: str = "tis"
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """The weight that corrects for the sampler (pi_rollout, the engine) not being pi_old, and mismatch stats.

    Tokens were sampled by the engine (pi_rollout); the trainer's ``old_logprobs`` are pi_old on the same
    tokens, ``raw = exp(old - rollout)`` (log-ratio clamped at +-``LOG_RATIO_CLAMP``), detached.

    - ``mode="tis"``: ``w = min(raw, tis_cap)`` (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
      You Off-Policy RL Training", TIS; the token-level truncated IS of Espeholt et al. 2018, IMPALA, eq. 1 with
      rho-bar = tis_cap); off (None) at ``tis_cap`` 0.
    - ``mode="decoupled"``: AReaL's decoupled PPO objective (Fu et al. 2025, arXiv 2505.24298, eq. 5): pi_old is
      the proximal policy the loss's ratio is clipped against, pi_rollout the behaviour policy, and every token is
      weighted by ``w = raw = pi_prox / pi_behav``; with ``tis_cap`` > 0 a token whose weight exceeds it gets
      ``w = 0`` (AReaL's ``behav_imp_weight_cap`` filter; the loss's normaliser still counts it).

    Returns (w [B, T] or None, stats). Stats (detached, 0 where masked): ``rollout_gap_abs`` [B, T]
    ``|old - rollout|`` (nats); ``rollout_gap_abs_max`` 0-dim, the max over this micro-batch's masked tokens;
    ``rollout_kl_k3`` [B, T] k3 estimate of KL(pi_rollout || pi_old) with ``log r = old - rollout`` (Schulman
    2020); with a weight, ``tis_weight`` [B, T], ``tis_weight_max`` 0-dim and ``tis_capped`` [B, T] (tokens at the
    cap, or dropped over it).
    Errors: ``ValueError`` when a weight is asked for without rollout logprobs, for an unknown ``mode``, or on a
    shape mismatch.
    """
    if mode not in ("tis", "decoupled"):
        raise ValueError(f"algorithm.rollout_correction={mode!r}: expected 'tis' or 'decoupled'")
    weighted = tis_cap > 0 or mode == "decoupled"
    if rollout_logprobs is None:
        if weighted:
            raise ValueError(f"algorithm.rollout_correction={mode} (tis_cap={tis_cap}) needs rollout_logprobs "
                             "(the engine's logprobs, [B, T])")
        return None, {}
    _check_bt("rollout_logprobs", rollout_logprobs, old_logprobs)
    with torch.no_grad():
        m = mask.bool()
        gap = old_logprobs.detach().float() - rollout_logprobs.float()
        gap_c = gap.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        zero = torch.zeros_like(gap)
        gap_abs = torch.where(m, gap.abs(), zero)
        stats = {
            "rollout_gap_abs": gap_abs,
            "rollout_gap_abs_max": gap_abs.max() if gap_abs.numel() else gap_abs.new_zeros(()),
            "rollout_kl_k3": torch.where(m, torch.expm1(gap_c) - gap_c, zero),
        }
        if not weighted:
            return None, stats
        raw = torch.exp(gap_c)
        if mode == "tis":
            w = raw.clamp(max=tis_cap)
        else:
            w = torch.where(raw > tis_cap, zero, raw) if tis_cap > 0 else raw
        stats["tis_weight"] = torch.where(m, w, zero)
        stats["tis_weight_max"] = stats["tis_weight"].max() if w.numel() else w.new_zeros(())
        stats["tis_capped"] = ((raw > tis_cap) & m).float() if tis_cap > 0 else zero
    return w.to(old_logprobs.dtype), stats


def _finish(token_loss: Tensor, m: Tensor, weight: Tensor | None) -> Tensor:
    """Apply the TIS weight (if any), then zero the masked-out tokens."""
    if weight is not None:
        token_loss = token_loss * weight
    return torch.where(m, token_loss, torch.zeros_like(token_loss))


def _log_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    return (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _clip_stats(high: Tensor, low: Tensor, ratio: Tensor, log_ratio: Tensor, m: Tensor) -> dict[str, Tensor]:
    """The shared stats: clip indicators, the ratio, and k3 KL(pi_old || pi) per token, 0 where masked."""
    zero = torch.zeros_like(log_ratio)
    return {
        "clipped": ((high | low) & m).float(),
        "clipped_high": (high & m).float(),
        "clipped_low": (low & m).float(),
        "ratio": torch.where(m, ratio, zero).detach(),
        "approx_kl": torch.where(m, torch.expm1(log_ratio) - log_ratio, zero).detach(),
    }


def _clip_range_errors(low: float, high: float, where: str) -> list[str]:
    return [] if low >= 0 and high >= 0 else [f"{where}.clip_low and {where}.clip_high must be >= 0"]


@dataclass(frozen=True, kw_only=True)
class PPOClipSettings:
    clip_low: float = 0.2
    """Ratio floor 1 - clip_low."""
    clip_high: float = 0.2
    """Ratio ceiling 1 + clip_high (DAPO's clip-higher: 0.28)."""
    dual_clip_c: float = 0.0
    """Dual clip (Ye et al. 2020): for A < 0 the loss is capped at ``-c * A``; 0: off, else > 1."""

    def errors(self, recipe: Recipe, where: str) -> list[str]:
        errs = _clip_range_errors(self.clip_low, self.clip_high, where)
        if self.dual_clip_c != 0 and not self.dual_clip_c > 1:
            errs.append(f"{where}.dual_clip_c={self.dual_clip_c} must be 0 (off) or > 1 (Ye et al. 2020 use 3)")
        return errs


@POLICY_LOSSES.register("ppo_clip", settings=PPOClipSettings)
def ppo_clip(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: PPOClipSettings,
    *,
    rollout_logprobs: Tensor | None = None,
    tis_cap: float = 0.0,
    rollout_correction: str = "tis",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, negated for descent (Schulman et al. 2017, eq. 7), with an asymmetric clip
    range ``[1 - cfg.clip_low, 1 + cfg.clip_high]`` (as in DAPO, Yu et al. 2025, eq. 10).

    ``ratio = exp(clamp(logprobs - old_logprobs, +-LOG_RATIO_CLAMP))``;
    ``token_loss = -min(ratio * A, clip(ratio) * A)``, 0 where ``mask`` is 0.
    Dual clip when ``cfg.dual_clip_c = c > 1`` (Ye et al. 2020, "Mastering Complex Control in MOBA Games
    with Deep Reinforcement Learning", eq. 5): for A < 0 the objective is ``max(min(rA, clip(r)A), cA)``,
    so the loss is capped at ``-c * A`` and a token with ratio > c gets no gradient.
    TIS: when ``tis_cap > 0`` each token's loss is multiplied by the detached
    ``min(exp(old_logprobs - rollout_logprobs), tis_cap)`` (see :func:`_rollout_correction`).
    logprobs, old_logprobs, mask, rollout_logprobs: [B, T]; advantages: [B] (one per sequence) or [B, T].

    stats (detached, [B, T], 0 where masked, float):
      ``clipped``: 1 where clipping changed the objective, i.e. ``A > 0 and ratio > 1 + clip_high`` or
      ``A < 0 and ratio < 1 - clip_low`` (case A6; counting by the ratio alone is wrong), or the dual clip;
      ``clipped_high`` / ``clipped_low``: the two PPO halves; ``clipped_dual``: ``A < 0 and ratio > c``;
      ``ratio``: the importance ratio; ``approx_kl``: k3 estimate of KL(pi_old || pi) per token
      (tokens were sampled from pi_old: ``r = pi / pi_old``, ``k3 = r - 1 - log r``, Schulman 2020);
      with ``rollout_logprobs``: the mismatch stats of :func:`_rollout_correction`.
    Errors: ``ValueError`` on mismatched shapes, or ``tis_cap > 0`` without ``rollout_logprobs``.
    """
    _check_bt("old_logprobs", old_logprobs, logprobs)
    _check_bt("mask", mask, logprobs)
    adv = _advantages_b1(advantages, logprobs).to(logprobs.dtype)
    m = mask.bool()
    weight, rstats = _rollout_correction(old_logprobs, rollout_logprobs, mask, tis_cap, rollout_correction)
    log_ratio = _log_ratio(logprobs, old_logprobs)
    ratio = torch.exp(log_ratio)
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    token_loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))
    c = cfg.dual_clip_c
    if c > 0:
        token_loss = torch.where(adv < 0, torch.minimum(token_loss, -adv * c), token_loss)
    with torch.no_grad():
        dual = (adv < 0) & (ratio > c) & m if c > 0 else torch.zeros_like(m)
        stats = _clip_stats((adv > 0) & (ratio > hi), ((adv < 0) & (ratio < lo)) | dual, ratio, log_ratio, m)
        stats["clipped_low"] = ((adv < 0) & (ratio < lo) & m).float()
        stats["clipped_dual"] = dual.float()
    return _finish(token_loss, m, weight), {**stats, **rstats}


@dataclass(frozen=True, kw_only=True)
class GSPOSettings:
    clip_low: float = 3e-4
    """Sequence-ratio floor 1 - clip_low (Zheng et al. 2025 use 3e-4)."""
    clip_high: float = 4e-4
    """Sequence-ratio ceiling 1 + clip_high (Zheng et al. 2025 use 4e-4)."""

    def errors(self, recipe: Recipe, where: str) -> list[str]:
        return _clip_range_errors(self.clip_low, self.clip_high, where)


@POLICY_LOSSES.register("gspo", settings=GSPOSettings, sequence_advantages=True)
def gspo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: GSPOSettings,
    *,
    rollout_logprobs: Tensor | None = None,
    tis_cap: float = 0.0,
    rollout_correction: str = "tis",
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: a clipped surrogate on the SEQUENCE-level importance ratio (Zheng et al. 2025, "Group Sequence
    Policy Optimization", arXiv 2507.18071, sec. 4.1: the objective J_GSPO and the ratio s_i).

    ``s_i = exp((1 / |y_i|) sum_t mask * (logprobs - old_logprobs))`` (normaliser: the sequence's masked
    tokens |y_i|, floored at 1; the mean log-ratio is clamped to +-LOG_RATIO_CLAMP before exp);
    ``seq_loss_i = -min(s_i A_i, clip(s_i, 1 - cfg.clip_low, 1 + cfg.clip_high) A_i)``, broadcast
    to every masked token of sequence i. With the ``seq_mean_token_mean`` aggregation this is exactly the
    paper's ``-(1/G) sum_i min(...)``; ``token_mean`` weights sequences by length instead.
    TIS (``tis_cap > 0``) multiplies each token's loss by its token-level weight, as in ``ppo_clip``.
    ``rollout_correction="decoupled"`` is refused at recipe load (:func:`rlvr.recipe.correction_errors`): a
    token weight on a sequence ratio is a hybrid no paper defines; called directly, it weights each token as TIS.
    logprobs, old_logprobs, mask: [B, T]; advantages: [B] (one per sequence; [B, T] is refused).
    stats: as ``ppo_clip`` (``clipped*`` and ``ratio`` are the sequence's, broadcast to its tokens;
    ``approx_kl`` is per token). Errors: ``ValueError`` on mismatched shapes or [B, T] advantages.
    """
    _check_bt("old_logprobs", old_logprobs, logprobs)
    _check_bt("mask", mask, logprobs)
    if advantages.dim() != 1 or advantages.shape[0] != logprobs.shape[0]:
        raise ValueError(
            f"gspo needs one advantage per sequence, [B] = [{logprobs.shape[0]}], got {tuple(advantages.shape)}"
        )
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)  # [B, 1]
    m = mask.bool()
    weight, rstats = _rollout_correction(old_logprobs, rollout_logprobs, mask, tis_cap, rollout_correction)
    lengths = m.sum(dim=-1, keepdim=True).clamp(min=1).to(logprobs.dtype)
    tok_log_ratio = torch.where(m, logprobs - old_logprobs, torch.zeros_like(logprobs))
    seq_log_ratio = (tok_log_ratio.sum(dim=-1, keepdim=True) / lengths).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    s = torch.exp(seq_log_ratio)  # [B, 1]
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    seq_loss = torch.maximum(-adv * s, -adv * s.clamp(lo, hi))  # [B, 1]
    token_loss = seq_loss.expand_as(logprobs)
    with torch.no_grad():
        shape = logprobs.shape
        stats = _clip_stats(
            ((adv > 0) & (s > hi)).expand(shape),
            ((adv < 0) & (s < lo)).expand(shape),
            s.expand(shape),
            _log_ratio(logprobs, old_logprobs),
            m,
        )
    return _finish(token_loss, m, weight), {**stats, **rstats}


@dataclass(frozen=True, kw_only=True)
class CISPOSettings:
    clip_low: float = 1.0
    """Importance-weight floor 1 - clip_low (1.0: no floor, as in MiniMax-M1)."""
    clip_high: float = 4.0
    """Importance-weight ceiling 1 + clip_high (not a value from the paper: tune it)."""

    def errors(self, recipe: Recipe, where: str) -> list[str]:
        return _clip_range_errors(self.clip_low, self.clip_high, where)


@POLICY_LOSSES.register("cispo", settings=CISPOSettings)
def cispo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: CISPOSettings,
    *,
    rollout_logprobs: Tensor | None = None,
    tis_cap: float = 0.0,
    rollout_correction: str = "tis",
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: clipped, stop-gradient importance weight times advantage times log-probability (MiniMax 2025,
    "MiniMax-M1", arXiv 2506.13585, sec. 3.1: the CISPO objective and its clipped IS weight r-hat).

    ``w = sg(clip(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high))`` with
    ``ratio = exp(clamp(logprobs - old_logprobs))``; ``token_loss = -w * A * logprobs``. Every token keeps a
    gradient (``-w * A`` w.r.t. its logprob); clipping only bounds the weight. The loss VALUE is not a
    surrogate of the return (it carries log pi); only its gradient is meaningful. The paper pairs it with
    the ``token_mean`` aggregation (normaliser: all tokens of the batch). TIS as in ``ppo_clip``;
    ``rollout_correction="decoupled"`` is refused at recipe load (:func:`rlvr.recipe.correction_errors`): CISPO's
    weight is already an importance weight, a second one makes a hybrid no paper defines.
    logprobs, old_logprobs, mask: [B, T]; advantages: [B] or [B, T].
    stats: as ``ppo_clip``, where ``clipped_high`` / ``clipped_low`` mark weights that were capped
    (``ratio > 1 + high`` / ``ratio < 1 - low``), whatever the advantage's sign.
    Errors: ``ValueError`` on mismatched shapes.
    """
    _check_bt("old_logprobs", old_logprobs, logprobs)
    _check_bt("mask", mask, logprobs)
    adv = _advantages_b1(advantages, logprobs).to(logprobs.dtype)
    m = mask.bool()
    weight, rstats = _rollout_correction(old_logprobs, rollout_logprobs, mask, tis_cap, rollout_correction)
    log_ratio = _log_ratio(logprobs, old_logprobs)
    ratio = torch.exp(log_ratio)
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    w = ratio.clamp(lo, hi).detach()
    safe_lp = torch.where(m, logprobs, torch.zeros_like(logprobs))  # -inf on padding must not reach backward
    token_loss = -w * adv * safe_lp
    with torch.no_grad():
        stats = _clip_stats(ratio > hi, ratio < lo, ratio, log_ratio, m)
    return _finish(token_loss, m, weight), {**stats, **rstats}


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

    ``token_loss`` and ``mask`` may be in the trainer's shifted full-sequence frame (prompt + response, so T is
    wider than any response): only the masked (response) positions are counted against ``max_len``, whatever
    the prompt offset. Errors: ``ValueError`` when a row has more response positions than ``max_len``.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    longest = int(mask.sum(-1).max()) if mask.numel() else 0  # response positions per row, not the tensor width
    if longest > max_len:
        raise ValueError(f"a response has {longest} tokens, more than max_len ({max_len}), the response budget")
    return _masked_loss(token_loss, mask).sum() / (_count(num_seqs, "num_seqs") * max_len)
