"""Invariants of the recipe's newer sections, split from :func:`rlvr.config.validate` (which calls them): each
returns a list of messages, every one naming the key and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlvr.config import AlgorithmConfig, Recipe


def objective_errors(al: AlgorithmConfig, g: int) -> list[str]:
    """Invariants of the pass@k, dual-clip, GSPO, CISPO and TIS settings (G = samples per prompt)."""
    errs = []
    k = al.passk_k
    if al.advantage == "passk" and not 1 <= k <= g:
        errs.append(
            f"algorithm.passk_k={k} must be in [1, rollout.samples_per_prompt={g}]: "
            f"set algorithm.passk_k={min(max(k, 1), g)}"
        )
    if al.advantage == "pkpo" and al.pkpo_baseline == "loo_minus_one" and not 2 <= k <= g:
        errs.append(
            f"algorithm.advantage=pkpo with pkpo_baseline=loo_minus_one needs 2 <= passk_k <= "
            f"samples_per_prompt ({g}), got {k}: set algorithm.passk_k={min(max(k, 2), max(g, 2))}"
            + (" (k = 1 has no baseline; use pkpo_baseline=loo)" if k == 1 else "")
        )
    if al.advantage == "pkpo" and al.pkpo_baseline == "loo" and not 1 <= k <= g - 1:
        errs.append(
            f"algorithm.advantage=pkpo with pkpo_baseline=loo needs 1 <= passk_k <= "
            f"samples_per_prompt - 1 ({g - 1}), got {k}: lower algorithm.passk_k or use pkpo_baseline=loo_minus_one (allows k = G)"
        )
    if al.dual_clip_c != 0 and not al.dual_clip_c > 1:
        errs.append(f"algorithm.dual_clip_c={al.dual_clip_c} must be 0 (off) or > 1 (Ye et al. 2020 use 3)")
    if al.gspo_clip_low < 0 or al.gspo_clip_high < 0 or al.cispo_clip_low < 0 or al.cispo_clip_high < 0:
        errs.append("algorithm.gspo_clip_low/high and cispo_clip_low/high must be >= 0")
    if al.tis_cap != 0 and not al.tis_cap >= 1:
        errs.append(
            f"algorithm.tis_cap={al.tis_cap} must be 0 (off) or >= 1 (a cap below 1 shrinks every token; 2 is common)"
        )
    return errs


def dapo_errors(al: AlgorithmConfig, g: int, max_new_tokens: int) -> list[str]:
    """Invariants of DAPO's dynamic sampling and overlong settings (G = samples per prompt)."""
    errs = []
    if al.dynamic_sampling_max_rounds < 0:
        errs.append(f"algorithm.dynamic_sampling_max_rounds={al.dynamic_sampling_max_rounds} must be >= 0")
    if al.dynamic_sampling and al.dynamic_sampling_max_rounds < 1:
        errs.append(
            "algorithm.dynamic_sampling=true needs algorithm.dynamic_sampling_max_rounds >= 1 (extra generation "
            "rounds to replace uninformative groups; DAPO-style runs use a few, e.g. 3)"
        )
    if al.dynamic_sampling and g < 2:
        errs.append(
            "algorithm.dynamic_sampling=true keeps groups whose rewards differ, and a group of one sample never "
            "does: set rollout.samples_per_prompt >= 2 or algorithm.dynamic_sampling=false"
        )
    b = al.overlong_buffer
    if not 0 <= b < max_new_tokens:
        errs.append(
            f"algorithm.overlong_buffer={b} must be in [0, rollout.max_new_tokens - 1 = {max_new_tokens - 1}] "
            f"(0: off; it is the penalised tail of the length limit): e.g. set algorithm.overlong_buffer="
            f"{max(max_new_tokens // 4, 0)}"
        )
    if al.overlong_penalty < 0:
        errs.append(f"algorithm.overlong_penalty={al.overlong_penalty} must be >= 0 (it is subtracted from the reward)")
    return errs


def extra_errors(r: Recipe) -> list[str]:
    """Invariants of the entropy bonus, GAE/critic, DPH-RL, checkpoint and failure settings."""
    al, cr, ck = r.algorithm, r.critic, r.checkpoint
    errs = []
    if al.entropy_coef < 0:
        errs.append(f"algorithm.entropy_coef={al.entropy_coef} must be >= 0 (0: off; e.g. 0.001)")
    if not (0 <= al.gamma <= 1 and 0 <= al.lam <= 1):
        errs.append(f"algorithm.gamma ({al.gamma}) and algorithm.lam ({al.lam}) must be in [0, 1]")
    if al.value_clip < 0:
        errs.append(f"algorithm.value_clip={al.value_clip} must be >= 0 (0: no value clipping)")
    if al.dph_coef < 0 or al.dph_prompts < 1 or al.dph_batch < 1:
        errs.append("algorithm.dph_coef must be >= 0, dph_prompts and dph_batch >= 1")
    if al.dph_divergence != "none" and al.dph_coef == 0:
        errs.append(f"algorithm.dph_divergence={al.dph_divergence} needs algorithm.dph_coef > 0 (e.g. 0.1)")
    if cr.lr <= 0 or cr.micro_batch_size < 1 or cr.grad_clip < 0:
        errs.append("critic.lr must be > 0, critic.micro_batch_size >= 1, critic.grad_clip >= 0")
    if ck.every_steps < 0 or ck.keep_last < 1:
        errs.append("checkpoint.every_steps must be >= 0 (0: only at the end) and checkpoint.keep_last >= 1")
    if r.trainer.max_nonfinite_in_row < 1:
        errs.append("trainer.max_nonfinite_in_row must be >= 1")
    if r.metrics.samples_every < 0 or r.metrics.samples_rows < 1:
        errs.append("metrics.samples_every must be >= 0 (0: off) and metrics.samples_rows >= 1")
    return errs


def registry_errors(r: Recipe) -> list[str]:
    """Names in the registries (a typo fails before anything starts, naming the nearest entry), and what the
    chosen entries declare they need (:meth:`rlvr.registry.Registry.flag`): ``needs_groups`` (G >= 2),
    ``binary_rewards`` (no fractional shaping), a policy loss's ``sequence_advantages`` against an estimator or KL
    placement that gives ``token_advantages``. Imports the registries (and so torch)."""
    import difflib

    from rlvr.algos import ADVANTAGES, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
    from rlvr.algos.gae import CRITIC_ADVANTAGES

    al, g = r.algorithm, r.rollout.samples_per_prompt
    errs: list[str] = []
    adv_reg = CRITIC_ADVANTAGES if al.advantage in CRITIC_ADVANTAGES else ADVANTAGES
    if al.advantage not in adv_reg:
        names = ADVANTAGES.names() + CRITIC_ADVANTAGES.names()
        near = difflib.get_close_matches(al.advantage, names, n=1)
        if al.advantage.lower() in ("ppo", "gae", "critic"):  # verl's adv_estimator=gae / "PPO" means a critic
            hint = "PPO with a learned critic is algorithm.advantage=gae (see recipes/methods/ppo.yaml)"
        else:
            hint = (f"did you mean '{near[0]}'? " if near else "") + f"choose from {names}"
        errs.append(f"algorithm.advantage={al.advantage!r} is not registered: {hint}")
    if g < 2 and adv_reg.flag(al.advantage, "needs_groups"):
        errs.append(f"algorithm.advantage={al.advantage} compares samples within a group: set "
                    "rollout.samples_per_prompt >= 2")  # fmt: skip
    shaped = al.overlong_buffer > 0 and al.overlong_penalty > 0
    if shaped and adv_reg.flag(al.advantage, "binary_rewards"):
        errs.append(f"algorithm.advantage={al.advantage} needs binary (0/1) rewards, and the overlong penalty "
                    "(algorithm.overlong_buffer > 0) makes them fractional: set algorithm.overlong_buffer=0")  # fmt: skip
    kl_tokens = al.kl_coef > 0 and al.kl_penalty == "reward"
    token_adv = adv_reg.flag(al.advantage, "token_advantages") or kl_tokens
    if token_adv and POLICY_LOSSES.flag(al.policy_loss, "sequence_advantages"):
        errs.append(
            f"algorithm.policy_loss={al.policy_loss} needs one advantage per sequence, but "
            + ("kl_penalty=reward" if kl_tokens and not adv_reg.flag(al.advantage, "token_advantages")
               else "advantage=" + al.advantage)
            + " gives one per token: use policy_loss=ppo_clip (or kl_penalty=loss)"
        )  # fmt: skip
    for reg, name, key in (
        (POLICY_LOSSES, al.policy_loss, "algorithm.policy_loss"),
        (LOSS_AGGREGATIONS, al.loss_agg, "algorithm.loss_agg"),
        (KL_ESTIMATORS, al.kl_estimator, "algorithm.kl_estimator"),
    ):
        if name not in reg:
            near = difflib.get_close_matches(name, reg.names(), n=1)
            hint = f"did you mean '{near[0]}'?" if near else f"choose from {reg.names()}"
            errs.append(f"{key}={name!r} is not registered: {hint}")
    return errs
