"""Issue 24: a verifier's score must lie in [0, 1] (an invalid one scores 0 with a reason, counted); a verifier
failing many of a step's samples warns on the console (bounded); per-verifier keys are short names.

The verifiers the pool's workers run are the functions below, named in ``file.py:attr`` form (the workers import
this file); each pool starts in well under a second (forkserver).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import pytest

from rlvr.config import RecipeError, VerifierSpec
from rlvr.metrics import names as mn
from rlvr.metrics.samples import sample_rows
from rlvr.recipe import load_recipe
from rlvr.reward import ScoringPool, coerce_result, reward_metrics
from rlvr.reward.base import InvalidScoreError
from rlvr.reward.pool import FailureWatch, Scored, verifier_keys
from rlvr.types import Completion, Prompt, VerifyResult

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


def _completions(texts: list[str]) -> list[Completion]:
    return [Completion(prompt_index=0, sample_index=j, prompt_ids=[1], token_ids=[5], logprobs=[-1.0], text=t,
                       finish_reason="stop", policy_version=0) for j, t in enumerate(texts)]  # fmt: skip


# -- item 2 of the issue: a score outside [0, 1] -------------------------------------------------------------------
def test_scores_outside_0_1_score_0_with_a_reason_and_are_counted() -> None:
    """Scores [1, 7.5, -3, 0] of one prompt's 4 samples. Before: reward/mean (1 + 7.5 - 3 + 0) / 4 = 1.375,
    correct_frac 2/4 (7.5 counted correct), the table's reason None ("ok") for 7.5, no error counted. Now 7.5 and
    -3 score 0 with reason ``error: score ... outside [0, 1]``: mean 1/4, correct 1/4, pass@1 1/4, 2 of 4 invalid."""
    from rlvr.runtime.rollout_stage import rollout_metrics

    texts = ["a", "b", "c", "d"]
    with ScoringPool([VerifierSpec(name=f"{HERE}:by_text")], num_workers=1, timeout_s=5.0) as pool:
        scored = pool.score(texts, ["g"] * 4, [{}] * 4)
        assert pool.stats()["errors"] == 2
    key = "by_text"
    assert [s.reward for s in scored] == [1.0, 0.0, 0.0, 0.0]
    assert [s.results[key].reason for s in scored] == [
        None, "error: score 7.5 outside [0, 1]", "error: score -3.0 outside [0, 1]", "wrong"]  # fmt: skip
    m = rollout_metrics(_completions(texts), scored, (1, 4), 4, primary=key)
    assert m[mn.REWARD_MEAN] == 0.25 and m[mn.reward_score(key)] == 0.25
    assert m[mn.REWARD_CORRECT_FRAC] == 0.25 and m[mn.passk(1)] == 0.25 and m[mn.passk(4)] == 1.0
    assert m[mn.REWARD_ERROR_FRAC] == 0.5 and m[mn.REWARD_INVALID_SCORE_FRAC] == 0.5
    assert m[mn.GROUPS_ALL_CORRECT_FRAC] == 0.0
    rows = sample_rows([Prompt(index=0, text="q", prompt_ids=[1], gold="g")], _completions(texts), scored, key, 4)
    assert [(r["response"], r["score"], r["reason"]) for r in rows][:2] == [
        ("a", 1.0, None), ("b", 0.0, "error: score 7.5 outside [0, 1]")]  # fmt: skip


def test_an_invalid_score_drops_only_its_own_weighted_term() -> None:
    """reward = 2 x as_result + 0.5 x always_half: the invalid 7.5 and -3 add 0, the other verifier's 0.25 stands
    (before: 2 x 7.5 + 0.25 = 15.25 and 2 x -3 + 0.25 = -5.75). The parsed answer of an invalid score is not kept."""
    specs = [VerifierSpec(name=f"{HERE}:as_result", weight=2.0), VerifierSpec(name=f"{HERE}:always_half", weight=0.5)]
    with ScoringPool(specs, num_workers=1, timeout_s=5.0) as pool:
        scored = pool.score(["a", "b", "c", "d"], ["g"] * 4, [{}] * 4)
    assert [s.reward for s in scored] == [2.25, 0.25, 0.25, 0.25]
    assert scored[1].results["as_result"] == VerifyResult(score=0.0, reason="error: score 7.5 outside [0, 1]")
    m = reward_metrics(scored)
    assert m[mn.REWARD_MEAN] == 0.75 and m[mn.REWARD_INVALID_SCORE_FRAC] == 0.5
    assert m[mn.reward_score("as_result")] == 0.25 and m[mn.reward_score("always_half")] == 0.5


def test_coerce_result_contract() -> None:
    for bad, text in ((7.5, "score 7.5 outside [0, 1]"), (-3, "score -3.0 outside [0, 1]"),
                      (float("nan"), "score nan outside [0, 1]"), (math.inf, "score inf outside [0, 1]"),
                      (VerifyResult(score=1.5), "score 1.5 outside [0, 1]"),
                      (None, "score None (NoneType) is not a number"), ("1", "score '1' (str) is not a number"),
                      (VerifyResult(score="1"), "score '1' (str) is not a number")):  # fmt: skip
        with pytest.raises(InvalidScoreError) as e:
            coerce_result(bad)
        assert str(e.value).startswith(text) and isinstance(e.value, TypeError) and isinstance(e.value, ValueError)
    # float rounding just outside is clipped, not refused
    assert coerce_result(0.1 + 0.2 + 0.7) == VerifyResult(score=1.0)
    assert coerce_result(VerifyResult(score=-1e-9, reason="wrong")) == VerifyResult(score=0.0, reason="wrong")
    assert coerce_result(0.5) == VerifyResult(score=0.5, reason="partial")


def test_reward_metrics_count_invalid_scores_among_the_errors() -> None:
    def one(reason: str | None) -> Scored:
        return Scored(reward=0.0, results={"v": VerifyResult(score=0.0, reason=reason)}, latency_s=0.1)

    m = reward_metrics([one("error: score 7.5 outside [0, 1]"), one("error: score nan outside [0, 1]"),
                        one("error: KeyError: 'x'"), one("wrong"), one("timeout")])  # fmt: skip
    assert m[mn.REWARD_INVALID_SCORE_FRAC] == 2 / 5 and m[mn.REWARD_ERROR_FRAC] == 3 / 5
    assert mn.describe(mn.REWARD_INVALID_SCORE_FRAC).unit == "fraction"


# -- friction of the issue: a verifier failing a large share of a step's samples -----------------------------------
def _step(failures: dict[str, list[str | None]], b: int = 8) -> list[Scored]:
    """B samples; verifier ``k``'s sample i has reason ``failures[k][i]`` (None past the list: scored fine)."""
    def result(reasons: list[str | None], i: int) -> VerifyResult:
        reason = reasons[i] if i < len(reasons) else None
        return VerifyResult(score=0.0 if reason else 1.0, reason=reason)

    return [Scored(reward=0.0, results={k: result(v, i) for k, v in failures.items()}, latency_s=0.1) for i in range(b)]


def test_failure_watch_warns_past_the_threshold_once_then_only_when_worse(caplog) -> None:
    """Threshold 0.25, 8 samples a step. flaky fails 1 (12.5%: quiet), 3 (37.5%: warns), 3 (quiet), 4 (50%: 10
    points over the 37.5% warned: warns), 8 (100%: warns, and says it is the last), 8 (quiet); steady never fails."""
    watch = FailureWatch(0.25)
    err = "error: ZeroDivisionError: division by zero"
    fails = {1: [err], 2: [err, "timeout", err], 3: [err] * 3, 4: [err, err, "crashed", "timeout"], 5: [err] * 8,
             6: [err] * 8}  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="rlvr"):
        said = {step: watch.check(step, _step({"steady": [], "flaky": f})) for step, f in fails.items()}
    assert [step for step, msgs in said.items() if msgs] == [2, 4, 5]
    assert all(len(msgs) == 1 for msgs in said.values() if msgs)
    assert said[2][0] == (
        "step 2: verifier 'flaky' failed on 38% of the step's samples (3 of 8: 2 errors, 1 timeout), each scored 0 "
        "by it; e.g. 'error: ZeroDivisionError: division by zero'. Fix the verifier (`rlvr verify FILE.jsonl "
        "--verifier NAME` runs it on saved responses); make it faster or raise reward.timeout_s. "
        "(reward.warn_error_frac=0.25; next warning for it only at 48% or more)")  # fmt: skip
    assert "(4 of 8: 2 errors, 1 crash, 1 timeout)" in said[4][0] and "reward.memory_mb" in said[4][0]
    assert "100%" in said[5][0] and "no further warnings for it" in said[5][0]
    assert [r.getMessage() for r in caplog.records if r.name == "rlvr"] == said[2] + said[4] + said[5]
    assert FailureWatch(None).check(1, _step({"v": [err] * 8})) == []
    with pytest.raises(ValueError, match=r"reward.warn_error_frac=0 must be in \(0, 1\]"):
        FailureWatch(0.0)


def test_the_step_loop_checks_each_rollout_it_collects(caplog, monkeypatch) -> None:
    """The rollout stage's ``finish`` (every training batch, either loop) hands the scored batch to its
    FailureWatch: 2 of 4 samples raising warns once, naming the batch's step."""
    from rlvr.runtime import rollout_stage

    r = load_recipe(TINY, ["rollout.prompts_per_step=1", "rollout.samples_per_prompt=4"])
    err = "error: ValueError: bad"
    scored = _step({"math": [err, None, err]}, b=4)
    monkeypatch.setattr(rollout_stage, "collect_scored", lambda roles, pending: (_completions(["x"] * 4), scored, {}))
    prompts = [Prompt(index=0, text="q", prompt_ids=[1], gold="g")]
    stage = rollout_stage.RolloutStage(None, prompts, None, None, r, "math", lambda step: 0)
    with caplog.at_level(logging.WARNING, logger="rlvr"):
        stage.finish(rollout_stage.Started(7, prompts, None))
        stage.finish(rollout_stage.Started(8, prompts, None))
    warned = [m for m in caplog.messages if "failed on" in m]
    assert len(warned) == 1 and warned[0].startswith("step 7: verifier 'math' failed on 50% of the step's samples")


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
        load_recipe(_recipe(tmp_path, [{"name": "math"}, {"name": "judge", "key": "j"}], warn_error_frac=1.5))
    assert "reward.warn_error_frac=1.5 must be in (0, 1]" in str(e.value)
    assert "reward.verifiers[1].key='j': a judge verifier is keyed 'judge'" in str(e.value)
    with pytest.raises(RecipeError, match=r"give reward.verifiers\[1\] a key of its own, e.g. `- \{name: "
                                          r"a/check.py:math, key: math_2\}`"):  # fmt: skip
        load_recipe(_recipe(tmp_path, [{"name": "math"}, {"name": "a/check.py:math"}]))
    r = load_recipe(_recipe(tmp_path, [{"name": "math"}, {"name": "a/check.py:math", "key": "m2"}]))
    assert verifier_keys(r.reward.verifiers) == ["math", "m2"] and r.reward.warn_error_frac == 0.25


def test_a_checkpoint_written_before_keys_resumes_and_may_add_one() -> None:
    """A checkpoint's recipe.yaml from before ``key`` and ``warn_error_frac`` existed resumes unchanged; a resumed
    run may add a key (it names metrics only) or change the warning threshold, not a verifier's weight."""
    import copy

    from rlvr.config import read_recipe, to_dict
    from rlvr.runtime.checkpoint import recipe_diff

    new = to_dict(load_recipe(TINY))
    old = copy.deepcopy(new)
    del old["reward"]["verifiers"][0]["key"], old["reward"]["warn_error_frac"]
    defaults = to_dict(read_recipe(None, []))
    assert recipe_diff(old, new, defaults) == []
    new["reward"]["verifiers"][0]["key"], new["reward"]["warn_error_frac"] = "n", 0.5
    assert recipe_diff(old, new, defaults) == []
    new["reward"]["verifiers"][0]["weight"] = 2.0
    assert [k for k, _, _ in recipe_diff(old, new, defaults)] == ["reward.verifiers"]
