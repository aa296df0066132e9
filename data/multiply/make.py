"""Writes train.jsonl and test.jsonl: "What is A times B?" with A, B three-digit (100-999), the exact product as
``answer``, and ``messages``: two worked examples of calling the ``calculator`` tool (Hermes-style
``<tool_call>`` JSON, the result, the boxed answer) before the question, so that a small model sees the call
format in its context (recipes/tools_cpu.yaml). Made by this script from random.Random(26) (no outside source):
1000 training rows and 100 held-out rows, no pair in both. Run: python data/multiply/make.py
"""

import json
import random
from pathlib import Path

SUFFIX = " Put your final answer within \\boxed{}."


def shot(a: int, b: int) -> list[dict[str, str]]:
    call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})
    return [{"role": "user", "content": f"What is {a} times {b}?{SUFFIX}"},
            {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
            {"role": "tool", "content": str(a * b)},
            {"role": "assistant", "content": f"\\boxed{{{a * b}}}"}]  # fmt: skip


def main() -> None:
    rng = random.Random(26)
    examples = shot(123, 456) + shot(807, 29)
    pairs: list[tuple[int, int]] = []
    seen = {(123, 456), (807, 29)}
    while len(pairs) < 1100:
        a, b = 100 + int(rng.random() * 900), 100 + int(rng.random() * 900)
        if (a, b) not in seen:
            seen.add((a, b))
            pairs.append((a, b))
    here = Path(__file__).parent
    for name, part in (("train.jsonl", pairs[:1000]), ("test.jsonl", pairs[1000:])):
        with open(here / name, "w", encoding="utf-8") as f:
            for i, (a, b) in enumerate(part):
                q = f"What is {a} times {b}?"
                row = {"id": f"{name.split('.')[0]}-{i}", "question": q, "answer": str(a * b),
                       "messages": examples + [{"role": "user", "content": q + SUFFIX}]}  # fmt: skip
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
