"""On-policy distillation: the teacher's per-token logprobs of the student's own samples as the advantage.

The student samples; a fixed teacher model scores every sampled token; the per-token advantage is the negative
reverse-KL estimate ``log p_T(y_t) - log p_S(y_t)`` (nats), so the policy gradient lowers the reverse KL
``KL(p_S || p_T)`` on the student's own samples (Agarwal et al. 2024, "On-Policy Distillation of Language Models:
Learning from Self-Generated Mistakes" (GKD), arXiv 2306.13649, sec. 3, the lambda = 1 / reverse-KL case;
Thinking Machines 2025, "On-Policy Distillation" (blog): per-token reverse KL as the advantage, discount 0, the
student's logprobs those of the sampler). Each token's term is its own (discount 0: no reward-to-go over later
tokens), as both write-ups do.

The entry ``distill`` of :data:`rlvr.algos.advantages.ADVANTAGES` (``algorithm.advantage: {name: distill, ...}``)
is flagged ``needs_teacher`` (a teacher role is started, ``teacher:``) and ``token_advantages`` (one advantage per
token). Called with the rewards like every entry, it returns the verifiers' part: ``verifier_weight`` times the
``base`` estimator's per-sequence advantage; :func:`rlvr.runtime.advantage_stage.form_advantages` broadcasts it
over the sequence's tokens and adds :func:`teacher_term`.

This module imports torch on first use only (loading a recipe resolves :class:`DistillSettings` without it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlvr.algos.advantages import ADVANTAGES
from rlvr.lazy import lazy_module

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.config import Recipe

torch = lazy_module("torch")


@dataclass(frozen=True, kw_only=True)
class DistillSettings:
    """``algorithm.advantage: {name: distill, coef, verifier_weight, clip, base, student_logprobs}``."""

    coef: float = 1.0
    """Weight of the teacher term: ``A_t += coef * clip(log p_T - log p_S)`` (nats per token); >= 0."""
    verifier_weight: float = 0.0
    """Weight of the verifiers' advantage (``base`` estimator on the rewards, one per sequence, broadcast over its
    tokens); 0: pure distillation (rewards are still scored and logged); >= 0."""
    clip: float = 10.0
    """Per-token clip of the teacher term: ``log p_T - log p_S`` is clamped to ``[-clip, clip]`` nats before
    ``coef`` multiplies it (0: no clip). A token the teacher all but rules out (log p_T of -20 nats and below,
    e.g. a token outside its distribution) would otherwise dominate the batch's gradient; 10 nats leaves every
    token whose probability ratio is within e^10 ~ 22,000 untouched. The KL metrics are unclipped."""
    base: str = "grpo"
    """The verifiers' estimator (an entry of ``ADVANTAGES`` without settings of its own needed: its defaults are
    used), read when ``verifier_weight`` > 0."""
    student_logprobs: Literal["rollout"] = "rollout"
    """The source of log p_S: ``rollout``, the sampling engine's own logprobs of the sampled tokens (at the rollout
    temperature), as the Thinking Machines write-up uses the sampler's logprobs; the trainer's recomputed ones are
    not available before the update. The teacher scores at temperature 1 (vLLM's prompt logprobs ignore a
    temperature), so the recipe check holds ``rollout.temperature`` at 1 (:func:`rlvr.recipe.teacher_errors`)."""

    def errors(self, recipe: Recipe, where: str) -> list[str]:
        errs = []
        if self.coef < 0 or self.verifier_weight < 0 or self.clip < 0:
            errs.append(f"{where}: coef={self.coef}, verifier_weight={self.verifier_weight} and clip={self.clip} must "
                        "all be >= 0 (clip 0: no clip)")  # fmt: skip
        if self.coef == 0 and self.verifier_weight == 0:
            errs.append(f"{where}: coef and verifier_weight are both 0: nothing to learn from; set {where}.coef=1")
        if self.base == "distill" or self.base not in ADVANTAGES:
            errs.append(f"{where}.base={self.base!r} must be another advantage estimator, one of "
                        f"{[n for n in ADVANTAGES.names() if n != 'distill']}")  # fmt: skip
        elif self.verifier_weight > 0:
            g = recipe.rollout.samples_per_prompt
            if g < 2 and ADVANTAGES.flag(self.base, "needs_groups"):
                errs.append(f"{where}.base={self.base} compares samples within a group: set rollout.samples_per_prompt "
                            f">= 2 or {where}.verifier_weight=0")  # fmt: skip
        return errs


@ADVANTAGES.register("distill", settings=DistillSettings, needs_teacher=True, token_advantages=True)
def distill(rewards: Tensor, cfg: DistillSettings) -> Tensor:
    """The verifiers' part of the distillation advantage: ``verifier_weight * base(rewards)`` with the ``base``
    estimator at its default settings; exactly 0 when ``verifier_weight`` is 0. rewards: [P, G] -> [P, G] float32.
    The teacher's per-token part is :func:`teacher_term` (added in ``form_advantages``)."""
    base = ADVANTAGES.get(cfg.base)
    if cfg.verifier_weight == 0:
        return torch.zeros_like(rewards, dtype=torch.float32)
    return cfg.verifier_weight * base(rewards, ADVANTAGES.settings(cfg.base)())


def teacher_term(teacher_logprobs: Tensor, student_logprobs: Tensor, mask: Tensor, cfg: DistillSettings) -> tuple[Tensor, dict[str, float]]:
    """The per-token teacher advantage ``coef * clip(log p_T - log p_S, -clip, clip)`` on the loss mask, 0 off it.

    teacher_logprobs, student_logprobs, mask: [B, T] (T = S - 1 positions of the shifted frame; nats; mask 1 on
    sampled tokens, 0 on prompt, padding, and a multi-turn trajectory's environment/template tokens, whose
    logprobs may be anything: they are never read). Returns ([B, T] float32, stats):
    ``reverse_kl_mean`` (nats per token, unclipped ``log p_S - log p_T``; normaliser: the batch's masked tokens),
    ``reverse_kl_seq_mean`` (the per-sequence sum of it, mean over the B sequences; normaliser B),
    ``clipped_frac`` (masked tokens whose term was clipped, over the masked tokens).
    Errors: ``ValueError`` on shapes that differ or NaN/inf on the mask.
    """
    if not teacher_logprobs.shape == student_logprobs.shape == mask.shape:
        raise ValueError(f"teacher_logprobs {tuple(teacher_logprobs.shape)}, student_logprobs "
                         f"{tuple(student_logprobs.shape)} and mask {tuple(mask.shape)} must all be [B, T]")  # fmt: skip
    on = mask > 0
    diff = torch.where(on, teacher_logprobs.float() - student_logprobs.float(), torch.zeros((), dtype=torch.float32))
    if not bool(torch.isfinite(diff).all()):
        raise ValueError("teacher or student logprobs hold NaN/inf on sampled tokens")
    clipped = diff.clamp(-cfg.clip, cfg.clip) if cfg.clip > 0 else diff
    n_tok = on.sum().clamp(min=1)
    rkl = -diff  # log p_S - log p_T per token: the reverse KL's single-sample estimate (k1)
    stats = {
        "reverse_kl_mean": float(rkl.sum() / n_tok),
        "reverse_kl_seq_mean": float(rkl.sum() / max(mask.shape[0], 1)),
        "clipped_frac": float(((clipped != diff) & on).sum() / n_tok),
    }
    return (cfg.coef * clipped).float(), stats
