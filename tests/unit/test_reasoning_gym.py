"""reasoning-gym as data and verifier (issue 42, first part): ``data.source: reasoning_gym:<task>`` and the
``reasoning_gym`` verifier (the task's own scorer). Values by hand from the tasks' definitions."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlvr.config import VerifierSpec
from rlvr.data.datasets import load_rows
from rlvr.recipe import load_recipe
from rlvr.reward.base import build_verifier

pytest.importorskip("reasoning_gym")
TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
RG = ["data.source=reasoning_gym:basic_arithmetic", "data.reasoning_gym.size=12", "data.reasoning_gym.holdout=4",
      "data.reasoning_gym.args={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}",
      "reward.verifiers=[{name: reasoning_gym}]"]  # fmt: skip


def _data(*overrides):
    return load_recipe(TINY, [*RG, *overrides]).data


def test_rows_are_seeded_split_and_carry_the_metadata():
    train, again, other = load_rows(_data(), 0), load_rows(_data(), 0), load_rows(_data(), 1)
    hold = load_rows(_data("data.split=holdout"), 0)
    assert len(train) == 8 and len(hold) == 4
    assert [r["question"] for r in train] == [r["question"] for r in again]  # the same seed: the same rows
    assert [r["question"] for r in train] != [r["question"] for r in other]
    for r in train + hold:
        # two one-digit terms: "Calculate a op b." whose gold is the value (by hand: eval of the expression)
        expr = r["row"]["metadata"]["expression"]
        assert r["question"].startswith("Calculate ") and r["row"]["metadata"]["source_dataset"] == "basic_arithmetic"
        assert float(r["gold"]) == pytest.approx(eval(expr))  # noqa: S307 - the task's own two-digit expression
    assert {r["row"]["metadata"]["source_index"] for r in hold} == {8, 9, 10, 11}


def test_a_wrong_task_or_args_is_named_at_load():
    with pytest.raises(ValueError, match="no task 'basic_arithmetc'; did you mean reasoning_gym:basic_arithmetic"):
        load_rows(_data("data.source=reasoning_gym:basic_arithmetc"), 0)
    with pytest.raises(ValueError, match=r"data.reasoning_gym.args=.*bogus"):
        load_rows(_data("data.reasoning_gym.args={bogus: 1}"), 0)
    with pytest.raises(ValueError, match="holdout=12 must be >= 0 and < size=12"):
        load_rows(_data("data.reasoning_gym.holdout=12"), 0)


def test_the_verifier_is_the_tasks_own_scorer():
    row = load_rows(_data(), 0)[0]
    v = build_verifier(VerifierSpec(name="reasoning_gym"))
    gold, fields = row["gold"], row["row"]
    right = v.verify(f"so it is <answer>{gold}</answer>", gold, **fields)
    assert (right.score, right.parsed, right.reason) == (1.0, gold, None)
    wrong = v.verify(f"<answer>{int(float(gold)) + 1}</answer>", gold, **fields)
    assert (wrong.score, wrong.reason) == (0.0, "wrong")
    no_tag = v.verify(f"the answer is {gold}", gold, **fields)  # no <answer> tag
    assert (no_tag.score, no_tag.reason) == (0.0, "no_answer")
    bad = v.verify("<answer>1</answer>", "1", question="q")
    assert bad.score == 0.0 and bad.reason.startswith("bad_row: ")
    # the last tag counts (reasoning-gym's extract_answer)
    assert v.verify(f"<answer>0</answer> no, <answer>{gold}</answer>", gold, **fields).score == 1.0


def test_the_scorer_gets_the_entry_as_reasoning_gym_built_it():
    """The entry a task's score_answer reads: the row's question, the gold as the answer, the metadata."""
    from rlvr_verifiers.reasoning_gym import _entry

    meta = {"source_dataset": "basic_arithmetic", "source_index": 3}
    assert _entry("5", {"question": "Calculate 2 + 3.", "metadata": meta}) == {
        "question": "Calculate 2 + 3.", "answer": "5", "metadata": meta}
    assert _entry("5", {"metadata": meta})["question"] == ""


def test_partial_credit_passes_through_clamped_into_0_1():
    """spell_backward (seed 0: "hypomeron" -> gold "noremopyh", 9 letters) scores 1/9 per letter in place: the word
    without its last letter 8/9; the right word with trailing text sums nine 1/9s to 1.0000000000000002 in floats
    (reasoning-gym's own arithmetic), which the verifier clamps to 1 (rlvr refuses scores outside [0, 1])."""
    rows = load_rows(load_recipe(TINY, ["data.source=reasoning_gym:spell_backward", "data.reasoning_gym.size=1",
                                        "reward.verifiers=[{name: reasoning_gym}]"]).data, 0)  # fmt: skip
    v = build_verifier(VerifierSpec(name="reasoning_gym"))
    r = rows[0]
    assert r["gold"] == "noremopyh"
    assert v.verify("<answer>noremopy</answer>", r["gold"], **r["row"]).score == pytest.approx(8 / 9, abs=1e-12)
    assert v.verify("<answer>noremopyh x</answer>", r["gold"], **r["row"]).score == 1.0
    assert v.verify("<answer>NOREMOPYH</answer>", r["gold"], **r["row"]).score == 1.0  # its scorer ignores case


def test_a_fallback_answers_for_a_response_without_the_tag():
    """``fallback: last_number`` reads ``-3`` from "so 5 - 8 is -3" (the last number), ``last_line`` the last
    non-empty line; the tag still wins where there is one; ``none`` (the default) is ``no_answer``."""
    from rlvr_verifiers.reasoning_gym import fallback_answer

    assert fallback_answer("so 5 - 8 is -3", "last_number") == "-3"
    assert fallback_answer("2.5 then 3.75.", "last_number") == "3.75"
    assert fallback_answer("no digits", "last_number") is None
    assert fallback_answer("think\n  olleh \n\n", "last_line") == "olleh"
    assert fallback_answer("a\nb\nc", "last_line") == "c"
    assert fallback_answer("  \n", "last_line") is None and fallback_answer("5", "none") is None
    row = load_rows(_data(), 0)[0]
    gold, fields = row["gold"], row["row"]
    v = build_verifier(VerifierSpec(name="reasoning_gym", args={"fallback": "last_number"}))
    assert v.verify(f"1 + 1 ... it is {gold}", gold, **fields).score == 1.0
    assert v.verify(f"<answer>{int(float(gold)) + 1}</answer> or {gold}", gold, **fields).score == 0.0  # the tag wins
    assert v.verify("nothing", gold, **fields).reason == "no_answer"
    with pytest.raises(ValueError, match="fallback='first'; one of none, last_number, last_line"):
        build_verifier(VerifierSpec(name="reasoning_gym", args={"fallback": "first"}))


def test_validation_uses_the_tasks_holdout_rows():
    """validation.every_steps without validation.source: a reasoning_gym source validates on its holdout rows, and
    is refused at load when it has none."""
    from rlvr.config import RecipeError

    r = load_recipe(TINY, [*RG, "validation.every_steps=2"])
    assert r.validation.source is None and len(load_rows(dataclasses.replace(r.data, split="holdout"), 0)) == 4
    with pytest.raises(RecipeError, match=r"set data.reasoning_gym.holdout > 0"):
        load_recipe(TINY, [*RG, "validation.every_steps=2", "data.reasoning_gym.holdout=0"])
