"""The environment's own verdict as a verifier (issue 42): ``environment`` in a recipe's ``reward.verifiers``, for
multi-turn recipes whose task has no gold answer to check text against (a game won or lost, a ``verifiers``
rubric, an OpenEnv server's score), so that the reward, ``reward/correct_frac`` and pass@k are the environment's.

The score is the last reward the environment gave in the trajectory (:attr:`rlvr.types.Completion.turn_rewards`;
the turn loop passes it to the verifiers as the row field ``env_reward``: :func:`rlvr.envs.rollout.scoring_rows`),
0 when it gave none (reason ``no_env_reward``). A row without the field was not rolled out by an environment
(reason ``bad_row: ...``; the recipe check refuses ``environment`` without ``environment.name``). Full marks
(``correct``) is a reward of 1.
"""

from __future__ import annotations

import math
from typing import Any

from rlvr.types import VerifyResult

ROW_KEY = "env_reward"
"""The row field the turn loop fills with the trajectory's last environment reward (None: none given)."""


class EnvironmentVerifier:
    """The environment's last reward as the score (the module docstring). Takes no arguments."""

    def verify(self, response: str, gold: str, **row: Any) -> VerifyResult:
        if ROW_KEY not in row:
            return VerifyResult(score=0.0, parsed=None, reason="bad_row: no env_reward (the environment verifier "
                                                                  "scores multi-turn trajectories: set environment.name)")
        value = row[ROW_KEY]
        if value is None:
            return VerifyResult(score=0.0, parsed=None, reason="no_env_reward")
        score = float(value)
        if not math.isfinite(score) or not 0.0 <= score <= 1.0:
            return VerifyResult(score=0.0, parsed=str(value), reason=f"bad_row: env_reward {value!r} outside [0, 1]")
        return VerifyResult(score=score, parsed=f"{score:g}", reason=None if score >= 1.0 else "wrong")
