"""benchmarks/passk_preservation.py's split by question (issue 30): the held-out questions of ``--template chat``
are never trained on, and every row opens with the worked examples as chat turns.

Counts worked out by hand: one-digit operands 0-9 give 10 x 10 = 100 plus and 100 times questions ("3 plus 4" and
"4 plus 3" are different questions) and 55 minus questions (a >= b: 10 + 9 + ... + 1), 255 for mixed1; two-digit
times one-digit: 90 x 10 = 900; plus21: 900 plus and 900 minus (a two-digit a is always larger than b), 1800.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import passk_preservation as pk  # noqa: E402


@pytest.mark.parametrize("task,count", [("mixed1", 255), ("times1", 100), ("times21", 900), ("plus21", 1800)])
def test_every_distinct_question_once(task, count):
    rows = pk.all_questions(task)
    assert len(rows) == count == len({r["question"] for r in rows})


def test_golds_and_minus_order():
    gold = {r["question"]: r["answer"] for r in pk.all_questions("mixed1")}
    assert gold["What is 7 times 7?"] == "49" and gold["What is 3 plus 9?"] == "12" and gold["What is 9 minus 3?"] == "6"
    assert "What is 3 minus 9?" not in gold and gold["What is 0 minus 0?"] == "0"
    assert pk.all_questions("times21")[0] == {"question": "What is 10 times 0?", "answer": "0"}
    assert {r["answer"] for r in pk.all_questions("plus21") if r["question"] == "What is 99 minus 9?"} == {"90"}


def test_split_is_disjoint_complete_and_fixed_by_its_seed():
    train, held = pk.question_split("mixed1", 60, seed=1)
    assert len(held) == 60 and len(train) == 195
    qs_train, qs_held = {r["question"] for r in train}, {r["question"] for r in held}
    assert not qs_train & qs_held  # no held-out question is trained on
    assert qs_train | qs_held == {r["question"] for r in pk.all_questions("mixed1")}
    again = pk.question_split("mixed1", 60, seed=1)[1]
    assert [r["question"] for r in again] == [r["question"] for r in held]
    other = pk.question_split("mixed1", 60, seed=2)[1]
    assert [r["question"] for r in other] != [r["question"] for r in held]


def test_rows_open_with_the_worked_examples_as_chat_turns():
    train, held = pk.question_split("times1", 30, seed=1)
    row = held[0]
    msgs = row["messages"]
    assert [m["role"] for m in msgs] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert msgs[0]["content"] == "Answer with only the final number, in \\boxed{}."
    assert msgs[1]["content"] == "What is 23 plus 45?" and msgs[2]["content"] == "\\boxed{68}"
    assert msgs[6]["content"] == "\\boxed{156}" and msgs[-1]["content"] == row["question"]


def test_bad_holdout_is_refused():
    with pytest.raises(SystemExit, match="100 distinct questions"):
        pk.question_split("times1", 100, seed=1)
