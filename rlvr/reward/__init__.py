"""Reward stage: the Verifier seam and the scoring pool that runs verifiers with hard time limits.

``build_verifier(spec)`` turns a recipe's :class:`~rlvr.config.VerifierSpec` into a verifier;
``ScoringPool`` / ``RewardWorker`` score a batch of completions in worker processes (``[B]`` results in input
order); ``reward_metrics`` summarises a scored batch for logging (``reward/...``).
"""

from rlvr.reward.base import (
    ENTRY_POINT_GROUP,
    VERIFIERS,
    FunctionVerifier,
    UnknownVerifierError,
    Verifier,
    build_verifier,
    coerce_result,
    resolve_verifier,
)
from rlvr.reward.pool import RewardWorker, Scored, ScoringPool, reward_metrics, verifier_keys

__all__ = [
    "ENTRY_POINT_GROUP",
    "VERIFIERS",
    "FunctionVerifier",
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
