"""``rlvr eval`` end to end: the real command on ``tiny-random`` with the vLLM engine and the scoring pool.

Two sets in one run: the ``gsm8k`` preset (first 3 rows, the ``math`` verifier) and a user file scored by
:func:`parity_verifier` below (loaded by the pool from this file, ``path.py:attr``), which marks about half of the
garbage responses correct, so that the metrics checked against the saved samples are not all zero.
About 15 s on an idle 2-core machine (vLLM import and start ~8 s), 40 s under load.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.types import VerifyResult

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "data" / "gsm8k" / "test.jsonl"


def parity_verifier(response: str, gold: str, **row) -> VerifyResult:
    """Correct when the response has an even number of characters; the parsed answer is its length mod 3
    (None for an empty response), so wrong samples vote for a few different answers."""
    parsed = None if not response else str(len(response) % 3)
    if len(response) % 2 == 0:
        return VerifyResult(score=1.0, parsed=parsed)
    return VerifyResult(score=0.0, parsed=parsed, reason="wrong")


def _pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _maj_at_2(samples: list[dict]) -> float:
    """maj@2 of a problem with n = 2 (one subset, the pair): both correct -> 1; one correct and the other
    abstains -> 1; one correct against one wrong vote -> a tie, 1/2; none correct -> 0."""
    correct = [s["correct"] for s in samples]
    if all(correct):
        return 1.0
    if not any(correct):
        return 0.0
    other = next(s for s in samples if not s["correct"])
    return 1.0 if other["parsed"] is None else 0.5


@pytest.mark.integration
def test_rlvr_eval_tiny_random_vllm(tmp_path):
    mine = tmp_path / "mine.jsonl"
    rows = [{"q": f"What is {i} plus {i}?", "a": 2 * i, "id": f"m{i}"} for i in range(5)]
    mine.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "rlvr.cli", "eval", "tiny-random", "--data", "gsm8k", str(mine), "--limit", "3",
           "--n", "2", "--max-new-tokens", "12", "--question-field", "q", "--answer-field", "a",
           "--verifier", f"{Path(__file__).resolve()}:parity_verifier", "--workers", "1", "-o", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pass@1" in proc.stdout and "overall (pooled)" in proc.stdout
    # the console is rlvr's (issue 24): the third-party noise rlvr train keeps off it (vLLM's Triton check, torch's
    # NUMA warning, the safetensors progress bar and its blank line) and colour codes are gone
    assert "INFO rlvr.rollout.vllm_engine: vLLM engine up in " in proc.stderr
    for noise in ("Triton", "NUMA binding", "Loading safetensors checkpoint shards", "\x1b", "\n\n"):
        assert noise not in proc.stderr, (noise, proc.stderr[-3000:])

    res = json.loads((out / "results.json").read_text())
    assert set(res) == {"model", "settings", "datasets", "overall", "timing", "files"}
    assert list(res["datasets"]) == ["gsm8k", "mine"]
    assert res["settings"]["n"] == 2 and res["settings"]["interval"]["resamples"] == 1000
    names = {f"{m}@{k}" for m in ("pass", "maj", "mean") for k in (1, 2)}
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 3 * 2  # 2 sets x 3 problems x n = 2

    gold_rows = [json.loads(x) for x in GSM8K.read_text().splitlines()[:3]]
    for name, d in res["datasets"].items():
        assert (d["rows"], d["problems"], d["bad_gold"], d["too_long"]) == (3, 3, 0, 0)
        assert set(d["metrics"]) == names and d["stats"]["samples"] == 6
        mine_lines = [s for s in lines if s["dataset"] == name]
        assert [(s["row"], s["sample"]) for s in mine_lines] == [(r, j) for r in range(3) for j in range(2)]
        for s in mine_lines:
            assert set(s) >= {"id", "prompt", "response", "parsed", "score", "reason", "correct", "finish_reason"}
            assert s["correct"] == (s["score"] >= 1.0) and s["tokens"] <= 12
        if name == "gsm8k":  # the first rows in file order, with their golds
            assert [s["gold"] for s in mine_lines[::2]] == [r["answer"].split("#### ")[1] for r in gold_rows]
            assert all(gold_rows[s["row"]]["question"] in s["prompt"] for s in mine_lines)
        else:
            assert [s["id"] for s in mine_lines[::2]] == ["m0", "m1", "m2"] and mine_lines[2]["gold"] == "2"
            assert all(s["correct"] == (len(s["response"]) % 2 == 0) for s in mine_lines)
        _check_consistent(d["metrics"], [mine_lines[i : i + 2] for i in range(0, 6, 2)])
    # overall: pooled over the 6 problems of both sets
    _check_consistent(res["overall"]["metrics"], [lines[i : i + 2] for i in range(0, 12, 2)])
    assert res["overall"]["problems"] == 6 and res["overall"]["samples"] == 12


def _check_consistent(metrics: dict, problems: list[list[dict]]) -> None:
    """The metrics recomputed from the saved samples; every interval holds its value."""
    n_correct = [sum(s["correct"] for s in p) for p in problems]
    mean_correct = sum(n_correct) / (2 * len(problems))
    assert metrics["pass@1"]["value"] == pytest.approx(mean_correct)
    assert metrics["mean@1"]["value"] == pytest.approx(mean_correct)
    assert metrics["mean@2"]["value"] == pytest.approx(mean_correct)
    assert metrics["maj@1"]["value"] == pytest.approx(mean_correct)
    assert metrics["pass@2"]["value"] == pytest.approx(sum(_pass_at_k(2, c, 2) for c in n_correct) / len(problems))
    assert metrics["maj@2"]["value"] == pytest.approx(sum(_maj_at_2(p) for p in problems) / len(problems))
    for m in metrics.values():
        lo, hi = m["ci"]
        assert lo <= m["value"] + 1e-12 and m["value"] <= hi + 1e-12


def digit_verifier(response: str, gold: str, **row) -> VerifyResult:
    """Correct when the response's last integer is the gold (as the guessing game's own judgement)."""
    import re

    found = re.findall(r"-?\d+", response)
    if found and int(found[-1]) == int(gold):
        return VerifyResult(score=1.0, parsed=found[-1])
    return VerifyResult(score=0.0, parsed=found[-1] if found else None, reason="wrong" if found else "no_answer")


@pytest.mark.slow
@pytest.mark.integration
def test_rlvr_eval_environment_trajectories(tmp_path):
    """``rlvr eval --environment guess`` (issue 25): n trajectories per problem through the real turn loop, the
    environment workers and the engine, on the embedded SmolLM2-135M-Instruct (it answers with a number and ends its
    turn, where the random tiny model runs into the token limit); each saved trajectory's conversation is checked against the game's rules by
    hand (the reply to a wrong guess g says higher exactly when g < the secret), its turn count against its messages,
    and the set's stats and pass@k against the saved trajectories."""
    import re

    mine = tmp_path / "secrets.jsonl"
    q = "I am thinking of a whole number from 1 to 4. Guess it: reply with one number."
    mine.write_text("".join(json.dumps({"q": q, "a": a}) + "\n" for a in (1, 2, 3)))
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "rlvr.cli", "eval", "smollm2-135m-instruct", "--data", str(mine), "--n", "2",
           "--max-new-tokens", "32", "--prompt-template", "{question}", "--question-field", "q", "--answer-field", "a", "--dtype", "float32",
           "--verifier", f"{Path(__file__).resolve()}:digit_verifier", "--workers", "1", "--environment", "guess",
           "--env-args", '{"low": 1, "high": 4}', "--max-turns", "3", "--max-trajectory-tokens", "160",
           "-o", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "turns per trajectory" in proc.stdout
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["environment"]["name"] == "guess"
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 3 * 2
    for s in lines:
        msgs, secret = s["messages"], int(s["gold"])
        assert [m["role"] for m in msgs[1:]] == ["assistant", "user"] * (s["turns"] - 1) + ["assistant"]
        assert msgs[-1]["content"] == s["response"] and 1 <= s["turns"] <= 3
        for said, reply in zip(msgs[1::2], msgs[2::2]):
            found = re.findall(r"-?\d+", said["content"])
            if not found:
                assert reply["content"] == "Reply with a whole number between 1 and 4."
            else:
                g = int(found[-1])
                assert g != secret and reply["content"] == f"{g} is wrong: my number is " \
                    f"{'higher' if g < secret else 'lower'}. Guess again."
        assert (s["end_reason"] == "done") == s["correct"]  # the game ends exactly on the verifier's right answer
        assert s["end_reason"] in ("done", "max_turns", "length", "budget")
        assert s["end_reason"] != "max_turns" or s["turns"] == 3
    st = res["datasets"]["secrets"]["stats"]
    assert st["turns_mean"] == pytest.approx(sum(s["turns"] for s in lines) / 6)
    assert st["solved_after_turn_1_frac"] == pytest.approx(sum(s["correct"] and s["turns"] > 1 for s in lines) / 6)
    assert st["solved_turn_1_frac"] == pytest.approx(sum(s["correct"] and s["turns"] == 1 for s in lines) / 6)
    assert sum(st["end_reasons"].values()) == 6 and st["turns_mean"] > 1.0  # the environment answered
    _check_consistent(res["datasets"]["secrets"]["metrics"], [lines[i : i + 2] for i in range(0, 6, 2)])
