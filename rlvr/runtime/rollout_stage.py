"""The rollout stage of a training step: one batch, top to bottom in this module.

The walk of one batch (:class:`RolloutStage`, driven by :func:`rlvr.runtime.controller._one_step`):

1. :meth:`RolloutStage.take` submits step s + N's batch (:meth:`~RolloutStage.submit`:
   :meth:`~RolloutStage.start` draws the step's P prompts, :func:`submit_rollout` hands them to the engines, split
   evenly, or to the multi-turn turn loop, :mod:`rlvr.envs.rollout`, seeded by the step);
2. at N = 0 it collects that batch at once (:meth:`~RolloutStage.collect` -> :meth:`~RolloutStage.finish`); at
   N >= 1 the controller collects it beside the update (:meth:`~RolloutStage.collect_ahead`);
3. :meth:`~RolloutStage.finish`: :func:`collect_scored` waits for the engines and scores each engine's part as it
   finishes (:func:`_collect_once`; trajectories: :func:`_collect_turns`), replacing a dead engine and retrying;
   the judge role's verdicts merged in (:func:`_judged`); the failure watches; the rollout metrics
   (:func:`rollout_metrics`) and sample rows; the rewards shaped (:func:`shaped_rewards`); DAPO's dynamic
   sampling refills uninformative groups (:func:`refill_groups`);
4. :meth:`~RolloutStage.take` pops step s's batch and drops (regenerates) the samples older than the staleness
   bound (:meth:`~RolloutStage.drop_stale`), returning what step s trains on.

:func:`generate_and_score` and :func:`rule_scores` are one round of 1 and 3 on any prompts (validation, the DPH-RL
buffer, the regenerations). :class:`~rlvr.runtime.roles.Roles` only holds the role handles this module calls.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from rlvr.algos.dapo import informative_groups, overlong_penalty, select_groups
from rlvr.config import Recipe
from rlvr.envs.watch import TrajectoryWatch
from rlvr.metrics import names as mn
from rlvr.metrics.passk import pass_at_k
from rlvr.metrics.samples import sample_rows
from rlvr.reward.judge import NOT_JUDGED, JudgeItem, judge_keys, merge_judged, selected, settings_of
from rlvr.reward.pool import FailureWatch, Scored, verifier_keys
from rlvr.runtime.executors import RoleError
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
    advantage sees, the rollout metrics, the sample-table rows and the rollout/reward timings (seconds).
    (Pickled by its module path into checkpoints, ``checkpoint.AHEAD``: it stays in this module.)"""

    completions: list[Completion]
    scored: list[Scored]
    rewards: torch.Tensor
    metrics: dict[str, float]
    rows: list[dict]
    timings: dict[str, float]


@dataclass
class Started:
    """A step's rollout submitted to the engines (:meth:`RolloutStage.start`): its step, prompts and the pending
    calls (a :class:`PendingRollout`)."""

    step: int
    prompts: list[Prompt]
    pending: Any


class RolloutStage:
    """The rollout pipeline of a run: which batch is submitted, collected and trained at each step.

    With ``rollout.max_staleness`` = N >= 1 (asynchronous rollout) step s trains on the batch generated N steps
    ago and step s + N's is generated while s trains; at N = 0 each batch is generated and collected first. With
    ``rollout.in_flight_updates`` the N batches s + 1 .. s + N stay in flight on the engines across the syncs
    (their tokens labelled by the versions that sampled them, :mod:`rlvr.rollout.inflight`), each collected when
    its step takes it.
    State, keyed by step: :attr:`started` (submitted to the engines, not yet collected) and :attr:`ahead` (collected,
    not yet trained: what a checkpoint saves, :meth:`ahead_state`). ``rows_of(step)``: how many sample-table rows
    the step's batch keeps (0: none). The watches warn on verifiers (``reward.warn_error_frac``) and environments
    (``environment.warn_failure_frac``) failing a batch's samples."""

    def __init__(self, roles: "Roles", prompts: list[Prompt], sampler: Any, sampling: SamplingConfig, recipe: Recipe,
                 primary: str, rows_of: Callable[[int], int]) -> None:
        r = recipe
        self.roles, self.prompts, self.sampler, self.sampling = roles, prompts, sampler, sampling
        self.recipe, self.primary, self.rows_of = r, primary, rows_of
        self.n = r.rollout.max_staleness
        self.in_flight = r.rollout.in_flight_updates
        self.started: dict[int, Started] = {}
        self.ahead: dict[int, Rollout] = {}
        self.failures = FailureWatch(r.reward.warn_error_frac)
        multi_turn = r.environment.enabled or r.tools.enabled  # the key is checked at load only then
        self.trajectory_failures = TrajectoryWatch(r.environment.warn_failure_frac if multi_turn else None)

    # -- the pipeline, by step -------------------------------------------------------------------------------------
    def fill(self, first: int, resume_from: Path | None) -> None:
        """The batches of steps ``first .. first + N - 1`` that asynchronous rollout has generated before step
        ``first`` trains: read back from the checkpoint resumed from, or, at a fresh start, generated now with the
        starting weights (version 0). Nothing for the on-policy loop.
        Errors: :class:`~rlvr.config.RecipeError` when the checkpoint lacks them (it was written by another loop)."""
        from rlvr.runtime import checkpoint as ck

        if not self.n:
            return
        if resume_from is not None:
            path = Path(resume_from) / ck.AHEAD
            if not path.exists():
                from rlvr.config import RecipeError

                raise RecipeError(f"{resume_from} holds no batches generated ahead ({ck.AHEAD}): it was not written by "
                                  f"a run with rollout.max_staleness={self.n}; resume with the checkpoint's own setting")
            self.ahead = torch.load(path, weights_only=False)
            return
        for j in range(first, first + self.n):
            self.submit(j)
            if not self.in_flight:  # in flight: collected when its step needs it (take)
                self.collect(j)

    def take(self, step: int) -> tuple[Rollout, int]:
        """The batch step ``step`` trains on, and the number of its samples dropped as too stale: submits the
        generation of step + N (also past ``run.steps`` when N >= 1: the last N batches go to the final checkpoint,
        so a run continued for more steps trains on what an uninterrupted one would), at N = 0 collects it at once,
        then pops step's batch and regenerates its stale groups (:meth:`drop_stale`)."""
        self.submit(step + self.n)
        if step in self.started:  # N = 0: generate and score before the update; in flight: wait for it now
            self.collect(step)
        return self.drop_stale(self.ahead.pop(step), step)

    def collect_ahead(self, step: int) -> None:
        """Under asynchronous rollout without in-flight updates, collect and score step + N's batch (submitted by
        :meth:`take`) while step's update runs, so the engines are idle at the sync; nothing at N = 0 or in flight
        (the engines keep their batches across the sync; each is collected when its step takes it)."""
        if self.n and not self.in_flight:
            self.collect(step + self.n)

    def drain(self) -> None:
        """Collect every batch still in flight, oldest first (in-flight updates): each finishes under the weights
        it has, and is kept with its tokens, their versions and behaviour logprobs in :attr:`ahead`. Called before
        the sync of a step that writes a checkpoint, so that the checkpoint, and the run after it, do not depend on
        where an update would have landed (the deterministic drain of exact resume)."""
        for step in sorted(self.started):
            self.collect(step)

    def engine_usage(self) -> dict[str, float]:
        """In flight, each engine loop's time since the last call (:meth:`rlvr.rollout.inflight.EngineLoop.usage`):
        ``async/engine_busy_frac`` (decode steps over wall time) and ``async/engine_load_frac`` (weight loads),
        means over the engines; empty otherwise. (The role-call spans, ``roles/*``, cannot see inside an engine
        whose calls stay open across steps.)"""
        if not self.in_flight:
            return {}
        got = self.roles.get([e.call("loop_usage") for e in self.roles.engines], self.recipe.timeouts.rollout_s,
                             "reading the engines' loop usage", "timeouts.rollout_s")  # fmt: skip
        got = [u for u in got if u.get("window_s", 0) > 0]
        if not got:
            return {}
        return {mn.ASYNC_ENGINE_BUSY_FRAC: sum(u["step_s"] / u["window_s"] for u in got) / len(got),
                mn.ASYNC_ENGINE_LOAD_FRAC: sum(u["load_s"] / u["window_s"] for u in got) / len(got)}

    def ahead_state(self) -> dict[int, Rollout]:
        """What a checkpoint keeps of the pipeline (``checkpoint.AHEAD``): the batches generated for the next steps
        (their weights are gone once the trainer moves on), batches still in flight collected first
        (:meth:`drain`); empty for the on-policy loop."""
        self.drain()
        return self.ahead

    def submit(self, step: int) -> None:
        """Submit step ``step``'s generation (:meth:`start`); collected by :meth:`collect`."""
        self.started[step] = self.start(step)

    def collect(self, step: int) -> None:
        """Collect, score, shape and refill step ``step``'s submitted batch (:meth:`finish`) into :attr:`ahead`."""
        self.ahead[step] = self.finish(self.started.pop(step))

    # -- one batch -------------------------------------------------------------------------------------------------
    def start(self, step: int) -> Started:
        """Draw the step's P prompts and submit their generation (seeded by the step); returns at once."""
        batch_prompts = [self.prompts[i] for i in self.sampler.next_batch()]
        sampling = step_sampling(self.sampling, self.recipe.run.seed, step)
        return Started(step, batch_prompts, submit_rollout(self.roles, batch_prompts, sampling))

    def finish(self, started: Started) -> Rollout:
        """The step's P prompts, G samples each, collected and scored as each engine finishes
        (:func:`collect_scored`); rewards shaped (DAPO's overlong punishment) and, with DAPO's dynamic sampling,
        uninformative groups replaced (:func:`refill_groups`). The rollout metrics describe what the policy
        sampled, before any group selection (which reads too high)."""
        r, primary, step = self.recipe, self.primary, started.step
        completions, scored, timings = collect_scored(self.roles, started.pending)
        self.failures.check(step, scored)  # a console warning when a verifier fails many samples (reward.warn_error_frac)
        self.trajectory_failures.check(step, completions)  # failure texts to train.log; environment.warn_failure_frac
        metrics = rollout_metrics(completions, scored, r.pass_k, r.rollout.samples_per_prompt, primary=primary)
        n_rows = self.rows_of(step)
        rows = sample_rows(started.prompts, completions, scored, primary, n_rows) if n_rows else []
        rewards = shaped_rewards(completions, scored, r)  # [P, G]
        if r.algorithm.dynamic_sampling:
            t_refill = time.perf_counter()
            completions, scored, rewards, ds = refill_groups(functools.partial(generate_and_score, self.roles),
                                                              self.prompts, self.sampler, self.sampling, completions,
                                                              scored, rewards, r, step, primary)  # fmt: skip
            metrics.update(ds)
            timings = {**timings, mn.TIMING_REFILL_S: time.perf_counter() - t_refill}
        return Rollout(completions, scored, rewards, metrics, rows, timings)

    def drop_stale(self, roll: Rollout, step: int) -> tuple[Rollout, int]:
        """Step ``step`` updates the weights of version ``step - 1``: a group holding a sample of a policy version
        below ``step - 1 - rollout.max_staleness`` is regenerated with the engines' current weights (seeded by the
        step, round :data:`rlvr.seeding.STALE_ROUND`) and rescored, its rows of ``roll.rewards`` [P, G] shaped anew,
        and the batch's rollout metrics (reward, pass@k, lengths) recomputed on what is trained (the dropped
        samples' own are gone with them); returns (the rollout, the number of samples dropped: G per regenerated
        group). The pipeline never produces such samples; this bounds the lag whatever happens (an engine restarted
        with other weights, a schedule change)."""
        r = self.recipe
        g = r.rollout.samples_per_prompt
        oldest = step - 1 - r.rollout.max_staleness
        stale = sorted({i // g for i, c in enumerate(roll.completions) if c.policy_version < oldest})
        if not stale:
            return roll, 0
        by_index = {p.index: p for p in self.prompts}
        again = [by_index[roll.completions[gi * g].prompt_index] for gi in stale]
        log.warning("step %d: %d groups hold samples older than policy version %d (rollout.max_staleness=%d): "
                    "dropped and regenerated", step, len(stale), oldest, r.rollout.max_staleness)
        comps, scs, _ = generate_and_score(self.roles, again, step_sampling(self.sampling, r.run.seed, step, STALE_ROUND))
        completions, scored = list(roll.completions), list(roll.scored)
        for k, gi in enumerate(stale):
            completions[gi * g : (gi + 1) * g] = comps[k * g : (k + 1) * g]
            scored[gi * g : (gi + 1) * g] = scs[k * g : (k + 1) * g]
        rewards = roll.rewards.clone()
        rewards[stale] = shaped_rewards(comps, scs, r)
        metrics = {**roll.metrics, **rollout_metrics(completions, scored, r.pass_k, g, primary=self.primary)}
        return (dataclasses.replace(roll, completions=completions, scored=scored, rewards=rewards, metrics=metrics),
                len(stale) * g)


# -- generation and scoring on the engines: one round on any prompts --------------------------------------------------
@dataclass
class PendingRollout:
    """A rollout submitted to the engines (:func:`submit_rollout`) and not yet collected: the prompts, the
    sampling, each engine's share (``chunks``), its generate calls and the submission time (``time.perf_counter``)."""

    prompts: list[Prompt]
    sampling: SamplingConfig
    chunks: list[list[Prompt]]
    calls: list
    t0: float
    judge: bool = True
    """Ask the judge role about the scored samples (training rollouts); False for validation and the DPH buffer."""
    engines: list = field(default_factory=list)
    """The engine handles the calls went to (an engine replaced since is not restarted again for them)."""


def generate_and_score(roles: "Roles", prompts: list[Prompt], sampling: SamplingConfig,
                       judge: bool = True) -> tuple[list[Completion], list[Scored], dict[str, float]]:
    """Roll out ``prompts`` (split evenly over the engines) and score every completion: :func:`submit_rollout`
    then :func:`collect_scored`. Returns (completions [B], scored [B], timings), both prompt-major in input
    order (B = len(prompts) x G). ``judge=False``: the rule verifiers only (validation: pass@k is the
    primary verifier's; the results then hold no judge key)."""
    return collect_scored(roles, submit_rollout(roles, prompts, sampling, judge))


def rule_scores(roles: "Roles", prompts: list[Prompt],
                sampling: SamplingConfig) -> tuple[list[Completion], list[Scored], dict[str, float]]:
    """:func:`generate_and_score` without the judge (validation, the DPH-RL buffer)."""
    return generate_and_score(roles, prompts, sampling, judge=False)


def submit_rollout(roles: "Roles", prompts: list[Prompt], sampling: SamplingConfig, judge: bool = True) -> PendingRollout:
    """Submit the generation of ``prompts`` (split evenly over the engines) and return at once. Each engine runs
    its calls in order, so the rollout uses the weights of the last sync submitted before it."""
    if roles.turns is not None:  # multi-turn: the turn loop's thread calls the engines round by round
        future = roles.turns.submit(prompts, sampling, functools.partial(generate_round, roles))
        return PendingRollout(prompts, sampling, [prompts], [future], time.perf_counter(), judge, list(roles.engines))
    chunks, gen = _submit_generate(roles, prompts, sampling)
    return PendingRollout(prompts, sampling, chunks, gen, time.perf_counter(), judge, list(roles.engines))


def _submit_generate(roles: "Roles", prompts: list[Prompt], sampling: SamplingConfig) -> tuple[list[list[Prompt]], list]:
    """``prompts`` split evenly over the engines, each share's generate call submitted: (shares, calls)."""
    e = len(roles.engines)
    per = (len(prompts) + e - 1) // e
    chunks = [prompts[i * per : (i + 1) * per] for i in range(e)]
    return chunks, [eng.call("generate", chunk, sampling) for eng, chunk in zip(roles.engines, chunks)]


def generate_round(roles: "Roles", prompts: list[Prompt], sampling: SamplingConfig) -> list[Completion]:
    """Generate ``prompts`` on the engines (split evenly) and wait: completions in input order, unscored (one
    round of the turn loop). Errors: :class:`RoleError` (an engine failed or overran ``timeouts.rollout_s``)."""
    _, calls = _submit_generate(roles, prompts, sampling)
    parts = roles.get(calls, roles.recipe.timeouts.rollout_s, "rollout", "timeouts.rollout_s")
    return [c for part in parts for c in part]


def collect_scored(roles: "Roles", pending: PendingRollout) -> tuple[list[Completion], list[Scored], dict[str, float]]:
    """Wait for a :func:`submit_rollout` and score it: each engine's part goes to the reward worker as soon as
    that engine finishes, so scoring overlaps with the engines still generating.

    An engine whose process dies is replaced and given the current weights
    (:meth:`~rlvr.runtime.roles.Roles.restart_dead_engines`), and the whole rollout is retried (seeded sampling
    draws the same samples), up to ``rollout.max_restarts`` times per run; ``timing/engine_restarts`` counts the
    restarts so far. A call that went to an engine replaced since (it died in another rollout queued behind this
    one) is retried on the replacement, which is not restarted again. Returns (completions [B], scored [B],
    timings). Timings: ``timing/rollout_s`` (from the submission until the last engine finished: with
    asynchronous rollout this includes the wait behind the engines' earlier calls) and ``timing/reward_s``
    (from then until the last score arrived: the reward time not hidden by rollout) and, when a judge verifier
    asked the judge role (training rollouts; :func:`_judged`), ``timing/judge_s`` (its verdicts, after that).
    Errors: :class:`RoleError` (a role failed, timed out, or the restarts are spent)."""
    while True:
        try:
            out = _collect_once(roles, pending)
            out[2][mn.TIMING_ENGINE_RESTARTS] = float(roles.restarts)
            return out
        except RoleError as err:
            if not (err.died and (err.role or "").startswith("engine")):
                raise
            role = err.role or ""
            i = int(role[len("engine"):]) if role[len("engine"):].isdigit() else None
            if i is not None and i < len(pending.engines) and pending.engines[i] is not roles.engines[i]:
                # the call went to an engine replaced since (it died during another rollout, e.g. the
                # regeneration of stale groups queued behind this one): retry on its replacement, restart nothing
                log.warning("%s; engine%d was replaced since this rollout was submitted: retrying it on the "
                            "replacement", err, i)
                pending = submit_rollout(roles, pending.prompts, pending.sampling, pending.judge)
                continue
            if roles.restarts >= roles.recipe.rollout.max_restarts:
                raise
            roles.restarts += 1
            log.warning("%s; replacing it (restart %d of at most %d) and retrying the rollout", err,
                        roles.restarts, roles.recipe.rollout.max_restarts)
            replaced = roles.restart_dead_engines((i,) if i is not None else ())
            log.warning("engines %s replaced and given policy version %d", replaced, roles.version)
            pending = submit_rollout(roles, pending.prompts, pending.sampling, pending.judge)


def _collect_once(roles: "Roles", pending: PendingRollout) -> tuple[list[Completion], list[Scored], dict[str, float]]:
    """One try of :func:`collect_scored`: each engine's part scored as that engine finishes, then judged."""
    if roles.turns is not None:
        return _collect_turns(roles, pending)
    r = roles.recipe
    t0, chunks, e = pending.t0, pending.chunks, len(pending.calls)
    parts: list[list[Completion]] = [[] for _ in range(e)]
    score_calls: list = [None] * e
    for i, part in roles.as_completed(pending.calls, r.timeouts.rollout_s, "rollout", "timeouts.rollout_s"):
        parts[i] = part
        by_index = {p.index: p for p in chunks[i]}
        golds = [by_index[c.prompt_index].gold for c in part]
        rows = [by_index[c.prompt_index].row for c in part]
        score_calls[i] = roles.reward.call("score", [c.text for c in part], golds, rows)
    t_rollout = time.perf_counter() - t0
    scored = [s for part in roles.get(score_calls, r.timeouts.reward_s, "reward", "timeouts.reward_s") for s in part]
    t_reward = time.perf_counter() - t0 - t_rollout
    completions = [c for part in parts for c in part]
    timings = {mn.TIMING_ROLLOUT_S: t_rollout, mn.TIMING_REWARD_S: t_reward}
    if roles.judge is not None and pending.judge:
        t1 = time.perf_counter()
        prompt_of = {p.index: p for chunk in chunks for p in chunk}
        scored = _judged(roles, completions, scored, prompt_of)
        timings[mn.TIMING_JUDGE_S] = time.perf_counter() - t1
    return completions, scored, timings


def _collect_turns(roles: "Roles", pending: PendingRollout) -> tuple[list[Completion], list[Scored], dict[str, float]]:
    """Collect a multi-turn rollout (the turn loop's thread, within ``timeouts.rollout_s``), score each
    trajectory's final answer with the verifiers, and set each reward as ``environment.reward`` says, times
    ``environment.turn_discount ** (turns - 1)`` (:func:`rlvr.envs.rollout.trajectory_rewards`)."""
    from rlvr.envs.rollout import scoring_rows, trajectory_rewards

    r, t0 = roles.recipe, pending.t0
    try:
        completions, env_metrics = pending.calls[0].result(timeout=r.timeouts.rollout_s)
    except TimeoutError:
        raise RoleError(f"{roles.what('multi-turn rollout')} did not finish within timeouts.rollout_s="
                        f"{r.timeouts.rollout_s:.0f} s; raise timeouts.rollout_s, or lower environment.max_turns "
                        "or rollout.max_new_tokens", timed_out=True) from None
    t_rollout = time.perf_counter() - t0
    prompt_of = {p.index: p for p in pending.prompts}
    golds = [prompt_of[c.prompt_index].gold for c in completions]
    rows = scoring_rows(completions, [prompt_of[c.prompt_index].row for c in completions])
    scored = roles.get([roles.reward.call("score", [c.text for c in completions], golds, rows)],
                       r.timeouts.reward_s, "reward", "timeouts.reward_s")[0]  # fmt: skip
    timings = {mn.TIMING_ROLLOUT_S: t_rollout, mn.TIMING_REWARD_S: time.perf_counter() - t0 - t_rollout,
               **env_metrics}
    if roles.judge is not None and pending.judge:
        t1 = time.perf_counter()
        scored = _judged(roles, completions, scored, prompt_of)
        timings[mn.TIMING_JUDGE_S] = time.perf_counter() - t1
    return completions, trajectory_rewards(completions, scored, r.environment), timings


def _judged(roles: "Roles", completions: list[Completion], scored: list[Scored],
            prompt_of: dict[int, Prompt]) -> list[Scored]:
    """``scored`` [B] with each judge verifier's verdicts merged in (:func:`rlvr.reward.judge.merge_judged`):
    one call on the judge role per judge verifier, on the samples it judges (``only_correct``: those the
    primary verifier marks correct; the others ``not_judged``). Two verdicts of the step go to ``train.log``.
    Errors: :class:`RoleError` when the judge role fails or overruns ``timeouts.reward_s``."""
    from rlvr.types import VerifyResult

    specs = roles.recipe.reward.verifiers
    keys = verifier_keys(specs)
    primary = keys[0]
    judged: dict[str, list[VerifyResult]] = {}
    for i, key in judge_keys(specs):
        js = settings_of(specs[i], f"reward.verifiers[{i}].args")
        picked = selected(scored, primary, js.only_correct)
        asked = [(prompt_of[completions[j].prompt_index], completions[j].text) for j in picked]
        items = [JudgeItem(question=p.question or p.text, response=text, gold=p.gold) for p, text in asked]
        verdicts, texts = (roles.get([roles.judge.call("judge_with_text", items, js)], roles.recipe.timeouts.reward_s,
                                     f"judging {len(items)} samples ({key})", "timeouts.reward_s")[0]
                           if items else ([], []))  # fmt: skip
        out = [VerifyResult(score=0.0, parsed=None, reason=NOT_JUDGED)] * len(scored)
        for j, v in zip(picked, verdicts):
            out[j] = v
        judged[key] = out
        for j, text, v in list(zip(picked, texts, verdicts))[:2]:
            log.info("step %d: %s verdict on sample %d: %r -> score %s, parsed %s, reason %s", roles.step, key, j,
                     text[:400], v.score, v.parsed, v.reason, extra={"console": False})  # fmt: skip
    return merge_judged(scored, judged, {k: s.weight for k, s in zip(keys, specs)})


# -- rewards, the DAPO filter and the metrics of a batch: pure functions ----------------------------------------------
def shaped_rewards(completions: list[Completion], scored: list[Scored], r: Recipe) -> torch.Tensor:
    """Rewards [P, G] the advantage sees: the verifiers' weighted sum, plus DAPO's soft overlong punishment
    (Yu et al. 2025, eq. 13) when ``algorithm.overlong_buffer`` > 0 (the length limit is the one a sample is held
    to: ``rollout.max_new_tokens`` for one turn, a trajectory's token budget ``environment.max_tokens`` with an
    environment or tools; :func:`budget_lengths`), plus FAPO's flawed-positive penalty
    (Ding et al. 2025, sec. 4: ``-algorithm.flawed_penalty`` where the primary verifier marks a sample correct and
    the first judge verifier marks it flawed; :func:`rlvr.reward.judge.flawed_penalties`) when it is > 0."""
    from rlvr.reward.judge import flawed_penalties

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
