"""Issue 24: a verifier's score must lie in [0, 1] (an invalid one scores 0 with a reason, counted); a verifier
failing many of a step's samples warns on the console (bounded); per-verifier keys are short names.

The verifiers the pool's workers run are the functions below, named in ``file.py:attr`` form (the workers import
this file); each pool starts in well under a second (forkserver).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlvr.config import RecipeError, VerifierSpec
from rlvr.recipe import load_recipe
from rlvr.reward import ScoringPool, reward_metrics
from rlvr.reward.pool import verifier_keys
from rlvr.types import VerifyResult

HERE = os.path.abspath(__file__)
TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
SCORES = {"a": 1.0, "b": 7.5, "c": -3.0, "d": 0.0}


def by_text(response: str, gold: str, **row: object) -> float:
    """The score SCORES names for the response: 1, 7.5, -3 or 0."""
    return SCORES[response]


def as_result(response: str, gold: str, **row: object) -> VerifyResult:
    """The same scores as VerifyResults, with the answer it read."""
    return VerifyResult(score=SCORES[response], parsed=response)


def always_half(response: str, gold: str, **row: object) -> float:
    return 0.5


# -- friction of the issue: per-verifier keys ---------------------------------------------------------------------
def test_verifier_keys_are_short_names_however_the_file_is_named(tmp_path) -> None:
    rel = os.path.relpath(HERE)
    specs = [VerifierSpec(name="math"), VerifierSpec(name=f"{rel}:by_text"),
             VerifierSpec(name="rlvr_verifiers.format:FormatVerifier"),
             VerifierSpec(name=f"{HERE}:always_half", key="half"), VerifierSpec(name="math", weight=0.5)]  # fmt: skip
    assert verifier_keys(specs) == ["math", "by_text", "FormatVerifier", "half", "math#2"]
    assert verifier_keys([VerifierSpec(name=f"{HERE}:by_text")]) == verifier_keys([VerifierSpec(name=f"{rel}:by_text")])
    with pytest.raises(ValueError) as e:
        verifier_keys([VerifierSpec(name="a/check.py:score"), VerifierSpec(name="b/check.py:score")])
    assert str(e.value) == (
        "reward.verifiers[0] ('a/check.py:score') and reward.verifiers[1] ('b/check.py:score') would both be keyed "
        "'score' in the results and metrics (reward/score/score): give reward.verifiers[1] a key of its own, e.g. "
        "`- {name: b/check.py:score, key: score_2}`")  # fmt: skip
    with pytest.raises(ValueError, match="both be keyed 'math'"):
        verifier_keys([VerifierSpec(name="math"), VerifierSpec(name=f"{rel}:by_text", key="math")])


def test_pool_metrics_are_keyed_by_the_short_name(tmp_path, monkeypatch) -> None:
    """Before: ``reward/score//abs/path/test_verifier_scores.py:by_text`` (or the relative path, as written)."""
    rel = os.path.relpath(HERE)
    with ScoringPool([VerifierSpec(name=f"{rel}:by_text")], num_workers=1, timeout_s=5.0) as pool:
        monkeypatch.chdir(tmp_path)
        scored = pool.score(["a", "d"], ["g", "g"], [{}, {}])
    assert pool.keys == ["by_text"]
    assert [k for k in reward_metrics(scored) if k.startswith("reward/score/")] == ["reward/score/by_text"]


def _recipe(tmp_path: Path, verifiers: list, **reward: object) -> Path:
    import yaml

    data = yaml.safe_load(Path(TINY).read_text())
    data["reward"].update(verifiers=verifiers, **reward)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_recipe_with_two_verifiers_of_one_short_name_fails_at_load(tmp_path) -> None:
    with pytest.raises(RecipeError) as e:
        load_recipe(_recipe(tmp_path, [{"name": "math"}, {"name": "judge", "key": "j"}]))
    assert "reward.verifiers[1].key='j': a judge verifier is keyed 'judge'" in str(e.value)
    with pytest.raises(RecipeError, match=r"give reward.verifiers\[1\] a key of its own, e.g. `- \{name: "
                                          r"a/check.py:math, key: math_2\}`"):  # fmt: skip
        load_recipe(_recipe(tmp_path, [{"name": "math"}, {"name": "a/check.py:math"}]))
    r = load_recipe(_recipe(tmp_path, [{"name": "math"}, {"name": "a/check.py:math", "key": "m2"}]))
    assert verifier_keys(r.reward.verifiers) == ["math", "m2"]


def test_a_checkpoint_written_before_keys_resumes_and_may_add_one() -> None:
    """A checkpoint's recipe.yaml from before ``key`` existed resumes unchanged; a resumed run may add a key (it
    names metrics only), not change a verifier's weight."""
    import copy

    from rlvr.config import read_recipe, to_dict
    from rlvr.runtime.checkpoint import recipe_diff

    new = to_dict(load_recipe(TINY))
    old = copy.deepcopy(new)
    del old["reward"]["verifiers"][0]["key"]
    defaults = to_dict(read_recipe(None, []))
    assert recipe_diff(old, new, defaults) == []
    new["reward"]["verifiers"][0]["key"] = "n"
    assert recipe_diff(old, new, defaults) == []
    new["reward"]["verifiers"][0]["weight"] = 2.0
    assert [k for k, _, _ in recipe_diff(old, new, defaults)] == ["reward.verifiers"]
