"""Validation metrics against hand-worked values."""

from __future__ import annotations

import pytest

from rlvr.config import RecipeError, default_ks
from rlvr.recipe import load_recipe
from rlvr.reward.pool import Scored
from rlvr.runtime.validation import majority_correct, validation_metrics, validation_record
from rlvr.types import Completion, VerifyResult


def _s(correct: bool, parsed: str | None) -> Scored:
    return Scored(reward=float(correct), results={"math": VerifyResult(score=float(correct), parsed=parsed)}, latency_s=0.0)


def _c(n_tokens: int, truncated: bool = False) -> Completion:
    return Completion(prompt_index=0, sample_index=0, prompt_ids=[1], token_ids=[5] * n_tokens, logprobs=[0.0] * n_tokens,
                      text="", finish_reason="length" if truncated else "stop", policy_version=0)  # fmt: skip


def test_majority_vote():
    assert majority_correct(["3", "4", "4", None], [True, False, False, False]) is False  # 4 wins 2:1, and 4 is wrong
    assert majority_correct(["3", "4", "3", "4"], [True, False, True, False]) is True  # tie 2:2 -> first seen (3)
    assert majority_correct([None, None], [False, False]) is False  # nobody voted
    assert majority_correct(["12", "12.0", "12"], [True, True, True]) is True


def test_validation_metrics_two_problems_of_four_samples():
    # problem A: 1 of 4 correct (answers 7, 5, 5, -) ; problem B: 4 of 4 correct (answers 9 x4)
    scored = [_s(True, "7"), _s(False, "5"), _s(False, "5"), _s(False, None)] + [_s(True, "9")] * 4
    comps = [_c(4), _c(8, True), _c(8, True), _c(4)] + [_c(2)] * 4
    m = validation_metrics(scored, comps, n=4, primary="math")
    # pass@1: (1/4 + 1) / 2 = 0.625; pass@2: (1 - C(3,2)/C(4,2) = 0.5, 1) -> 0.75; pass@4: (1, 1) -> 1
    assert m["val/pass@1"] == pytest.approx(0.625)
    assert m["val/pass@2"] == pytest.approx(0.75)
    assert m["val/pass@4"] == pytest.approx(1.0)
    assert m["val/maj@4"] == pytest.approx(0.5)  # A's majority answer 5 is wrong; B's 9 is right
    assert m["val/mean@4"] == pytest.approx(5 / 8)
    assert m["val/length_mean"] == pytest.approx((4 + 8 + 8 + 4 + 8) / 8)
    assert m["val/truncated_frac"] == pytest.approx(2 / 8)


def test_default_ks():
    assert default_ks(8) == (1, 2, 4, 8) and default_ks(6) == (1, 2, 4, 6) and default_ks(1) == (1,)


def test_validation_needs_held_out_data():
    with pytest.raises(RecipeError, match="data.generated.holdout > 0"):
        load_recipe(None, ["validation.every_steps=5", "data.generated.holdout=0"])
    with pytest.raises(RecipeError, match="set validation.source"):
        load_recipe(None, ["validation.every_steps=5", "data.source=data/svamp/test.jsonl"])
    r = load_recipe(None, ["validation.every_steps=5", "data.generated.holdout=32"])
    assert r.validation.samples == 8


def test_validation_record_keeps_each_problems_samples_in_order():
    from rlvr.types import Prompt

    def sc(score, parsed):
        return Scored(reward=score, results={"math": VerifyResult(score=score, parsed=parsed)}, latency_s=0.0)

    prompts = [Prompt(index=7, text="", prompt_ids=[1], gold="12"), Prompt(index=3, text="", prompt_ids=[1], gold="5")]
    scored = [sc(1.0, "12"), sc(0.0, "11"), sc(0.0, None), sc(1.0, "5")]
    rec = validation_record(4, prompts, scored, 2, "math")
    assert rec == {"step": 4, "n": 2, "problems": [
        {"index": 7, "gold": "12", "correct": [True, False], "parsed": ["12", "11"]},
        {"index": 3, "gold": "5", "correct": [False, True], "parsed": [None, "5"]},
    ]}
    with pytest.raises(ValueError, match="2 x 3"):
        validation_record(4, prompts, scored, 3, "math")
