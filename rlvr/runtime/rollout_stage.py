"""The rollout stage of a training step: draw the step's prompts, generate (single-turn samples, or multi-turn
trajectories with an environment: :mod:`rlvr.envs`), score, shape the rewards, refill uninformative groups (DAPO's
dynamic sampling), drop samples older than the staleness bound, and the rollout metrics.

:func:`start_rollout` submits a step's generation and returns at once; :func:`finish_rollout` collects, scores,
shapes and refills it (so the asynchronous loop overlaps a rollout with the update: :mod:`rlvr.runtime.controller`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlvr.algos.dapo import informative_groups, overlong_penalty, select_groups
from rlvr.config import Recipe
from rlvr.metrics import names as mn
from rlvr.metrics.passk import pass_at_k
from rlvr.metrics.samples import sample_rows
from rlvr.reward.pool import Scored
from rlvr.seeding import STALE_ROUND, rollout_seed
from rlvr.types import Completion, Prompt, SamplingConfig

if TYPE_CHECKING:
    from rlvr.runtime.roles import Roles

log = logging.getLogger("rlvr")


def step_sampling(sampling: SamplingConfig, seed: int, step: int, round_: int = 0) -> SamplingConfig:
    """The sampling of one generation round of ``step``, seeded from (run seed, step, round) so a resumed run
    draws the same rollouts as an uninterrupted one (each engine seeds its sampler with it before the call)."""
    return dataclasses.replace(sampling, seed=rollout_seed(seed, step, round_))


@dataclass
class Rollout:
    """A step's rollouts: B = P x G completions (prompt-major) with their scores, the shaped rewards [P, G] the
    advantage sees, the rollout metrics, the sample-table rows and the rollout/reward timings (seconds)."""

    completions: list[Completion]
    scored: list[Scored]
    rewards: torch.Tensor
    metrics: dict[str, float]
    rows: list[dict]
    timings: dict[str, float]


def drop_stale(roll: Rollout, step: int, roles: "Roles", prompts: list[Prompt], sampling: SamplingConfig,
                r: Recipe, primary: str) -> tuple[Rollout, int]:
    """Step ``step`` updates the weights of version ``step - 1``: a group holding a sample of a policy version
    below ``step - 1 - rollout.max_staleness`` is regenerated with the engines' current weights (seeded by the
    step, round :data:`rlvr.seeding.STALE_ROUND`) and rescored, its rows of ``roll.rewards`` [P, G] shaped anew,
    and the batch's rollout metrics (reward, pass@k, lengths) recomputed on what is trained (the dropped samples'
    own are gone with them); returns (the rollout, the number of samples dropped: G per regenerated group).
    The pipeline of :func:`_one_step` never produces such samples; this bounds the lag whatever happens
    (an engine restarted with other weights, a schedule change)."""
    g = r.rollout.samples_per_prompt
    oldest = step - 1 - r.rollout.max_staleness
    stale = sorted({i // g for i, c in enumerate(roll.completions) if c.policy_version < oldest})
    if not stale:
        return roll, 0
    by_index = {p.index: p for p in prompts}
    again = [by_index[roll.completions[gi * g].prompt_index] for gi in stale]
    log.warning("step %d: %d groups hold samples older than policy version %d (rollout.max_staleness=%d): "
                "dropped and regenerated", step, len(stale), oldest, r.rollout.max_staleness)
    comps, scs, _ = roles.generate_and_score(again, step_sampling(sampling, r.run.seed, step, STALE_ROUND))
    completions, scored = list(roll.completions), list(roll.scored)
    for k, gi in enumerate(stale):
        completions[gi * g : (gi + 1) * g] = comps[k * g : (k + 1) * g]
        scored[gi * g : (gi + 1) * g] = scs[k * g : (k + 1) * g]
    rewards = roll.rewards.clone()
    rewards[stale] = shaped_rewards(comps, scs, r)
    metrics = {**roll.metrics, **rollout_metrics(completions, scored, r.pass_k, g, primary=primary)}
    return (dataclasses.replace(roll, completions=completions, scored=scored, rewards=rewards, metrics=metrics),
            len(stale) * g)


def collect_rollout(step: int, roles: "Roles", prompts: list[Prompt], sampler: Any, sampling: SamplingConfig, r: Recipe,
             primary: str, n_rows: int) -> Rollout:
    """The step's P prompts, G samples each, scored as each engine finishes; rewards shaped (DAPO's overlong
    punishment) and, with DAPO's dynamic sampling, uninformative groups replaced (:func:`refill_groups`). The
    rollout metrics describe what the policy sampled, before any group selection (which reads too high)."""
    return finish_rollout(start_rollout(step, roles, prompts, sampler, sampling, r), roles, prompts, sampler,
                           sampling, r, primary, n_rows)  # fmt: skip


@dataclass
class Started:
    """A step's rollout submitted to the engines (:func:`start_rollout`): its step, prompts and the pending calls."""

    step: int
    prompts: list[Prompt]
    pending: Any


def start_rollout(step: int, roles: "Roles", prompts: list[Prompt], sampler: Any, sampling: SamplingConfig,
                   r: Recipe) -> Started:
    """Draw the step's P prompts and submit their generation (seeded by the step); returns at once."""
    batch_prompts = [prompts[i] for i in sampler.next_batch()]
    return Started(step, batch_prompts, roles.start_rollout(batch_prompts, step_sampling(sampling, r.run.seed, step)))


def finish_rollout(started: Started, roles: "Roles", prompts: list[Prompt], sampler: Any, sampling: SamplingConfig,
                    r: Recipe, primary: str, n_rows: int) -> Rollout:
    """Collect and score a :func:`start_rollout`, then shape and (DAPO) refill it: see :func:`collect_rollout`."""
    step, batch_prompts = started.step, started.prompts
    completions, scored, timings = roles.finish_rollout(started.pending)
    roles.failures.check(step, scored)  # a console warning when a verifier fails many samples (reward.warn_error_frac)
    roles.trajectory_failures.check(step, completions)  # failure texts to train.log; environment.warn_failure_frac
    metrics = rollout_metrics(completions, scored, r.pass_k, r.rollout.samples_per_prompt, primary=primary)
    rows = sample_rows(batch_prompts, completions, scored, primary, n_rows) if n_rows else []
    rewards = shaped_rewards(completions, scored, r)  # [P, G]
    if r.algorithm.dynamic_sampling:
        t_refill = time.perf_counter()
        completions, scored, rewards, ds = refill_groups(roles.generate_and_score, prompts, sampler, sampling,
                                                          completions, scored, rewards, r, step, primary)  # fmt: skip
        metrics.update(ds)
        timings = {**timings, mn.TIMING_REFILL_S: time.perf_counter() - t_refill}
    return Rollout(completions, scored, rewards, metrics, rows, timings)


def shaped_rewards(completions: list[Completion], scored: list[Scored], r: Recipe) -> torch.Tensor:
    """Rewards [P, G] the advantage sees: the verifiers' weighted sum, plus DAPO's soft overlong punishment
    (Yu et al. 2025, eq. 13) when ``algorithm.overlong_buffer`` > 0 (the length limit is the one a sample is held
    to: ``rollout.max_new_tokens`` for one turn, a trajectory's token budget ``environment.max_tokens`` with an
    environment or tools; :func:`budget_lengths`), plus FAPO's flawed-positive penalty
    (Ding et al. 2025, sec. 4: ``-algorithm.flawed_penalty`` where the primary verifier marks a sample correct and
    the first judge verifier marks it flawed; :func:`rlvr.reward.judge.flawed_penalties`) when it is > 0."""
    from rlvr.reward.judge import flawed_penalties, judge_keys
    from rlvr.reward.pool import verifier_keys

    g = r.rollout.samples_per_prompt
    rewards = torch.tensor([s.reward for s in scored], dtype=torch.float32)  # [B]
    al = r.algorithm
    if al.overlong_buffer > 0:
        rewards = rewards + overlong_penalty(budget_lengths(completions), r.response_budget[1], al.overlong_buffer,
                                             al.overlong_penalty)  # fmt: skip
    if al.flawed_penalty > 0:  # the recipe check guarantees a judge verifier
        specs = r.reward.verifiers
        key = judge_keys(specs)[0][1]
        rewards = rewards + torch.tensor(flawed_penalties(scored, verifier_keys(specs)[0], al.flawed_penalty, key))
    return rewards.view(-1, g)


def infra_failed(completions: list[Completion]) -> list[bool]:
    """[B] True where a sample ended by an infrastructure failure (``Completion.failure``: an environment that
    raised, hung past its limit, crashed, answered garbage, gave an opening over ``data.max_prompt_tokens``, or
    whose messages the chat template refused), never the policy's outcome.

    The rule (issue 38; NeMo-RL's and open-instruct's users found such failures trained as zero rewards cost 5-15%
    of their data): such a sample is left out of the update (loss mask 0: :func:`rlvr.train.batch.pack`), out of
    its group's baseline and every batch statistic (:func:`rlvr.algos.advantages.valid_advantages`: the group is
    estimated over its other samples, as if the failed one had never been drawn), and out of the reward and pass@k
    metrics; ``rollout/excluded_frac`` counts it per step. rlvr keeps the group's other samples rather than
    failing the whole group (tinker-cookbook's choice): with a 25% failure rate and 8 samples a group, a clean
    group is 10% of groups, so dropping groups would drop most of the batch, while a group's other samples are as
    on-policy as ever. A verifier that judges an answer wrong, or runs out of time on it, is the policy's 0 and
    stays in."""
    return [c.failure is not None for c in completions]


def infra_valid(completions: list[Completion], g: int) -> torch.Tensor | None:
    """[P, G] bool: False on :func:`infra_failed` samples; None when there are none."""
    failed = infra_failed(completions)
    return torch.tensor([not f for f in failed]).view(-1, g) if any(failed) else None


def budget_lengths(completions: list[Completion]) -> torch.Tensor:
    """[B] each sample's length as its limit counts it (:attr:`rlvr.config.Recipe.response_budget`): a single-turn
    sample's response tokens (held to ``rollout.max_new_tokens``), a trajectory's every token after its first
    prompt, sampled, environment and template tokens alike (held to ``environment.max_tokens``, the budget at
    which :mod:`rlvr.envs.turns` ends it). A correct answer over three turns is measured against the budget of
    three turns, not one turn's limit."""
    return torch.tensor([len(c.token_ids) if c.end_reason is not None else c.sampled_tokens for c in completions])


def filter_signal(scored: list[Scored], rewards: torch.Tensor, r: Recipe, primary: str) -> torch.Tensor:
    """What DAPO's dynamic sampling tests for spread, [P, G]: by default (``algorithm.dynamic_sampling_filter:
    correct``) the primary verifier's correctness (score >= 1 as 1.0, else 0.0), the paper's rule
    ``0 < #correct < G`` (Yu et al. 2025, eq. 11; verl filters on accuracy too), so a length penalty alone cannot
    keep an all-correct group; ``reward``: the shaped rewards the advantage sees (``rewards`` [P, G])."""
    if r.algorithm.dynamic_sampling_filter == "reward":
        signal = rewards
    else:
        signal = torch.tensor([float(s.results[primary].score >= 1.0) for s in scored]).view(rewards.shape)  # [P, G]
    return signal


def _no_spread_from(signal: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """``signal`` [P, G] with each infrastructure failure's entry (``valid`` False) set to its group's first valid
    entry, so that failures add no spread to a group (:func:`refill_groups`); a group with no valid sample is made
    constant."""
    if valid is None:
        return signal
    first = torch.where(valid.any(-1), valid.float().argmax(-1), torch.zeros(valid.shape[0], dtype=torch.long))
    fill = signal.gather(1, first.unsqueeze(-1)).expand_as(signal)
    return torch.where(valid, signal, fill)


def refill_groups(generate, prompts, sampler, sampling, completions, scored, rewards, r: Recipe, step: int = 0,
                  primary: str | None = None):
    """DAPO dynamic sampling (Yu et al. 2025, sec. 3.2): drop groups that carry no signal (:func:`filter_signal`:
    all correct or all wrong by default; all-equal shaped rewards with ``dynamic_sampling_filter: reward``) and
    generate more prompts' groups until P informative groups are at hand or
    ``algorithm.dynamic_sampling_max_rounds`` extra rounds are spent; a shortfall is filled with the first
    uninformative groups, so the batch keeps its size. ``primary``: the verifier whose score >= 1 means correct
    (None: the first). Returns (completions, scored, rewards [P, G], metrics)."""
    from rlvr.reward.pool import verifier_keys

    primary = primary or verifier_keys(r.reward.verifiers)[0]
    p, g = rewards.shape
    comps, scs, rws, rounds = list(completions), list(scored), [rewards], 0
    signals = [_no_spread_from(filter_signal(scored, rewards, r, primary), infra_valid(completions, g))]
    while int(informative_groups(torch.cat(signals)).sum()) < p and rounds < r.algorithm.dynamic_sampling_max_rounds:
        c2, s2, _ = generate([prompts[i] for i in sampler.next_batch()],
                                             step_sampling(sampling, r.run.seed, step, rounds + 1))
        comps += c2
        scs += s2
        rws.append(shaped_rewards(c2, s2, r))
        signals.append(_no_spread_from(filter_signal(s2, rws[-1], r, primary), infra_valid(c2, g)))
        rounds += 1
    all_rewards = torch.cat(rws)  # [P x (rounds + 1), G]
    informative = informative_groups(torch.cat(signals))
    keep = select_groups(informative, p).tolist()
    metrics = {
        mn.DYNAMIC_SAMPLING_ROUNDS: float(rounds),
        mn.DYNAMIC_SAMPLING_SHORTFALL: float(max(0, p - int(informative.sum()))),
        mn.DYNAMIC_SAMPLING_INFORMATIVE_FRAC: float(informative.float().mean()),
    }
    kept_c = [comps[i * g + j] for i in keep for j in range(g)]
    kept_s = [scs[i * g + j] for i in keep for j in range(g)]
    return kept_c, kept_s, all_rewards[keep], metrics


def rollout_metrics(completions: list[Completion], scored: list[Scored], ks: tuple[int, ...], g: int, primary: str) -> dict[str, float]:
    """Reward, pass@k and length metrics of one rollout batch (B = P x G completions, prompt-major).

    A sample is *correct* when the primary (first) verifier gives it full marks (score >= 1); pass@k is the
    unbiased estimator (Chen et al. 2021, eq. 1) over each prompt's G samples, averaged over the P prompts.
    Length metrics count sampled tokens (a multi-turn trajectory's environment and template tokens are not the
    model's); means are over the B samples; ``reward/std`` is the population std (normaliser B); pass@k means are
    over the P prompts. With a judge verifier, its fractions (:func:`rlvr.reward.judge.judge_metrics`); with an
    environment (trajectories: ``end_reason`` set), the turn metrics: turns per trajectory, the share solved after
    turn 1, and the shares ended by an environment failure, a broken template prefix, the token budget, a turn
    cut at the token limit and a turn that stopped on another end id (all over the B trajectories), and
    ``rollout/excluded_frac``.

    Infrastructure failures (:func:`infra_failed`) are not the policy's outcome: the reward, correctness and pass@k
    metrics are over the B' samples left (normaliser B'); pass@k over the groups with a sample left (every k over
    the same groups, so it never falls as k grows), a group left with n' < k samples counting pass@n' (its best
    estimate, a lower bound of its pass@k); lengths and turn metrics are over all B.
    """
    from rlvr.reward.judge import judge_metrics
    from rlvr.reward.pool import reward_metrics

    b = len(completions)
    failed = infra_failed(completions)
    kept = [s for s, f in zip(scored, failed) if not f]
    correct = [s.results[primary].score >= 1.0 for s in scored]
    lengths = [c.sampled_tokens for c in completions]
    out: dict[str, float] = {
        mn.RESPONSE_LENGTH_MEAN: sum(lengths) / b,
        mn.RESPONSE_LENGTH_MAX: float(max(lengths)),
        mn.RESPONSE_TRUNCATED_FRAC: sum(c.truncated for c in completions) / b,
    }
    if kept:
        out.update(reward_metrics(kept))
        out[mn.REWARD_STD] = float(torch.tensor([s.reward for s in kept]).std(unbiased=False))
        out[mn.REWARD_CORRECT_FRAC] = sum(ok for ok, f in zip(correct, failed) if not f) / len(kept)
        out.update(judge_metrics(kept, primary))  # reward/flawed_positive_frac ... when a judge verifier ran
    groups = [[ok for ok, f in zip(correct[i : i + g], failed[i : i + g]) if not f] for i in range(0, b, g)]
    seen = [gr for gr in groups if gr]
    if seen:  # every k over the same groups; a group left with n' < k samples gives pass@n' (a lower bound)
        for k in ks:
            out[mn.passk(k)] = sum(pass_at_k(len(gr), sum(gr), min(k, len(gr))) for gr in seen) / len(seen)
        out[mn.GROUPS_ALL_CORRECT_FRAC] = sum(all(gr) for gr in seen) / len(seen)
        out[mn.GROUPS_NONE_CORRECT_FRAC] = sum(not any(gr) for gr in seen) / len(seen)
    if any(c.end_reason is not None for c in completions):  # multi-turn trajectories
        ends = [c.end_reason or "" for c in completions]
        out[mn.ROLLOUT_TURNS_MEAN] = sum(c.turns for c in completions) / b
        out[mn.ROLLOUT_SOLVED_AFTER_TURN_1] = sum(ok and c.turns > 1 and not f for ok, c, f
                                                  in zip(correct, completions, failed)) / max(len(kept), 1)  # fmt: skip
        out[mn.ROLLOUT_ENV_FAILED_FRAC] = sum(e.startswith("env:") for e in ends) / b
        out[mn.ROLLOUT_PREFIX_BROKEN_FRAC] = sum(e == "prefix_broken" for e in ends) / b
        out[mn.ROLLOUT_BUDGET_END_FRAC] = sum(e == "budget" for e in ends) / b
        out[mn.ROLLOUT_LENGTH_END_FRAC] = sum(e == "length" for e in ends) / b
        out[mn.ROLLOUT_STOP_ID_END_FRAC] = sum(e == "stop_id" for e in ends) / b
        out[mn.ROLLOUT_EXCLUDED_FRAC] = sum(failed) / b
    return out
