"""Reward stage: the Verifier seam and the scoring pool that runs verifiers with hard time limits.

``build_verifier(spec)`` turns a recipe's :class:`~rlvr.config.VerifierSpec` into a verifier;
``ScoringPool`` / ``RewardWorker`` score a batch of completions in worker processes (``[B]`` results in input
order); ``reward_metrics`` summarises a scored batch for logging (``reward/...``). ``JudgeWorker`` is the judge
role (a verifier backed by a model, :mod:`rlvr.reward.judge`), with its ``JudgeSettings`` and ``PARSE_RULES``.
"""

from rlvr.reward.base import (
    ENTRY_POINT_GROUP,
    VERIFIERS,
    FunctionVerifier,
    InvalidScoreError,
    UnknownVerifierError,
    Verifier,
    build_verifier,
    coerce_result,
    resolve_verifier,
)
from rlvr.reward.judge import PARSE_RULES, JudgeItem, JudgeSettings, JudgeWorker
from rlvr.reward.pool import RewardWorker, Scored, ScoringPool, reward_metrics, verifier_keys

__all__ = [
    "ENTRY_POINT_GROUP",
    "VERIFIERS",
    "FunctionVerifier",
    "InvalidScoreError",
    "JudgeItem",
    "JudgeSettings",
    "JudgeWorker",
    "PARSE_RULES",
    "RewardWorker",
    "Scored",
    "ScoringPool",
    "UnknownVerifierError",
    "Verifier",
    "build_verifier",
    "coerce_result",
    "resolve_verifier",
    "reward_metrics",
    "verifier_keys",
]
