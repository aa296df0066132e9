"""``rlvr verify``: rows scored through the scoring pool, one result per row in order, bad input per row, summary.

Expected scores are worked out by hand per row in the comments.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.verify_cli import percentile, reason_key

LINES = [
    json.dumps({"id": "a", "response": "So 6*7 = 42.\n#### 42", "gold": "42"}),  # 1: 42 after ####: correct
    json.dumps({"id": "b", "response": "I think it is 41", "gold": 42.0}),  # 2: last number 41, gold 42: wrong
    "{not json",  # 3: bad JSON
    "",  # blank: skipped, no result
    json.dumps({"response": "#### 1,000", "gold": "1000"}),  # 5: thousands separator (V8): correct, no id
    json.dumps({"id": "e", "gold": "3"}),  # 6: no response field
    json.dumps(["a", "list"]),  # 7: not an object
    json.dumps({"id": "g", "response": "", "gold": "5"}),  # 8: empty response: no_answer
]


def run(argv: list[str]) -> int:
    return main(["verify", *argv])


def test_verify_numeric_rows_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(LINES) + "\n")
    assert run([str(src), "--verifier", "numeric", "--output", str(out), "--workers", "1"]) == 0
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["line"] for r in results] == [1, 2, 3, 5, 6, 7, 8]
    assert [r.get("id") for r in results] == ["a", "b", None, None, "e", None, "g"]
    assert [r["score"] for r in results] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert [r["parsed"] for r in results] == ["42", "41", None, "1000", None, None, None]
    reasons = [r["reason"] for r in results]
    assert reasons[:2] == [None, "wrong"] and reasons[3] is None and reasons[6] == "no_answer"
    assert reasons[2].startswith("bad_input: line 3 is not valid JSON")
    assert reasons[4] == "bad_input: no field 'response' (fields: id, gold)"
    assert reasons[5] == "bad_input: line 7 is a JSON list, not an object"
    assert all(r["latency_s"] >= 0 for r in results if not (r["reason"] or "").startswith("bad_input"))
    summary = capsys.readouterr().out
    # 7 rows, 2 correct: mean 2/7 = 0.2857; reasons by kind: bad_input 3, correct 2, wrong 1, no_answer 1
    assert "rows: 7" in summary and "mean score: 0.2857" in summary
    for line in ("  bad_input: 3", "  correct: 2", "  wrong: 1", "  no_answer: 1"):
        assert line in summary
    assert "over 4 scored rows" in summary


def test_verify_to_stdout_fields_and_file_verifier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "plug.py"
    plugin.write_text(textwrap.dedent(
        """
        def starts(response, gold, **row):
            return response.startswith(gold * row["times"])
        """
    ))
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"completion": "aaab", "answer": "a", "times": 3},  # 'aaa' prefix: 1
        {"completion": "aab", "answer": "a", "times": 3},  # 0, reason 'wrong' (a False)
        {"completion": "xx", "answer": "x"},  # no 'times': the function raises KeyError -> error reason
    ]))
    code = run([str(src), "--verifier", f"{plugin}:starts", "--response-field", "completion",
                "--gold-field", "answer", "--workers", "1"])
    assert code == 0
    captured = capsys.readouterr()
    results = [json.loads(x) for x in captured.out.splitlines()]  # results on stdout, summary on stderr
    assert [r["score"] for r in results] == [1.0, 0.0, 0.0]
    assert results[1]["reason"] == "wrong" and results[2]["reason"].startswith("error: KeyError")
    assert "rows: 3" in captured.err and "mean score: 0.3333" in captured.err


def test_verify_countdown_with_args_and_row_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"response": "<answer>(8+2)*(6-4)</answer>", "gold": 20, "numbers": [6, 4, 2, 8]},  # 10*2 = 20, all used
        {"response": "<answer>8*2+4</answer>", "gold": 20, "numbers": [6, 4, 2, 8]},  # 20, but 6 unused
    ]))
    code = run([str(src), "--verifier", "countdown", "--args", '{"use_all": true}', "-o", str(out)])
    assert code == 0
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["score"], r["reason"]) for r in results] == [(1.0, None), (0.0, "unused_numbers: [6]")]
    assert "  unused_numbers: 1" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["missing.jsonl", "--verifier", "numeric"], "input file 'missing.jsonl' not found"),
        (["{src}", "--verifier", "numerc"], "cannot build verifier 'numerc'"),  # names the nearest: numeric
        (["{src}", "--verifier", "format"], "at least one of think, boxed, answer_tag"),
        (["{src}", "--verifier", "numeric", "--args", "[1]"], "--args must be a JSON object"),
        (["{src}", "--verifier", "numeric", "--workers", "0"], "--workers must be >= 1"),
    ],
)
def test_verify_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"response": "1", "gold": "1"}) + "\n")
    assert run([a.replace("{src}", str(src)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    if "numerc" in argv:
        assert "Did you mean 'numeric'?" in err


def test_percentile_and_reason_key() -> None:
    # nearest rank over 1..100: p50 is the 50th value, p99 the 99th; over [3, 1, 2]: p50 = 2nd smallest = 2
    values = [float(v) for v in range(100, 0, -1)]
    assert (percentile(values, 50), percentile(values, 99)) == (50.0, 99.0)
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert math.isnan(percentile([], 50))
    assert [reason_key(r) for r in (None, "wrong", "unknown_number: 7", "bad_input: line 3")] == [
        "correct", "wrong", "unknown_number", "bad_input"
    ]


# ---------------------------------------------------------------------------------------------------------
# issue 9 item 12: golds read as --answer-format says and checked as training checks them

REPO = Path(__file__).resolve().parents[2]


def _gsm8k_rows(n: int) -> list[dict]:
    rows = [json.loads(x) for x in (REPO / "data/gsm8k/test.jsonl").read_text().splitlines()[:n]]
    # the right answer, boxed; the gold field holds the whole worked solution ending in '#### N'
    return [{"response": f"So \\boxed{{{r['answer'].rsplit('####', 1)[1].strip()}}}.", "gold": r["answer"]}
            for r in rows]


def test_verify_gsm8k_solutions_as_gold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in _gsm8k_rows(200)) + "\n")
    # default (raw): before, 200 right answers scored 0 'wrong' silently; now each is refused with the fix
    assert run([str(src), "--verifier", "math", "-o", str(out)]) == 0
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(results) == 200 and all(r["score"] == 0.0 for r in results)
    assert all(r["reason"].startswith("bad_gold: a whole worked solution") for r in results)
    summary = capsys.readouterr().out
    assert "WARNING: 200 of 200 rows have a gold the verifier cannot use" in summary
    assert "--answer-format gsm8k" in summary and "and 195 more" in summary
    # the fix: all 200 right
    assert run([str(src), "--verifier", "math", "--answer-format", "gsm8k", "-o", str(out)]) == 0
    assert [json.loads(x)["score"] for x in out.read_text().splitlines()] == [1.0] * 200
    assert "mean score: 1.0000" in capsys.readouterr().out


def test_verify_labelled_gold_and_bad_gold_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"response": r"\boxed{9}", "gold": "9 (apples)"},  # 9 = 9 by the unit rule: 1
        {"response": r"\boxed{8}", "gold": "9 (apples)"},  # 8 != 9: 0 wrong
        {"response": "#### 5", "gold": "no marker"},  # --answer-format gsm8k: no '####' in the gold
    ]) + "\n")
    for verifier in ("math", "numeric"):
        assert run([str(src), "--verifier", verifier, "-o", str(out), "--answer-format", "gsm8k"]) == 0
        results = [json.loads(x) for x in out.read_text().splitlines()]
        assert [r["score"] for r in results] == [0.0, 0.0, 0.0]  # gsm8k format: '9 (apples)' has no marker
    assert run([str(src), "--verifier", "numeric", "-o", str(out)]) == 0
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["score"], r["reason"]) for r in results[:2]] == [(1.0, None), (0.0, "wrong")]
    assert results[2]["reason"] == "bad_gold: not one number"
    capsys.readouterr()
    # units: refuse and --bad-gold error: exit 2 before scoring, the message names the fix
    assert run([str(src), "--verifier", "math", "--args", '{"units": "refuse"}', "--bad-gold", "error",
                "-o", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err
    # rows 1-2 refused (a label under units: refuse); 'no marker' is two words, a text answer for math: usable
    assert "2 of 3 rows" in err and "units: number" in err and not (tmp_path / "none.jsonl").exists()
