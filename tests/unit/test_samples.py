"""sample_rows picks its documented rows; shorten and print_sample_table format them."""

from __future__ import annotations

import io

import pytest

from rlvr.metrics.samples import COLUMNS, print_sample_table, sample_rows, shorten
from rlvr.reward.pool import Scored
from rlvr.types import Completion, Prompt, VerifyResult


def _batch(correct: list[list[bool]], index0: int = 10):
    """P prompts (data indices 10, 11, ...) x G samples, prompt-major; ``correct[p][g]`` sets the math verdict.
    A second verifier ``format`` gives every sample 0.5 with reason ``fmt`` (so ``reason`` must come from math)."""
    prompts, comps, scored = [], [], []
    for p, row in enumerate(correct):
        idx = index0 + p
        prompts.append(Prompt(index=idx, text=f"Q{idx}?", prompt_ids=[1, 2], gold=str(idx)))
        for g, ok in enumerate(row):
            comps.append(Completion(prompt_index=idx, sample_index=g, prompt_ids=[1, 2], token_ids=[5] * (g + 1),
                                    logprobs=[-0.1] * (g + 1), text=f"r{idx}.{g}", finish_reason="stop" if g else "length",
                                    policy_version=0))
            math = VerifyResult(score=1.0, parsed=str(idx)) if ok else VerifyResult(score=0.0, parsed="x", reason="wrong")
            scored.append(Scored(reward=(1.0 if ok else 0.0) + 0.25, latency_s=0.01,
                                 results={"math": math, "format": VerifyResult(score=0.5, parsed=None, reason="fmt")}))
    return prompts, comps, scored


def _ids(rows):
    return [(r["prompt_index"], r["sample_index"]) for r in rows]


def test_round_robin_first_samples():
    prompts, comps, scored = _batch([[True, False], [False, True], [True, True]])
    rows = sample_rows(prompts, comps, scored, "math", 4)  # already has both kinds: no swap
    assert _ids(rows) == [(10, 0), (11, 0), (12, 0), (10, 1)]
    assert _ids(sample_rows(prompts, comps, scored, "math", 99)) == [(10, 0), (11, 0), (12, 0), (10, 1), (11, 1), (12, 1)]
    assert sample_rows(prompts, comps, scored, "math", 0) == []


def test_row_fields_from_primary_verifier():
    prompts, comps, scored = _batch([[True, False], [False, True]])
    first, second = sample_rows(prompts, comps, scored, "math", 2)
    assert list(first) == list(COLUMNS)
    assert first == {"prompt_index": 10, "sample_index": 0, "prompt": "Q10?", "gold": "10", "response": "r10.0",
                     "parsed": "10", "score": 1.0, "reward": 1.25, "reason": None, "finish": "length",
                     "judge": None}
    assert second == {"prompt_index": 11, "sample_index": 0, "prompt": "Q11?", "gold": "11", "response": "r11.0",
                      "parsed": "x", "score": 0.0, "reward": 0.25, "reason": "wrong", "finish": "length",
                      "judge": None}
    # the secondary verifier's view instead: score 0.5 everywhere, so nothing "correct" and no swap
    assert [r["reason"] for r in sample_rows(prompts, comps, scored, "format", 2)] == ["fmt", "fmt"]


def test_judge_column_shows_the_verdict():
    from rlvr.metrics.samples import judge_cell
    from rlvr.types import VerifyResult

    assert judge_cell(None) is None
    assert judge_cell(VerifyResult(score=1.0, parsed="-1")) == "sound (-1)"
    assert judge_cell(VerifyResult(score=0.0, parsed="2", reason="flawed")) == "flawed (2)"
    assert judge_cell(VerifyResult(score=0.0, reason="not_judged")) == "not_judged"


def test_swaps_in_a_correct_sample():
    # round-robin order 10.0 11.0 12.0 10.1 11.1 12.1; the only correct sample is 11.1 -> it replaces the last row
    prompts, comps, scored = _batch([[False, False], [False, True], [False, False]])
    assert _ids(sample_rows(prompts, comps, scored, "math", 2)) == [(10, 0), (11, 1)]
    assert _ids(sample_rows(prompts, comps, scored, "math", 3)) == [(10, 0), (11, 0), (11, 1)]


def test_swaps_in_a_wrong_sample():
    prompts, comps, scored = _batch([[True, True], [True, True], [True, False]])
    assert _ids(sample_rows(prompts, comps, scored, "math", 2)) == [(10, 0), (12, 1)]


def test_no_swap_when_one_row_or_one_kind():
    prompts, comps, scored = _batch([[False, False], [False, True]])
    assert _ids(sample_rows(prompts, comps, scored, "math", 1)) == [(10, 0)]
    prompts, comps, scored = _batch([[False, False], [False, False]])
    assert _ids(sample_rows(prompts, comps, scored, "math", 2)) == [(10, 0), (11, 0)]


def test_prompts_matched_by_index_and_errors():
    prompts, comps, scored = _batch([[True], [False]])
    rows = sample_rows(list(reversed(prompts)) + [Prompt(index=99, text="extra", prompt_ids=[1], gold="0")],
                       comps, scored, "math", 2)
    assert [r["prompt"] for r in rows] == ["Q10?", "Q11?"]
    with pytest.raises(ValueError, match="not in prompts"):
        sample_rows(prompts[:1], comps, scored, "math", 2)
    with pytest.raises(ValueError):
        sample_rows(prompts, comps, scored[:1], "math", 2)
    with pytest.raises(KeyError):
        sample_rows(prompts, comps, scored, "code", 2)


def test_shorten():
    assert shorten("abcdefghij", 7) == "ab … ij"  # 7 characters: head 2, " … ", tail 2
    assert shorten("abcdefghij", 10) == "abcdefghij"
    assert shorten("a\nb\r\nc", 10) == "a⏎b⏎c"
    assert shorten(None, 5) == ""


def test_print_sample_table(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich's console width for a non-terminal
    prompts, comps, scored = _batch([[True, False], [False, True]])
    rows = sample_rows(prompts, comps, scored, "math", 2)
    rows[1]["response"] = "start " + "x" * 200 + " the answer is 7"
    out = io.StringIO()
    print_sample_table(7, rows, width=30, file=out)
    text = out.getvalue()
    assert "samples at step 7" in text
    assert "10/0" in text and "11/0" in text
    assert shorten(rows[1]["response"], 30) in text and "answer is 7" in text
    assert "1.2500" in text and "0.2500" in text and "ok" in text and "wrong" in text
    out = io.StringIO()
    print_sample_table(7, [], file=out)
    assert out.getvalue() == ""
    # a trajectory's turn marks and a model's own brackets are text, not rich markup (they were dropped as tags)
    rows[0]["response"] = "[assistant 1] 8 [user] wrong [assistant 2] [/b] 9"
    out = io.StringIO()
    print_sample_table(7, rows, width=60, file=out)
    assert "[assistant 1] 8 [user] wrong [assistant 2] [/b] 9" in out.getvalue()
