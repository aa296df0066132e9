"""Rows an environment makes (``data.source: env:<environment>``), the ``environment`` verifier (the environment's
last reward as the score) and what the recipe check says about them (issue 42); values by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config import EnvironmentConfig, RecipeError, VerifierSpec
from rlvr.data.datasets import load_rows
from rlvr.envs.rollout import env_scored, scoring_rows
from rlvr.recipe import load_recipe
from rlvr.reward.base import build_verifier
from rlvr.types import Completion

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
HERE = "tests/unit/test_env_rows.py"


class Dealer:
    """Makes rows ``{"question": "deal {i}", "answer": i * 10, "seed": seed}``; ``answer: none`` leaves it out."""

    def __init__(self, **_):
        pass

    @classmethod
    def rows(cls, size, seed, answer="yes"):
        return [{"question": f"deal {i}", "seed": seed} | ({"answer": i * 10} if answer == "yes" else {})
                for i in range(size)]

    def reset(self, row):
        return None

    def step(self, history, reply):
        raise AssertionError("not played here")


class NoRows(Dealer):
    rows = None


class BadRows(Dealer):
    @classmethod
    def rows(cls, size, seed):
        return [{"question": 3}] * size


def _data(*overrides):
    return load_recipe(TINY, [f"environment.name={HERE}:Dealer", f"data.source=env:{HERE}:Dealer",
                              *overrides]).data


def test_rows_come_from_the_environment_split_by_holdout():
    d = _data("data.env_rows.size=5", "data.env_rows.holdout=2")
    train = load_rows(d, seed=7)
    assert [r["question"] for r in train] == ["deal 0", "deal 1", "deal 2"]
    assert [r["gold"] for r in train] == ["0", "10", "20"]
    assert train[0]["row"] == {"question": "deal 0", "answer": 0, "seed": 7}
    import dataclasses

    held = load_rows(dataclasses.replace(d, split="holdout"), seed=7)
    assert [r["question"] for r in held] == ["deal 3", "deal 4"]
    assert [r["row"]["seed"] for r in load_rows(d, seed=8)] == [8, 8, 8]  # the run's seed reaches rows()


def test_rows_without_an_answer_have_an_empty_gold_and_args_reach_rows():
    d = _data("data.env_rows.size=2", "data.env_rows.args={answer: none}")
    assert [r["gold"] for r in load_rows(d, seed=1)] == ["", ""]


@pytest.mark.parametrize(("overrides", "error", "match"), [
    (["data.env_rows.size=2", "data.env_rows.holdout=2"], ValueError, "holdout=2 must be >= 0 and < size=2"),
    (["data.env_rows.args={colour: red}"], RecipeError, "colour"),
    ([f"data.source=env:{HERE}:NoRows"], TypeError, "has no rows"),
    ([f"data.source=env:{HERE}:BadRows", "data.env_rows.size=1"], ValueError, "row 0 .* each row is a dict"),
])
def test_bad_row_settings_are_named(overrides, error, match):
    with pytest.raises(error, match=match):
        load_rows(_data(*overrides), seed=1)


def test_holdout_split_needs_a_holdout():
    import dataclasses

    with pytest.raises(ValueError, match="data.env_rows.holdout=0"):
        load_rows(dataclasses.replace(_data(), split="holdout"), seed=1)


def test_the_environment_verifier_scores_the_last_reward_given():
    v = build_verifier(VerifierSpec(name="environment"))
    full = v.verify("anything", "", env_reward=1.0)
    assert (full.score, full.parsed, full.reason) == (1.0, "1", None)  # full marks: correct
    assert (v.verify("anything", "", env_reward=0.25).score, v.verify("a", "", env_reward=0.25).reason) == (0.25, "wrong")
    zero = v.verify("anything", "", env_reward=0.0)
    assert (zero.score, zero.reason) == (0.0, "wrong")  # a lost game is the policy's 0, a valid score
    none = v.verify("x", "", env_reward=None)
    assert (none.score, none.reason) == (0.0, "no_env_reward")
    missing = v.verify("x", "")
    assert missing.score == 0.0 and missing.reason.startswith("bad_row: no env_reward")
    for bad in (1.5, -0.5, float("nan")):
        r = v.verify("x", "", env_reward=bad)
        assert r.score == 0.0 and r.reason.startswith("bad_row: env_reward")


def _traj(rewards):
    return Completion(prompt_index=0, sample_index=0, prompt_ids=[1], token_ids=[2], logprobs=[-0.1], text="t",
                      finish_reason="stop", policy_version=0, turn_rewards=rewards)


def test_scoring_rows_carry_each_trajectorys_last_reward():
    rows = scoring_rows([_traj([0.0, None, 0.5, None]), _traj([None]), _traj(None)], [{"a": 1}] * 3)
    assert rows == [{"a": 1, "env_reward": 0.5}, {"a": 1, "env_reward": None}, {"a": 1, "env_reward": None}]


def test_the_environment_steps_the_last_reply_when_it_scores():
    env = EnvironmentConfig(name="x")
    assert env_scored(env, (VerifierSpec(name="math"),)) is False
    assert env_scored(env, (VerifierSpec(name="math"), VerifierSpec(name="environment"))) is True
    import dataclasses

    assert env_scored(dataclasses.replace(env, reward="environment"), (VerifierSpec(name="math"),)) is True


def test_the_recipe_check_refuses_the_environment_verifier_and_env_rows_without_an_environment():
    with pytest.raises(RecipeError, match=r"reward.verifiers\[0\] is `environment`"):
        load_recipe(TINY, ["reward.verifiers=[{name: environment}]"])
    with pytest.raises(RecipeError, match="takes rows from an environment, but environment.name is unset"):
        load_recipe(TINY, [f"data.source=env:{HERE}:Dealer"])
    with pytest.raises(RecipeError, match="data.env_rows.holdout > 0"):
        load_recipe(TINY, [f"environment.name={HERE}:Dealer", f"data.source=env:{HERE}:Dealer",
                           "validation.every_steps=2"])


def test_the_eval_engines_context_leaves_room_for_an_environments_own_opening():
    from rlvr.evaluate import engine_context

    # rows of 30 tokens, openings held to 192, a trajectory budget of 160 (the TextArena recipe's sizes)
    assert engine_context(30, 192, 160, environment=True) == 352  # not 190, which a 192-token opening overran
    assert engine_context(30, 192, 32, environment=False) == 62  # single-turn: the rows' own prompts
    assert engine_context(250, 192, 160, environment=True) == 410  # a row's own longer prompt still counts
