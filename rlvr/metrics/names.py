"""Every metric name rlvr logs, built in one place, with its unit and meaning (:data:`CATALOGUE`).

A name is ``namespace/rest``. The producers (the controller, the roles, the reward pool, the trainers,
validation, the sync probe) build their names from this module, and so do the readers (``rlvr plot``'s panels,
the console's progress line, ``rlvr train``'s final line); the strings are what ``RUN/metrics.jsonl``, the
logging backends and checkpoints' ``best_metric`` see, so a change here renames a metric for every user.

Namespaces (per training step unless said otherwise):

- ``reward/``: the reward of the step's B = P x G rollouts (means over the B samples), the verifiers' failure
  fractions and latencies (seconds), ``reward/score/<verifier>`` (one verifier's unweighted score);
  ``reward/kl_penalty_seq_mean`` with the KL penalty in the reward.
- ``passk/<k>``: training pass@k (Chen et al. 2021, eq. 1) over each prompt's G samples, mean over the P prompts.
- ``response/``: response lengths (tokens) and truncated / filtered fractions (of the B samples).
- ``groups/``: fractions of the P prompts whose G samples are all correct / none correct.
- ``rollout/``: generation throughput (response tokens per second).
- ``dynamic_sampling/``: DAPO's refill rounds (``algorithm.dynamic_sampling``).
- ``data/``: the prompt sampler's position (epochs).
- ``train/``: the policy update; the policy loss's own statistics are forwarded as ``train/<stat>``
  (:func:`train_stat`). Per-token statistics (:data:`TRAIN_TOKEN_MEANS`, and a loss's own [B, T] statistics) are
  token means over every response token of the update, all micro-batches and all data-parallel ranks (sums and
  counts all-reduced, so W ranks report what one rank does on the same batch); ``*_max`` a max; a loss's 0-dim
  statistics a mean over micro-batches.
- ``critic/``: the value model (``algorithm.advantage=gae``): its loss, values and returns (reward units).
- ``adv/``: token advantages (with token-level advantages only: gae, KL in the reward, distill).
- ``distill/``: on-policy distillation (``algorithm.advantage=distill``): the reverse KL to the teacher (nats).
- ``timing/``: wall-clock seconds of each stage, ``timing/<stage>_s`` (:func:`timing`), and
  ``timing/engine_restarts`` (a count, the one name here that is not in seconds).
- ``roles/``: each role's busy and idle seconds within the step (``roles/<role>_busy_s``, ``_idle_s``; busy:
  the union of the role's calls as it ran them, averaged over the role's processes for ``engines`` and
  ``trainer``), and ``roles/overlap_frac``, the share of the step in which generation and training ran at once.
- ``async/``: asynchronous rollout (``rollout.max_staleness``): the policy lag of the samples trained on
  (versions, and histograms ``async/staleness/<n>`` per sample, by its oldest token, and ``async/token_staleness/<n>``
  per sampled token; ``async/spanning_frac``: samples that span an update) and the
  samples dropped as too stale.
- ``sync/``: the weight sync (seconds, GB = 1e9 bytes, GB/s, the engines' policy version) and its probe (nats).
- ``val/``: validation on held-out prompts (``validation.every_steps``; step 0 = the starting policy):
  ``val/pass@<k>``, ``val/maj@<n>``, ``val/mean@<n>`` (fractions of problems), reward, length, truncation.

One name has no namespace: ``policy_version`` (the step whose weights the engines hold after the step's sync).
The sinks add ``step`` to every row; it is bookkeeping, not a metric, and not in the catalogue.

Units: ``reward`` (the verifiers' weighted sum, per sample), ``fraction`` (0..1, of what the entry says),
``tokens``, ``tokens/s``, ``seconds``, ``nats`` (natural-log units; per token unless said), ``count``, ``GB``,
``GB/s``, ``ratio`` (dimensionless), ``advantage`` / ``value`` (reward units), ``loss`` (the objective's units),
``version`` and ``epochs`` (counts).

Constants are named after their string (``reward/latency_p50_s`` -> :data:`REWARD_LATENCY_P50_S`); a family
with a placeholder is a function (``passk(8) == "passk/8"``), and its pattern (``"passk/<k>"``) is what the
catalogue lists. :func:`describe` matches a concrete name against the catalogue; :func:`regex` turns a pattern
into a regular expression (placeholders: ``<k>``, ``<n>``: digits; ``<stage>``, ``<stat>``: word characters;
``<suffix>``: word characters or none, for the plots' ``train/clipped<suffix>``; ``<verifier>``: anything, a
verifier key may hold ``/``, ``:`` and ``#``; ``<tool>``: a tool or class name; ``<outcome>``: one of
:data:`TOOL_CALL_OUTCOMES` and :data:`TOOL_INSTANCE_OUTCOMES`).

This module imports nothing from rlvr (any process may import it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# -- namespaces ----------------------------------------------------------------------------------------------
NS_REWARD = "reward"
NS_PASSK = "passk"
NS_RESPONSE = "response"
NS_GROUPS = "groups"
NS_ROLLOUT = "rollout"
NS_TOOLS = "tools"
NS_DYNAMIC_SAMPLING = "dynamic_sampling"
NS_DATA = "data"
NS_TRAIN = "train"
NS_CRITIC = "critic"
NS_ADV = "adv"
NS_TIMING = "timing"
NS_SYNC = "sync"
NS_VAL = "val"
NS_ROLES = "roles"
NS_ASYNC = "async"
NS_DISTILL = "distill"

NAMESPACES: tuple[str, ...] = (NS_REWARD, NS_PASSK, NS_RESPONSE, NS_GROUPS, NS_ROLLOUT, NS_TOOLS, NS_DYNAMIC_SAMPLING, NS_DATA,
                               NS_TRAIN, NS_CRITIC, NS_ADV, NS_TIMING, NS_SYNC, NS_VAL, NS_ROLES, NS_ASYNC,
                               NS_DISTILL)  # fmt: skip
"""Every namespace a metric name starts with (before its first ``/``); see the module docstring."""


def _name(ns: str, rest: str) -> str:
    return f"{ns}/{rest}"


def namespace(name: str) -> str:
    """The namespace of ``name`` (the text before its first ``/``; ``""`` when it has none, e.g. ``policy_version``)."""
    return name.split("/", 1)[0] if "/" in name else ""


# -- families (one placeholder each) ---------------------------------------------------------------------------
def passk(k: int | str) -> str:
    """``passk/<k>``: training pass@k over each prompt's G samples, mean over prompts (fraction of prompts)."""
    return _name(NS_PASSK, str(k))


def reward_score(verifier: str) -> str:
    """``reward/score/<verifier>``: mean unweighted score of one verifier, by its key (its ``key:``, else the
    attribute of ``file.py:attr`` / ``module:attr``, else the name; ``#2`` on a repeat:
    ``rlvr.reward.pool.verifier_keys``)."""
    return _name(NS_REWARD, f"score/{verifier}")


def tool_outcome(tool: str, outcome: str) -> str:
    """``tools/<tool>/<outcome>``: one tool's calls in the step's rollout that ended ``ok``, ``error`` (it raised or
    returned something that is not text), ``timeout`` or ``crashed`` (:mod:`rlvr.tools.execute`); for a stateful
    tool class (``<tool>`` its class name) its instances ``created``, ``create_error``, ``closed``, ``close_error``
    (:mod:`rlvr.tools.runner`)."""
    return _name(NS_TOOLS, f"{tool}/{outcome}")


def train_stat(stat: str) -> str:
    """``train/<stat>``: a policy-update statistic, e.g. a policy loss's own (``clipped`` -> ``train/clipped``)."""
    return _name(NS_TRAIN, stat)


def timing(stage: str) -> str:
    """``timing/<stage>_s``: wall-clock seconds of one stage (``timing("rollout") == "timing/rollout_s"``)."""
    return _name(NS_TIMING, f"{stage}_s")


def role_busy(role: str) -> str:
    """``roles/<role>_busy_s``: seconds of the step the role spent in calls (``engines``, ``reward``, ``judge``,
    ``trainer``, ``critic``, ``sync``)."""
    return _name(NS_ROLES, f"{role}_busy_s")


def role_idle(role: str) -> str:
    """``roles/<role>_idle_s``: seconds of the step the role waited (step time minus busy)."""
    return _name(NS_ROLES, f"{role}_idle_s")


def staleness(n: int | str) -> str:
    """``async/staleness/<n>``: fraction of the trained batch's samples whose policy was n versions behind."""
    return _name(NS_ASYNC, f"staleness/{n}")


def token_staleness(n: int | str) -> str:
    """``async/token_staleness/<n>``: fraction of the trained batch's sampled tokens whose policy was n versions
    behind (in-flight updates: one trajectory's tokens may differ)."""
    return _name(NS_ASYNC, f"token_staleness/{n}")


def rollout_gap_age(n: int | str) -> str:
    """``train/rollout_gap_abs_age/<n>``: mean |trainer old logprob - engine logprob| (nats) over the response
    tokens sampled n policy versions before the weights updated (in-flight updates: the gap by token age)."""
    return _name(NS_TRAIN, f"rollout_gap_abs_age/{n}")


def val_pass(k: int | str) -> str:
    """``val/pass@<k>``: validation pass@k, mean over problems (fraction of problems)."""
    return _name(NS_VAL, f"pass@{k}")


def val_maj(n: int | str) -> str:
    """``val/maj@<n>``: validation majority vote over the n samples, mean over problems (fraction of problems)."""
    return _name(NS_VAL, f"maj@{n}")


def val_mean(n: int | str) -> str:
    """``val/mean@<n>``: fraction of correct validation samples (c / n), mean over problems (= pass@1)."""
    return _name(NS_VAL, f"mean@{n}")


PASSK = passk("<k>")
REWARD_SCORE = reward_score("<verifier>")
TIMING = timing("<stage>")  # the plots' family; the catalogue lists each stage (TIMING_ROLLOUT_S ...) on its own
ROLE_BUSY = role_busy("<role>")
TOOL_OUTCOME = tool_outcome("<tool>", "<outcome>")
TOOL_CALL_OUTCOMES = ("ok", "error", "timeout", "crashed")
"""A tool call's outcomes (``rlvr.tools.execute.OUTCOMES``), the ``<outcome>`` of a tool's own counts."""
TOOL_INSTANCE_OUTCOMES = ("created", "create_error", "closed", "close_error")
"""A stateful tool class's instance counts (``rlvr.tools.runner``), the ``<outcome>`` of a class's counts."""
ROLE_IDLE = role_idle("<role>")
STALENESS = staleness("<n>")
TOKEN_STALENESS = token_staleness("<n>")
ROLLOUT_GAP_AGE = rollout_gap_age("<n>")
VAL_PASS = val_pass("<k>")
VAL_MAJ = val_maj("<n>")
VAL_MEAN = val_mean("<n>")

# -- fixed names ---------------------------------------------------------------------------------------------
# reward/ (rlvr.reward.pool.reward_metrics, rlvr.runtime.rollout_stage.rollout_metrics, the advantage stage)
REWARD_MEAN = _name(NS_REWARD, "mean")
REWARD_STD = _name(NS_REWARD, "std")
REWARD_CORRECT_FRAC = _name(NS_REWARD, "correct_frac")
REWARD_TIMEOUT_FRAC = _name(NS_REWARD, "timeout_frac")
REWARD_CRASH_FRAC = _name(NS_REWARD, "crash_frac")
REWARD_RESCORED_FRAC = _name(NS_REWARD, "rescored_frac")
REWARD_ERROR_FRAC = _name(NS_REWARD, "error_frac")
REWARD_INVALID_SCORE_FRAC = _name(NS_REWARD, "invalid_score_frac")
REWARD_NO_ANSWER_FRAC = _name(NS_REWARD, "no_answer_frac")
REWARD_LATENCY_MEAN_S = _name(NS_REWARD, "latency_mean_s")
REWARD_LATENCY_MAX_S = _name(NS_REWARD, "latency_max_s")
REWARD_LATENCY_P50_S = _name(NS_REWARD, "latency_p50_s")
REWARD_LATENCY_P99_S = _name(NS_REWARD, "latency_p99_s")
REWARD_KL_PENALTY_SEQ_MEAN = _name(NS_REWARD, "kl_penalty_seq_mean")
REWARD_FLAWED_POSITIVE_FRAC = _name(NS_REWARD, "flawed_positive_frac")
REWARD_JUDGED_FRAC = _name(NS_REWARD, "judged_frac")
REWARD_JUDGE_UNPARSEABLE_FRAC = _name(NS_REWARD, "judge_unparseable_frac")

# response/, groups/, rollout/, dynamic_sampling/, data/ (the controller)
RESPONSE_LENGTH_MEAN = _name(NS_RESPONSE, "length_mean")
RESPONSE_LENGTH_MAX = _name(NS_RESPONSE, "length_max")
RESPONSE_TRUNCATED_FRAC = _name(NS_RESPONSE, "truncated_frac")
RESPONSE_FILTERED_FRAC = _name(NS_RESPONSE, "filtered_frac")
GROUPS_ALL_CORRECT_FRAC = _name(NS_GROUPS, "all_correct_frac")
GROUPS_NONE_CORRECT_FRAC = _name(NS_GROUPS, "none_correct_frac")
ROLLOUT_TOKENS_PER_S = _name(NS_ROLLOUT, "tokens_per_s")
ROLLOUT_TURNS_MEAN = _name(NS_ROLLOUT, "turns_mean")
ROLLOUT_SOLVED_AFTER_TURN_1 = _name(NS_ROLLOUT, "solved_after_turn_1")
ROLLOUT_ENV_FAILED_FRAC = _name(NS_ROLLOUT, "env_failed_frac")
ROLLOUT_PREFIX_BROKEN_FRAC = _name(NS_ROLLOUT, "prefix_broken_frac")
ROLLOUT_BUDGET_END_FRAC = _name(NS_ROLLOUT, "budget_end_frac")
ROLLOUT_LENGTH_END_FRAC = _name(NS_ROLLOUT, "length_end_frac")
ROLLOUT_ENV_S = _name(NS_ROLLOUT, "env_s")
ROLLOUT_ENGINE_IDLE_FRAC = _name(NS_ROLLOUT, "engine_idle_frac")
ROLLOUT_OBS_TOKENS_CUT = _name(NS_ROLLOUT, "obs_tokens_cut")
ROLLOUT_RENDER_S = _name(NS_ROLLOUT, "render_s")
ROLLOUT_EXCLUDED_FRAC = _name(NS_ROLLOUT, "excluded_frac")
ROLLOUT_STOP_ID_END_FRAC = _name(NS_ROLLOUT, "stop_id_end_frac")
# tools/ (rlvr.envs.rollout.TurnRollouts with a recipe's tools: rlvr.tools.runner)
TOOLS_CALLS_PER_TRAJ = _name(NS_TOOLS, "calls_per_traj")
TOOLS_MALFORMED_FRAC = _name(NS_TOOLS, "malformed_frac")
TOOLS_TIME_FRAC = _name(NS_TOOLS, "time_frac")
DYNAMIC_SAMPLING_ROUNDS = _name(NS_DYNAMIC_SAMPLING, "rounds")
DYNAMIC_SAMPLING_SHORTFALL = _name(NS_DYNAMIC_SAMPLING, "shortfall")
DYNAMIC_SAMPLING_INFORMATIVE_FRAC = _name(NS_DYNAMIC_SAMPLING, "informative_frac")
DATA_EPOCH = _name(NS_DATA, "epoch")
POLICY_VERSION = "policy_version"

# train/ (rlvr.train.policy; train/kl also from the advantage stage with the KL in the reward)
TRAIN_LOSS = train_stat("loss")
TRAIN_ENTROPY = train_stat("entropy")
TRAIN_KL = train_stat("kl")
TRAIN_GRAD_NORM = train_stat("grad_norm")
TRAIN_SKIPPED = train_stat("skipped")
TRAIN_OPTIMIZER_STEPS = train_stat("optimizer_steps")
TRAIN_DPH_DIV = train_stat("dph_div")
TRAIN_TOKENS = train_stat("tokens")
TRAIN_TOKENS_PER_S = train_stat("tokens_per_s")
# the policy losses' statistics (rlvr.algos.losses), forwarded as train/<stat>
TRAIN_CLIPPED = train_stat("clipped")
TRAIN_CLIPPED_HIGH = train_stat("clipped_high")
TRAIN_CLIPPED_LOW = train_stat("clipped_low")
TRAIN_CLIPPED_DUAL = train_stat("clipped_dual")
TRAIN_RATIO = train_stat("ratio")
TRAIN_APPROX_KL = train_stat("approx_kl")
TRAIN_ROLLOUT_GAP_ABS = train_stat("rollout_gap_abs")
TRAIN_ROLLOUT_GAP_ABS_MAX = train_stat("rollout_gap_abs_max")
TRAIN_ROLLOUT_KL_K3 = train_stat("rollout_kl_k3")
TRAIN_TIS_WEIGHT = train_stat("tis_weight")
TRAIN_TIS_CAPPED = train_stat("tis_capped")
TRAIN_TIS_WEIGHT_MAX = train_stat("tis_weight_max")
# derived by the trainer from tis_weight (rlvr.train.policy): how far the correction weight is from 1
TRAIN_TIS_WEIGHT_DEV = train_stat("tis_weight_dev")
TRAIN_TIS_WEIGHT_DEV_MAX = train_stat("tis_weight_dev_max")
TRAIN_TOKEN_MEANS: tuple[str, ...] = (
    TRAIN_ENTROPY, TRAIN_KL, TRAIN_DPH_DIV, TRAIN_CLIPPED, TRAIN_CLIPPED_HIGH, TRAIN_CLIPPED_LOW, TRAIN_CLIPPED_DUAL,
    TRAIN_RATIO, TRAIN_APPROX_KL, TRAIN_ROLLOUT_GAP_ABS, TRAIN_ROLLOUT_KL_K3, TRAIN_TIS_WEIGHT, TRAIN_TIS_CAPPED,
    TRAIN_TIS_WEIGHT_DEV)  # fmt: skip
"""The ``train/`` statistics that are token means over all ranks' response tokens (their catalogue meaning says
"token mean over all ranks"); ``train/dph_div``'s tokens are those of the DPH-RL buffer samples."""

# critic/ (rlvr.train.critic; value_mean and return_mean from the advantage stage), adv/ (the advantage stage)
CRITIC_VALUE_LOSS = _name(NS_CRITIC, "value_loss")
CRITIC_VALUE_CLIP_FRAC = _name(NS_CRITIC, "value_clip_frac")
CRITIC_VALUE_MSE = _name(NS_CRITIC, "value_mse")
CRITIC_GRAD_NORM = _name(NS_CRITIC, "grad_norm")
CRITIC_VALUE_MEAN = _name(NS_CRITIC, "value_mean")
CRITIC_RETURN_MEAN = _name(NS_CRITIC, "return_mean")
ADV_TOKEN_MEAN = _name(NS_ADV, "token_mean")
ADV_TOKEN_ABS_MEAN = _name(NS_ADV, "token_abs_mean")

# timing/
TIMING_ROLLOUT_S = timing("rollout")
TIMING_REWARD_S = timing("reward")
TIMING_TRAIN_S = timing("train")
TIMING_SYNC_S = timing("sync")
TIMING_STEP_S = timing("step")
TIMING_VALIDATION_S = timing("validation")
TIMING_JUDGE_S = timing("judge")
TIMING_TRAIN_WAIT_S = timing("train_wait")
TIMING_REFILL_S = timing("refill")
TIMING_TRAIN_INNER_S = timing("train_inner")
TIMING_CRITIC_INNER_S = timing("critic_inner")
TIMING_ENGINE_RESTARTS = _name(NS_TIMING, "engine_restarts")
TIMING_TEACHER_S = timing("teacher")
TIMING_TEACHER_SHARE = _name(NS_TIMING, "teacher_share")

# distill/ (on-policy distillation, rlvr.algos.distill)
DISTILL_REVERSE_KL_MEAN = _name(NS_DISTILL, "reverse_kl_mean")
DISTILL_REVERSE_KL_SEQ_MEAN = _name(NS_DISTILL, "reverse_kl_seq_mean")
DISTILL_CLIPPED_FRAC = _name(NS_DISTILL, "clipped_frac")

# sync/ (rlvr.runtime.roles.Roles.sync, rlvr.sync.probe)
SYNC_SECONDS = _name(NS_SYNC, "seconds")
SYNC_SEND_SECONDS = _name(NS_SYNC, "send_seconds")
SYNC_GB = _name(NS_SYNC, "gb")
SYNC_GBPS = _name(NS_SYNC, "gbps")
SYNC_POLICY_VERSION = _name(NS_SYNC, "policy_version")
SYNC_REDONE = _name(NS_SYNC, "redone")
SYNC_PROBE_GAP_MEAN = _name(NS_SYNC, "probe_gap_mean")
SYNC_PROBE_GAP_GEN_MEAN = _name(NS_SYNC, "probe_gap_gen_mean")
SYNC_PROBE_GAP_MAX = _name(NS_SYNC, "probe_gap_max")

# roles/, async/ (rlvr.metrics.timeline, the asynchronous loop of rlvr.runtime.controller)
ROLES_OVERLAP_FRAC = _name(NS_ROLES, "overlap_frac")
ASYNC_STALENESS_MEAN = _name(NS_ASYNC, "staleness_mean")
ASYNC_STALENESS_MAX = _name(NS_ASYNC, "staleness_max")
ASYNC_DROPPED_STALE = _name(NS_ASYNC, "dropped_stale")
ASYNC_TOKEN_STALENESS_MEAN = _name(NS_ASYNC, "token_staleness_mean")
ASYNC_SPANNING_FRAC = _name(NS_ASYNC, "spanning_frac")
ASYNC_ENGINE_BUSY_FRAC = _name(NS_ASYNC, "engine_busy_frac")
ASYNC_ENGINE_LOAD_FRAC = _name(NS_ASYNC, "engine_load_frac")

# val/ (rlvr.runtime.validation)
VAL_REWARD_MEAN = _name(NS_VAL, "reward_mean")
VAL_LENGTH_MEAN = _name(NS_VAL, "length_mean")
VAL_TRUNCATED_FRAC = _name(NS_VAL, "truncated_frac")


# -- the catalogue ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """One catalogue entry: ``pattern`` (a name, or a family with a ``<placeholder>``), ``unit``, ``meaning``."""

    pattern: str
    unit: str
    meaning: str


_M = Metric
_token_mean_note = "; token mean over all ranks"
"""Added to the meaning of each :data:`TRAIN_TOKEN_MEANS` entry of :data:`CATALOGUE` (that tuple says which)."""
_ENTRIES: tuple[Metric, ...] = (
    # reward/
    _M(REWARD_MEAN, "reward", "mean reward (the verifiers' weighted sum) over the step's B rollouts"),
    _M(REWARD_STD, "reward", "population std of the reward over the B rollouts (normaliser B)"),
    _M(REWARD_CORRECT_FRAC, "fraction", "rollouts the primary (first) verifier gives full marks (score >= 1)"),
    _M(REWARD_TIMEOUT_FRAC, "fraction", "rollouts where some verifier timed out"),
    _M(REWARD_CRASH_FRAC, "fraction", "rollouts whose verifier worker died under them twice (scored 0, reason "
       "crashed: the answer kills its worker)"),
    _M(REWARD_RESCORED_FRAC, "fraction", "rollouts whose verifier worker died under them once and that a fresh "
       "worker then scored (an infrastructure fault recovered, never trained as a 0)"),
    _M(REWARD_ERROR_FRAC, "fraction", "rollouts where some verifier raised an error or returned no valid score "
       "(each scored 0 for that verifier)"),
    _M(REWARD_INVALID_SCORE_FRAC, "fraction", "rollouts where some verifier returned no valid score (not a number, "
       "NaN, or outside [0, 1]; scored 0 for it, reason 'error: score ...'); part of reward/error_frac"),
    _M(REWARD_NO_ANSWER_FRAC, "fraction", "rollouts where some verifier found no answer"),
    _M(REWARD_LATENCY_MEAN_S, "seconds", "mean scoring latency per rollout"),
    _M(REWARD_LATENCY_MAX_S, "seconds", "largest scoring latency of the batch"),
    _M(REWARD_LATENCY_P50_S, "seconds", "median scoring latency (nearest rank)"),
    _M(REWARD_LATENCY_P99_S, "seconds", "99th-percentile scoring latency (nearest rank)"),
    _M(REWARD_SCORE, "score", "one verifier's unweighted score, mean over the B rollouts"),
    _M(REWARD_KL_PENALTY_SEQ_MEAN, "reward", "KL penalty in the reward (-kl_coef x KL) summed over a sequence's "
       "tokens, mean over sequences (algorithm.kl_penalty=reward)"),
    _M(REWARD_FLAWED_POSITIVE_FRAC, "fraction", "flawed positives (the primary verifier marks the rollout correct, "
       "the judge finds a flawed step; FAPO) over the rollouts the primary verifier marks correct (0 when none is)"),
    _M(REWARD_JUDGED_FRAC, "fraction", "rollouts sent to the judge (reward.verifiers name: judge) over the B rollouts"),
    _M(REWARD_JUDGE_UNPARSEABLE_FRAC, "fraction", "verdicts no parse rule read (judge_unparseable) over the rollouts "
       "sent to the judge (0 when none was)"),
    # passk/, response/, groups/, rollout/, dynamic_sampling/, data/
    _M(PASSK, "fraction", "training pass@k (unbiased, Chen et al. 2021) over each prompt's G samples, mean over prompts"),
    _M(RESPONSE_LENGTH_MEAN, "tokens", "mean response length over the B rollouts"),
    _M(RESPONSE_LENGTH_MAX, "tokens", "longest response of the batch"),
    _M(RESPONSE_TRUNCATED_FRAC, "fraction", "rollouts cut by rollout.max_new_tokens"),
    _M(RESPONSE_FILTERED_FRAC, "fraction", "rollouts given no loss by DAPO's overlong filter (algorithm.overlong_filter)"),
    _M(GROUPS_ALL_CORRECT_FRAC, "fraction", "prompts whose G samples are all correct"),
    _M(GROUPS_NONE_CORRECT_FRAC, "fraction", "prompts whose G samples are all wrong"),
    _M(ROLLOUT_TOKENS_PER_S, "tokens/s", "response tokens trained on per second of rollout time (timing/rollout_s)"),
    _M(ROLLOUT_TURNS_MEAN, "turns", "assistant turns per trajectory, mean (1 without an environment)"),
    _M(ROLLOUT_SOLVED_AFTER_TURN_1, "fraction", "trajectories the primary verifier marks correct that took more than "
                                                "one assistant turn (environment)"),
    _M(ROLLOUT_ENV_FAILED_FRAC, "fraction", "trajectories ended by their environment failing (timeout, crash, error, "
                                            "bad output: rlvr.envs)"),
    _M(ROLLOUT_PREFIX_BROKEN_FRAC, "fraction", "trajectories ended because the chat template rewrote earlier turns "
                                               "(the prefix property broke: rlvr.envs.tokens)"),
    _M(ROLLOUT_BUDGET_END_FRAC, "fraction", "trajectories ended by environment.max_tokens"),
    _M(ROLLOUT_LENGTH_END_FRAC, "fraction", "trajectories ended by a turn cut at rollout.max_new_tokens "
       "(environment.end_on_length)"),
    _M(ROLLOUT_ENV_S, "s", "wall time of the environments' resets and steps in the step's rollout"),
    _M(ROLLOUT_ENGINE_IDLE_FRAC, "fraction", "share of the turn loop's time the engines waited for environments"),
    _M(ROLLOUT_OBS_TOKENS_CUT, "tokens", "environment message tokens cut by environment.max_observation_tokens"),
    _M(ROLLOUT_RENDER_S, "s", "the turn loop's own time rendering and tokenising the environments' messages"),
    _M(ROLLOUT_EXCLUDED_FRAC, "fraction", "samples left out of the update and of their group's baseline as "
       "infrastructure failures (an environment that failed; rlvr.runtime.rollout_stage.infra_failed)"),
    _M(ROLLOUT_STOP_ID_END_FRAC, "fraction", "trajectories ended by a turn that stopped on an end id other than the "
       "template's turn end (stop_id: Qwen2.5's <|endoftext|>, Llama-3.1's <|eom_id|>)"),
    _M(TOOLS_CALLS_PER_TRAJ, "calls", "tool calls per trajectory, mean (malformed ones included)"),
    _M(TOOLS_MALFORMED_FRAC, "fraction", "tool calls answered with an error before running (bad JSON, unknown tool, "
                                         "arguments off the schema, over tools.max_calls_per_turn)"),
    _M(TOOLS_TIME_FRAC, "fraction", "share of the turn loop's time spent running tool calls"),
    _M(TOOL_OUTCOME, "calls", "one tool's calls that ended ok, error, timeout or crashed (rlvr.tools.execute); a "
                              "stateful tool class's instances created, create_error, closed, close_error "
                              "(rlvr.tools.runner)"),
    _M(DYNAMIC_SAMPLING_ROUNDS, "count", "extra generation rounds of DAPO dynamic sampling this step"),
    _M(DYNAMIC_SAMPLING_SHORTFALL, "count", "groups short of P informative ones after the last round"),
    _M(DYNAMIC_SAMPLING_INFORMATIVE_FRAC, "fraction", "informative groups (0 < correct < G) among all generated"),
    _M(DATA_EPOCH, "epochs", "passes over the training prompts completed so far"),
    _M(POLICY_VERSION, "version", "policy version (= step) the engines hold after the step; 0 at validation at start"),
    # train/
    _M(TRAIN_LOSS, "loss", "the whole batch's policy loss per optimizer step"),
    _M(TRAIN_ENTROPY, "nats", "policy entropy per response token"),
    _M(TRAIN_KL, "nats", "KL to the reference per response token (algorithm.kl_estimator; kl_coef > 0)"),
    _M(TRAIN_GRAD_NORM, "norm", "policy gradient L2 norm before clipping, mean over optimizer steps"),
    _M(TRAIN_SKIPPED, "count", "optimizer steps skipped for a NaN/inf gradient"),
    _M(TRAIN_OPTIMIZER_STEPS, "count", "optimizer steps per rollout batch"),
    _M(TRAIN_TOKENS, "tokens", "sequence tokens (prompt and response) the update's training forwards took, all epochs "
       "(algorithm.ppo_epochs x the batch's)"),
    _M(TRAIN_TOKENS_PER_S, "tokens/s", "train/tokens per second of the update (timing/train_s): the trainer's "
       "throughput, all ranks together (verl's perf/throughput is per GPU)"),
    _M(TRAIN_DPH_DIV, "nats", "DPH-RL divergence to the starting policy per token of its buffer samples"),
    _M(TRAIN_CLIPPED, "fraction", "response tokens whose objective clipping changed (either side, or the dual clip)"),
    _M(TRAIN_CLIPPED_HIGH, "fraction", "response tokens clipped at 1 + clip_high"),
    _M(TRAIN_CLIPPED_LOW, "fraction", "response tokens clipped at 1 - clip_low"),
    _M(TRAIN_CLIPPED_DUAL, "fraction", "response tokens capped by the dual clip (ppo_clip dual_clip_c)"),
    _M(TRAIN_RATIO, "ratio", "importance ratio pi / pi_old per response token"),
    _M(TRAIN_APPROX_KL, "nats", "k3 estimate of KL(pi_old || pi) per response token"),
    _M(TRAIN_ROLLOUT_GAP_ABS, "nats", "|trainer old logprob - engine logprob| per response token"),
    _M(ROLLOUT_GAP_AGE, "nats", "|trainer old logprob - engine logprob| over tokens sampled n versions behind"),
    _M(TRAIN_ROLLOUT_GAP_ABS_MAX, "nats", "largest |trainer old logprob - engine logprob| of any token"),
    _M(TRAIN_ROLLOUT_KL_K3, "nats", "k3 estimate of KL(pi_rollout || pi_old) per response token"),
    _M(TRAIN_TIS_WEIGHT, "ratio", "truncated importance-sampling weight per response token (algorithm.tis_cap)"),
    _M(TRAIN_TIS_CAPPED, "fraction", "response tokens whose TIS weight hit algorithm.tis_cap (decoupled: dropped over it)"),
    _M(TRAIN_TIS_WEIGHT_MAX, "ratio", "largest rollout-correction weight of a response token (max over micro-batches)"),
    _M(TRAIN_TIS_WEIGHT_DEV, "ratio", "|w - 1| per response token, w the rollout-correction weight (tis_cap or "
       "decoupled; 0 when w is 1 everywhere)"),
    _M(TRAIN_TIS_WEIGHT_DEV_MAX, "ratio", "largest |w - 1| of a response token (max over micro-batches and ranks)"),
    # critic/, adv/
    _M(CRITIC_VALUE_LOSS, "loss", "clipped value loss per optimizer step, mean over steps"),
    _M(CRITIC_VALUE_CLIP_FRAC, "fraction", "response tokens where the clipped value term was the larger"),
    _M(CRITIC_VALUE_MSE, "value^2", "squared error of the values against the returns per response token"),
    _M(CRITIC_GRAD_NORM, "norm", "value-model gradient L2 norm before clipping, mean over optimizer steps"),
    _M(CRITIC_VALUE_MEAN, "value", "the critic's value per response token before the update"),
    _M(CRITIC_RETURN_MEAN, "value", "the GAE return per response token"),
    _M(ADV_TOKEN_MEAN, "advantage", "token advantage per response token"),
    _M(ADV_TOKEN_ABS_MEAN, "advantage", "|token advantage| per response token"),
    # timing/
    _M(TIMING_ROLLOUT_S, "seconds", "generation of the batch trained (this step's, or N steps ago under "
       "rollout.max_staleness), until the last engine finished"),
    _M(TIMING_REWARD_S, "seconds", "scoring of the batch trained, not hidden behind its generation"),
    _M(TIMING_REFILL_S, "seconds", "DAPO dynamic sampling's extra generate-and-score rounds of the batch trained"),
    _M(TIMING_TRAIN_S, "seconds", "the policy (and critic) update inside the trainer: the longest rank's (or the "
       "critic's) own time, in both loops"),
    _M(TIMING_TRAIN_WAIT_S, "seconds", "the controller's wait for the update, from when it had nothing else to do "
       "(on-policy: the whole update and its call; asynchronous: what the next batch's rollout did not hide)"),
    _M(TIMING_SYNC_S, "seconds", "the weight sync and its probe, as the controller waited for it"),
    _M(TIMING_STEP_S, "seconds", "the whole training step (validation excluded)"),
    _M(TIMING_VALIDATION_S, "seconds", "one validation pass"),
    _M(TIMING_JUDGE_S, "seconds", "the judge role's verdicts on the batch trained, after the rule verifiers' scores"),
    _M(TIMING_TRAIN_INNER_S, "seconds", "the policy update inside one trainer rank (returned; logged as timing/train_s)"),
    _M(TIMING_CRITIC_INNER_S, "seconds", "the critic update inside its process (returned; in timing/train_s)"),
    _M(TIMING_ENGINE_RESTARTS, "count", "engines replaced after dying, so far in this run"),
    _M(TIMING_TEACHER_S, "seconds", "the teacher role's scoring of the batch trained (on-policy distillation)"),
    _M(TIMING_TEACHER_SHARE, "fraction", "timing/teacher_s over timing/step_s"),
    # distill/
    _M(DISTILL_REVERSE_KL_MEAN, "nats", "reverse KL to the teacher, log p_student - log p_teacher of each sampled "
       "token, mean over the batch's sampled tokens (unclipped)"),
    _M(DISTILL_REVERSE_KL_SEQ_MEAN, "nats", "the same summed over a sequence's sampled tokens, mean over the B "
       "sequences"),
    _M(DISTILL_CLIPPED_FRAC, "fraction", "sampled tokens whose teacher term was clipped (algorithm.advantage.clip)"),
    # sync/
    _M(SYNC_SECONDS, "seconds", "the weight transfer (send and receive), checks and probe excluded"),
    _M(SYNC_SEND_SECONDS, "seconds", "the trainer's sending of the weights"),
    _M(SYNC_GB, "GB", "weights sent per sync (1e9 bytes)"),
    _M(SYNC_GBPS, "GB/s", "sync/gb over sync/send_seconds"),
    _M(SYNC_POLICY_VERSION, "version", "policy version the engines received"),
    _M(SYNC_REDONE, "count", "times the step's sync was redone because an engine died during it (replaced first)"),
    _M(SYNC_PROBE_GAP_MEAN, "nats", "sync probe: mean |engine - trainer| logprob gap, max over engines"),
    _M(SYNC_PROBE_GAP_GEN_MEAN, "nats", "sync probe: the same over the generated tokens only"),
    _M(SYNC_PROBE_GAP_MAX, "nats", "sync probe: largest single-token gap, max over engines"),
    # roles/, async/
    _M(ROLE_BUSY, "seconds", "the step's seconds the role spent in calls (mean over its processes)"),
    _M(ROLE_IDLE, "seconds", "the step's seconds the role waited: step time minus its busy seconds"),
    _M(ROLES_OVERLAP_FRAC, "fraction", "share of the step in which an engine generated while a trainer computed"),
    _M(STALENESS, "fraction", "trained samples whose policy was n versions behind the weights updated"),
    _M(ASYNC_STALENESS_MEAN, "version", "mean policy lag of the trained samples (rollout.max_staleness bounds it)"),
    _M(ASYNC_STALENESS_MAX, "version", "largest policy lag of a trained sample"),
    _M(ASYNC_DROPPED_STALE, "count", "samples dropped as older than rollout.max_staleness and regenerated"),
    _M(TOKEN_STALENESS, "fraction", "trained sampled tokens whose policy was n versions behind the weights updated"),
    _M(ASYNC_TOKEN_STALENESS_MEAN, "version", "mean policy lag of the trained sampled tokens"),
    _M(ASYNC_ENGINE_BUSY_FRAC, "fraction", "in flight: share of the step's wall time an engine's loop spent in decode "
       "steps (requests running), mean over the engines; the rest it loaded weights or had nothing to do"),
    _M(ASYNC_ENGINE_LOAD_FRAC, "fraction", "in flight: share of the step's wall time an engine's loop spent loading "
       "weights, mean over the engines"),
    _M(ASYNC_SPANNING_FRAC, "fraction", "trained samples whose tokens come from more than one policy version "
       "(an in-flight update landed while they were generated)"),
    # val/
    _M(VAL_PASS, "fraction", "validation pass@k over the n samples per problem, mean over problems"),
    _M(VAL_MAJ, "fraction", "validation majority vote over the n samples (exact maj@n), mean over problems"),
    _M(VAL_MEAN, "fraction", "validation fraction of correct samples (c / n), mean over problems"),
    _M(VAL_REWARD_MEAN, "reward", "mean validation reward over all samples"),
    _M(VAL_LENGTH_MEAN, "tokens", "mean validation response length"),
    _M(VAL_TRUNCATED_FRAC, "fraction", "validation samples cut by the token limit"),
)  # fmt: skip
CATALOGUE: tuple[Metric, ...] = tuple(
    Metric(e.pattern, e.unit, e.meaning + _token_mean_note) if e.pattern in TRAIN_TOKEN_MEANS else e for e in _ENTRIES
)
"""Every name rlvr logs (families by their pattern), in namespace order."""

_PLACEHOLDERS = {"k": r"\d+", "n": r"\d+", "stage": r"\w+", "role": r"\w+", "tool": r"[\w.-]+",
                 "outcome": "(?:" + "|".join(TOOL_CALL_OUTCOMES + TOOL_INSTANCE_OUTCOMES) + ")",  # one atom
                 "stat": r"\w+", "suffix": r"\w*", "verifier": r".+"}  # fmt: skip
_SLOT = re.compile(r"<(\w+)>")


def _regex(pattern: str, named: bool) -> str:
    out, pos = [], 0
    for m in _SLOT.finditer(pattern):
        slot = m.group(1)
        if slot not in _PLACEHOLDERS:
            raise ValueError(f"unknown placeholder <{slot}> in metric pattern {pattern!r}: use one of "
                             f"{', '.join(f'<{p}>' for p in _PLACEHOLDERS)}")
        out.append(re.escape(pattern[pos : m.start()]))
        out.append(f"(?P<{slot}>{_PLACEHOLDERS[slot]})" if named else _PLACEHOLDERS[slot])  # each an atom + quantifier
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return "".join(out)


def regex(pattern: str) -> str:
    """A regular expression (for a full match, no groups) of the names ``pattern`` stands for:
    ``regex("passk/<k>") == r"passk/\\d+"``; a name without placeholders is escaped as is.
    Errors: ``ValueError`` for an unknown placeholder."""
    return _regex(pattern, named=False)


@lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(_regex(pattern, named=True))


def parse(pattern: str, name: str) -> dict[str, str] | None:
    """The placeholders' values when ``name`` is one of ``pattern``'s names (``parse(PASSK, "passk/8") ==
    {"k": "8"}``; ``{}`` for a fixed name equal to ``pattern``), else None."""
    m = _compiled(pattern).fullmatch(name)
    return m.groupdict() if m else None


_FIXED = {e.pattern: e for e in CATALOGUE if not _SLOT.search(e.pattern)}
_FAMILIES = tuple(e for e in CATALOGUE if _SLOT.search(e.pattern))


def describe(name: str) -> Metric | None:
    """The catalogue entry of a concrete metric name (``describe("val/pass@4").pattern == "val/pass@<k>"``), or
    None for a name rlvr does not log (``step``, a user loss's own ``train/<stat>``, a typo)."""
    if name in _FIXED:
        return _FIXED[name]
    return next((e for e in _FAMILIES if parse(e.pattern, name) is not None), None)


def known(name: str) -> bool:
    """True when :func:`describe` finds ``name`` in the catalogue."""
    return describe(name) is not None
