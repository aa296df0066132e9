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


# -- issue 38, item 17: a trajectory's row has its structure, as rlvr eval's samples.jsonl --------------------------
def _trajectory():
    """A two-turn tool trajectory by hand: one user opening, a calculator call answered, then the final answer;
    the environment's info holds a NaN and an object that is not JSON."""
    calls = [{"name": "calculator", "call": "<tool_call>{...}</tool_call>", "status": "ok", "result": "391"},
             {"name": "calculator", "call": "<tool_call>{bad</tool_call>", "status": "malformed",
              "result": "error: ..."}]
    messages = [{"role": "user", "content": "17 * 23?"},
                {"role": "assistant", "content": "<tool_call>{...}</tool_call>"},
                {"role": "tool", "name": "calculator", "content": "391"}, {"role": "assistant", "content": "391"}]
    info = [{"tool_calls": calls}, {"tool_calls": 0, "loss": float("nan"), "obj": Marker()}]
    return Completion(prompt_index=10, sample_index=1, prompt_ids=[1, 2], token_ids=[5] * 9, logprobs=[-0.1] * 9,
                      text="391", finish_reason="stop", policy_version=3, loss_mask=[1] * 4 + [0] * 3 + [1] * 2,
                      turns=2,
                      messages=messages, opening_messages=1, turn_rewards=[None, 1.0], end_reason="done",
                      turn_info=info)  # fmt: skip


class Marker:
    def __str__(self) -> str:
        return "<marker>"


TRAJECTORY_ROW = {
    "prompt_index": 10, "sample_index": 1, "prompt": "Q10?", "gold": "10", "response": "391", "parsed": "10",
    "score": 1.0, "reward": 1.25, "reason": None, "finish": "stop", "judge": None,
    "turns": 2, "end_reason": "done", "failure": None, "opening_messages": 1,
    "messages": [{"role": "user", "content": "17 * 23?"},
                 {"role": "assistant", "content": "<tool_call>{...}</tool_call>"}, {"role": "tool", "name": "calculator", "content": "391"}, {"role": "assistant", "content": "391"}],
    "turn_rewards": [None, 1.0],
    "turn_info": [{"tool_calls": [{"name": "calculator", "call": "<tool_call>{...}</tool_call>", "status": "ok",
                                   "result": "391"},
                                  {"name": "calculator", "call": "<tool_call>{bad</tool_call>", "status": "malformed",
                                   "result": "error: ..."}]},
                  {"tool_calls": 0, "loss": None, "obj": "<marker>"}],
    "tool_calls": [{"turn": 1, "name": "calculator", "status": "ok"}, {"turn": 1, "name": "calculator",
                                                                        "status": "malformed"}],
}  # fmt: skip


def test_a_trajectorys_row_carries_its_structure_and_a_single_turn_row_is_as_before(tmp_path):
    import json

    from rlvr.metrics.samples import TRAJECTORY_COLUMNS
    from rlvr.metrics.sinks import JsonlSink

    prompts, comps, scored = _batch([[True, True]])
    comps[1] = _trajectory()
    single, traj = sample_rows(prompts, comps, scored, "math", 2)
    assert list(single) == list(COLUMNS) and single["response"] == "r10.0" and single["finish"] == "length"
    assert list(traj) == list(COLUMNS) + list(TRAJECTORY_COLUMNS)
    assert traj == TRAJECTORY_ROW
    with JsonlSink(tmp_path / "metrics.jsonl") as sink:
        sink.log_table(4, [single, traj])
    lines = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert lines == [{"step": 4, **single}, {"step": 4, **TRAJECTORY_ROW}]  # JSON data, not one joined string


def test_eval_records_a_trajectory_as_the_training_file_does():
    import types

    from rlvr.evaluate import sample_record

    prompts, _, scored = _batch([[True]])
    ls = types.SimpleNamespace(spec=types.SimpleNamespace(name="set"), file_rows={10: 3})
    record = sample_record(ls, prompts[0], _trajectory(), scored[0], "math")
    from rlvr.metrics.samples import TRAJECTORY_COLUMNS

    assert {k: record[k] for k in TRAJECTORY_COLUMNS} == {k: TRAJECTORY_ROW[k] for k in TRAJECTORY_COLUMNS}
    assert (record["response"], record["finish_reason"], record["row"]) == ("391", "stop", 3)


def test_the_console_table_shows_a_trajectorys_conversation(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    out = io.StringIO()
    print_sample_table(3, [TRAJECTORY_ROW], width=200, file=out)
    assert "[assistant 1] <tool_call>{...}</tool_call> / [tool] 391 / [assistant 2] 391" in out.getvalue()


def test_other_backends_get_a_list_or_dict_cell_as_json_text():
    from rlvr.metrics.sinks import flat_cell, markdown_table

    assert flat_cell([{"turn": 1, "name": "calculator", "status": "ok"}]) == (
        '[{"turn": 1, "name": "calculator", "status": "ok"}]')
    assert flat_cell({"x": float("inf")}) == '{"x": null}' and flat_cell(0.5) == 0.5 and flat_cell(None) is None
    assert markdown_table([{"turn_rewards": [None, 1.0]}]).splitlines()[-1] == "| [null, 1.0] |"


def test_the_first_prompt_is_logged_with_its_template_markup(caplog):
    import logging

    from transformers import AutoTokenizer

    from rlvr.metrics.samples import log_first_prompt
    from rlvr.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny-random"))
    text = "<|im_start|>system\ntools: add<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    with caplog.at_level(logging.INFO, logger="rlvr"):
        line = log_first_prompt(Prompt(index=7, text="", prompt_ids=ids, gold="5"), tok)
    assert line == f"the first prompt (data row 7, {len(ids)} tokens) as the model sees it:\n{text}"
    assert [r.getMessage() for r in caplog.records] == [line]


def test_the_console_table_says_how_a_trajectory_ended_and_that_a_failed_one_is_excluded(monkeypatch):
    """A trajectory ended by an environment failure is left out of the update whatever its verifier said: the table
    shows "excluded", not its reward, and the end reason in an "ended" column (issue 38: a new user saw a crashed
    trajectory as "1.0000 ok")."""
    monkeypatch.setenv("COLUMNS", "300")
    crashed = {**TRAJECTORY_ROW, "sample_index": 2, "reward": 1.0, "end_reason": "env: error: RuntimeError: boom",
               "failure": "error: RuntimeError: boom\nTraceback ..."}  # fmt: skip
    out = io.StringIO()
    print_sample_table(3, [TRAJECTORY_ROW, crashed], width=40, file=out)
    lines = [ln for ln in out.getvalue().splitlines() if "10/" in ln]
    assert "1.2500" in lines[0] and "done" in lines[0] and "excluded" not in lines[0]
    assert "excluded" in lines[1] and "1.0000" not in lines[1] and "env: error: RuntimeError: boom" in lines[1]
    out = io.StringIO()  # single-turn rows: no "ended" column
    print_sample_table(3, [{k: v for k, v in TRAJECTORY_ROW.items() if k not in ("end_reason", "messages")}],
                       file=out)  # fmt: skip
    assert "ended" not in out.getvalue()
