"""The advantage stage of a training step, and the DPH-RL buffer of starting-policy samples.

:func:`form_advantages` turns a packed rollout batch and its rewards into the batch the trainer updates on:
group estimators (:data:`rlvr.algos.advantages.ADVANTAGES`, one advantage per sequence) or critic estimators
(:data:`rlvr.algos.gae.CRITIC_ADVANTAGES`, one per token, values from the critic role), with the KL to the
reference folded into the reward when ``algorithm.kl_penalty=reward``.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Callable

import torch

from rlvr.algos import ADVANTAGES, KL_ESTIMATORS
from rlvr.algos.advantages import normalise_token_advantages, per_valid_group, valid_advantages
from rlvr.algos.distill import teacher_term
from rlvr.algos.gae import CRITIC_ADVANTAGES, outcome_token_rewards
from rlvr.algos.kl import reward_to_go
from rlvr.config import Recipe
from rlvr.metrics import names as mn
from rlvr.seeding import dph_batch_seed, dph_prompt_seed
from rlvr.train.batch import TrainBatch, pack
from rlvr.types import Completion, Prompt, SamplingConfig

log = logging.getLogger("rlvr")

Generate = Callable[[list[Prompt], SamplingConfig], tuple[list[Completion], list, dict[str, float]]]
"""``(prompts, sampling) -> (completions [B], scored [B], timings)``: :func:`rlvr.runtime.rollout_stage.rule_scores`
on the run's roles, or a fake."""


def uses_critic(recipe: Recipe) -> bool:
    """True when ``algorithm.advantage`` names a critic estimator (a value model role is started)."""
    return recipe.algorithm.advantage.name in CRITIC_ADVANTAGES


def needs_reference(recipe: Recipe) -> bool:
    """True when :func:`form_advantages` needs the reference model's logprobs of the batch (KL in the reward)."""
    return recipe.algorithm.kl_coef > 0 and recipe.algorithm.kl_penalty == "reward"


def uses_teacher(recipe: Recipe) -> bool:
    """True when ``algorithm.advantage`` needs the teacher's logprobs of the batch (``distill``: a teacher role is
    started on ``teacher.model``)."""
    return ADVANTAGES.flag(recipe.algorithm.advantage.name, "needs_teacher")


def form_advantages(batch: TrainBatch, rewards: torch.Tensor, recipe: Recipe, *, ref_logprobs: torch.Tensor | None = None,
                    values: torch.Tensor | None = None,
                    teacher_logprobs: torch.Tensor | None = None,
                    valid: torch.Tensor | None = None) -> tuple[TrainBatch, dict | None, dict[str, float]]:
    """Advantages for ``batch`` (B = P x G sequences; rewards: [P, G], prompt-major like the batch). Pure: the
    reference's logprobs ([B, S-1], when :func:`needs_reference`) and the critic's values ([B, S-1], when
    :func:`uses_critic`) and the teacher's ([B, S-1] nats, when :func:`uses_teacher`) come in as tensors.
    ``valid`` [P, G] bool (None: all): False on samples left out as infrastructure failures
    (:func:`rlvr.runtime.rollout_stage.infra_failed`): they are out of every group baseline and batch statistic
    (:func:`rlvr.algos.advantages.valid_advantages`) and, their loss mask being 0 (:func:`rlvr.train.batch.pack`),
    out of the update. Errors: ``ValueError`` when a needed one is missing.

    - KL in the reward (``kl_coef > 0`` and ``kl_penalty=reward``): the per-token penalty ``-kl_coef * KL_t`` with
      ``KL_t`` the ``algorithm.kl_estimator`` (k1 = rollout logprob - reference logprob is InstructGPT's eq. 2;
      k3 is >= 0 per token) between the sampling policy's own logprobs and the trainer's reference model's.
    - Group estimators: ``A[b]`` per sequence; with the KL penalty, ``A[b] + sum_{s >= t} penalty[b, s]`` per
      token (:func:`rlvr.algos.kl.reward_to_go`). An estimator normalised over the whole batch (its
      ``before_batch_norm`` attribute: ``reinforce_pp``, ``reinforce_pp_global``) gets the penalty BEFORE that
      normalisation, over tokens (REINFORCE++, Hu 2025, sec. 3, as OpenRLHF does):
      :func:`rlvr.algos.advantages.normalise_token_advantages`.
    - Distillation (``distill``, :mod:`rlvr.algos.distill`): ``A[b, t] = verifier_weight * base(rewards)[b]`` on
      the mask + ``coef * clip(teacher_logprobs - rollout_logprobs)`` per sampled token (0 off the loss mask:
      prompt, padding, a trajectory's environment tokens), plus the KL penalty's reward-to-go if set; metrics
      ``distill/*``.
    - Critic estimators: token rewards = the outcome reward on the last response token
      (:func:`rlvr.algos.gae.outcome_token_rewards`) + the penalty; values from the critic; (advantages, returns).

    Returns (batch with advantages, critic inputs ``{"values", "returns"}`` or None, metrics). ``adv/*`` metrics
    are token means over response tokens (normaliser: the batch's response-token count).
    """
    al = recipe.algorithm
    mask = batch.loss_mask
    metrics: dict[str, float] = {}
    n_tok = mask.sum().clamp(min=1.0)
    penalty = None
    if needs_reference(recipe):
        if ref_logprobs is None:
            raise ValueError("algorithm.kl_penalty=reward needs the reference model's logprobs of the batch")
        kl = KL_ESTIMATORS.get(al.kl_estimator)(batch.rollout_logprobs, ref_logprobs) * mask  # [B, S-1]
        penalty = -al.kl_coef * kl
        metrics[mn.TRAIN_KL] = float(kl.sum() / n_tok)
        metrics[mn.REWARD_KL_PENALTY_SEQ_MEAN] = float(penalty.sum() / len(batch))
    critic_inputs = None
    spec = al.advantage
    if uses_critic(recipe):
        token_rewards = outcome_token_rewards(rewards.reshape(-1), mask)
        if penalty is not None:
            token_rewards = token_rewards + penalty
        if values is None:
            raise ValueError(f"algorithm.advantage={spec.name} needs the critic's values of the batch")
        adv, returns = CRITIC_ADVANTAGES.get(spec.name)(token_rewards, values, mask, CRITIC_ADVANTAGES.settings_of(spec))
        critic_inputs = {"values": values, "returns": returns}
        metrics[mn.CRITIC_VALUE_MEAN] = float((values * mask).sum() / n_tok)
        metrics[mn.CRITIC_RETURN_MEAN] = float((returns * mask).sum() / n_tok)
    else:
        estimator = ADVANTAGES.get(spec.name)
        pre_norm = getattr(estimator, "before_batch_norm", None)
        if penalty is not None and pre_norm is not None:
            # REINFORCE++: A_t = r - beta * sum_{s>=t} KL_s is formed first, then normalised over the batch's tokens
            first = pre_norm(rewards) if valid is None else per_valid_group(lambda x, _: pre_norm(x), rewards, valid, None)
            raw = first.reshape(-1).unsqueeze(-1) * mask + reward_to_go(penalty, mask)  # [B, S-1]
            adv = normalise_token_advantages(raw, mask)
        else:
            adv = valid_advantages(spec.name, rewards, valid, ADVANTAGES.settings_of(spec)).reshape(-1)  # [B]
            if uses_teacher(recipe):  # on-policy distillation: the teacher's per-token term on the sampled tokens
                if teacher_logprobs is None:
                    raise ValueError(f"algorithm.advantage={spec.name} needs the teacher's logprobs of the batch")
                term, st = teacher_term(teacher_logprobs, batch.rollout_logprobs, mask, ADVANTAGES.settings_of(spec))
                adv = adv.unsqueeze(-1) * mask + term  # [B, S-1]
                metrics.update({mn.DISTILL_REVERSE_KL_MEAN: st["reverse_kl_mean"],
                                mn.DISTILL_REVERSE_KL_SEQ_MEAN: st["reverse_kl_seq_mean"],
                                mn.DISTILL_CLIPPED_FRAC: st["clipped_frac"]})  # fmt: skip
            if penalty is not None:  # per-group estimators: the KL's reward-to-go is added after the group norm
                adv = (adv.unsqueeze(-1) * mask if adv.dim() == 1 else adv) + reward_to_go(penalty, mask)  # [B, S-1]
    if adv.dim() == 2:
        metrics[mn.ADV_TOKEN_MEAN] = float((adv * mask).sum() / n_tok)
        metrics[mn.ADV_TOKEN_ABS_MEAN] = float((adv.abs() * mask).sum() / n_tok)
    return dataclasses.replace(batch, advantages=adv.float()), critic_inputs, metrics


# -- DPH-RL: samples of the starting policy ------------------------------------------------------------------


def build_dph_buffer(generate: Generate, prompts: list[Prompt], sampling: SamplingConfig, recipe: Recipe, primary: str) -> list[Completion]:
    """Sample the STARTING policy (the engines before the first sync) on ``algorithm.dph_prompts`` training
    prompts (a seeded choice), ``sampling.n`` samples each, and keep the correct ones (primary verifier's score
    >= 1), as DPH-RL keeps the starting policy's solved samples for its divergence term (Li et al. 2025,
    arXiv 2509.07430, sec. 4). Their ``logprobs`` are pi_ref's at the rollout temperature.
    Returns the kept completions (possibly empty: the caller warns).
    """
    al = recipe.algorithm
    rng = random.Random(dph_prompt_seed(recipe.run.seed))
    chosen = rng.sample(range(len(prompts)), min(al.dph_prompts, len(prompts)))
    completions, scored, _ = generate([prompts[i] for i in chosen], sampling)
    kept = [c for c, s in zip(completions, scored) if s.results[primary].score >= 1.0 and c.token_ids]
    log.info("DPH-RL buffer: %d correct samples of the starting policy kept out of %d (%d prompts)",
             len(kept), len(completions), len(chosen))
    return kept


def dph_batch(buffer: list[Completion], step: int, recipe: Recipe, pad_id: int) -> TrainBatch | None:
    """``algorithm.dph_batch`` buffer samples for ``step`` (a seeded draw without replacement per step), packed
    with zero advantages; None when the buffer is empty or DPH-RL is off."""
    al = recipe.algorithm
    if not buffer or al.dph_divergence == "none" or al.dph_coef == 0:
        return None
    rng = random.Random(dph_batch_seed(recipe.run.seed, step))
    pick = rng.sample(range(len(buffer)), min(al.dph_batch, len(buffer)))
    comps = [buffer[i] for i in pick]
    return pack(comps, torch.zeros(len(comps)), pad_id, recipe.rollout.max_new_tokens)
