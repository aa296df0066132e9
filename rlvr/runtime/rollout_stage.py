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
    (Yu et al. 2025, eq. 13) when ``algorithm.overlong_buffer`` > 0, plus FAPO's flawed-positive penalty
    (Ding et al. 2025, sec. 4: ``-algorithm.flawed_penalty`` where the primary verifier marks a sample correct and
    the first judge verifier marks it flawed; :func:`rlvr.reward.judge.flawed_penalties`) when it is > 0."""
    from rlvr.reward.judge import flawed_penalties, judge_keys
    from rlvr.reward.pool import verifier_keys

    g = r.rollout.samples_per_prompt
    rewards = torch.tensor([s.reward for s in scored], dtype=torch.float32)  # [B]
    al = r.algorithm
    if al.overlong_buffer > 0:
        lengths = torch.tensor([c.sampled_tokens for c in completions])
        rewards = rewards + overlong_penalty(lengths, r.rollout.max_new_tokens, al.overlong_buffer, al.overlong_penalty)
    if al.flawed_penalty > 0:  # the recipe check guarantees a judge verifier
        specs = r.reward.verifiers
        key = judge_keys(specs)[0][1]
        rewards = rewards + torch.tensor(flawed_penalties(scored, verifier_keys(specs)[0], al.flawed_penalty, key))
    return rewards.view(-1, g)


def filter_signal(scored: list[Scored], rewards: torch.Tensor, r: Recipe, primary: str) -> torch.Tensor:
    """What DAPO's dynamic sampling tests for spread, [P, G]: by default (``algorithm.dynamic_sampling_filter:
    correct``) the primary verifier's correctness (score >= 1 as 1.0, else 0.0), the paper's rule
    ``0 < #correct < G`` (Yu et al. 2025, eq. 11; verl filters on accuracy too), so a length penalty alone cannot
    keep an all-correct group; ``reward``: the shaped rewards the advantage sees (``rewards`` [P, G])."""
    if r.algorithm.dynamic_sampling_filter == "reward":
        return rewards
    correct = torch.tensor([float(s.results[primary].score >= 1.0) for s in scored])  # [B]
    return correct.view(rewards.shape)


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
    signals = [filter_signal(scored, rewards, r, primary)]
    while int(informative_groups(torch.cat(signals)).sum()) < p and rounds < r.algorithm.dynamic_sampling_max_rounds:
        c2, s2, _ = generate([prompts[i] for i in sampler.next_batch()],
                                             step_sampling(sampling, r.run.seed, step, rounds + 1))
        comps += c2
        scs += s2
        rws.append(shaped_rewards(c2, s2, r))
        signals.append(filter_signal(s2, rws[-1], r, primary))
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
    turn 1, and the shares ended by an environment failure, a broken template prefix, the token budget and a turn
    cut at the token limit (all over the B trajectories).
    """
    from rlvr.reward.judge import judge_metrics
    from rlvr.reward.pool import reward_metrics

    b = len(completions)
    correct = [s.results[primary].score >= 1.0 for s in scored]
    lengths = [c.sampled_tokens for c in completions]
    out: dict[str, float] = {
        **reward_metrics(scored),
        mn.REWARD_STD: float(torch.tensor([s.reward for s in scored]).std(unbiased=False)),
        mn.REWARD_CORRECT_FRAC: sum(correct) / b,
        mn.RESPONSE_LENGTH_MEAN: sum(lengths) / b,
        mn.RESPONSE_LENGTH_MAX: float(max(lengths)),
        mn.RESPONSE_TRUNCATED_FRAC: sum(c.truncated for c in completions) / b,
    }
    groups = [correct[i : i + g] for i in range(0, b, g)]
    for k in ks:
        out[mn.passk(k)] = sum(pass_at_k(g, sum(gr), k) for gr in groups) / len(groups)
    out[mn.GROUPS_ALL_CORRECT_FRAC] = sum(all(gr) for gr in groups) / len(groups)
    out[mn.GROUPS_NONE_CORRECT_FRAC] = sum(not any(gr) for gr in groups) / len(groups)
    out.update(judge_metrics(scored, primary))  # reward/flawed_positive_frac ... when a judge verifier ran
    if any(c.end_reason is not None for c in completions):  # multi-turn trajectories
        ends = [c.end_reason or "" for c in completions]
        out[mn.ROLLOUT_TURNS_MEAN] = sum(c.turns for c in completions) / b
        out[mn.ROLLOUT_SOLVED_AFTER_TURN_1] = sum(ok and c.turns > 1 for ok, c in zip(correct, completions)) / b
        out[mn.ROLLOUT_ENV_FAILED_FRAC] = sum(e.startswith("env:") for e in ends) / b
        out[mn.ROLLOUT_PREFIX_BROKEN_FRAC] = sum(e == "prefix_broken" for e in ends) / b
        out[mn.ROLLOUT_BUDGET_END_FRAC] = sum(e == "budget" for e in ends) / b
        out[mn.ROLLOUT_LENGTH_END_FRAC] = sum(e == "length" for e in ends) / b
    return out
