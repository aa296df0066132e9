"""Compare tinker-cookbook renderers with SmolLM2-135M-Instruct's own chat template, token by token.

    source examples/tinker_cookbook/env.sh
    python examples/tinker_cookbook/compare_renderers.py

For each conversation and renderer: is ``build_generation_prompt(messages[:-1])`` equal to
``apply_chat_template(messages[:-1], add_generation_prompt=True)``, and is
``build_supervised_example(messages)`` equal to ``apply_chat_template(messages)``? Where not,
the first differing position and both texts around it are printed. Exit status 0 when the
``smollm2`` renderer (rlvr_smollm2_hook) matches on every generation prompt.
"""

from __future__ import annotations

import sys

from rlvr_smollm2_hook import MODEL_NAME, RENDERER_NAME
from tinker_cookbook import renderers
from tinker_cookbook.tokenizer_utils import get_tokenizer

CONVERSATIONS = {
    "user+assistant": [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "2+3 = 5."},
    ],
    "system+user+assistant": [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "2+3 = 5."},
    ],
    "arithmetic few-shot (math_rl)": [
        {"role": "user", "content": "What is 4 + 5?"},
        {"role": "assistant", "content": "9"},
        {"role": "user", "content": "What is 17 + 26?"},
        {"role": "assistant", "content": "43"},
    ],
}
RENDERERS = [RENDERER_NAME, "qwen3_instruct", "qwen3", "role_colon", "llama3"]


def _ids(x):
    return x if isinstance(x, list) else x["input_ids"]


def _diff(tok, a: list[int], b: list[int]) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (
        f"first difference at token {i} (template {len(a)} tokens, renderer {len(b)}): "
        f"template {tok.decode(a[i : i + 12])!r} vs renderer {tok.decode(b[i : i + 12])!r}"
    )


def main() -> int:
    tok = get_tokenizer(MODEL_NAME)
    smollm2_ok = True
    for rname in RENDERERS:
        try:
            r = renderers.get_renderer(rname, tok)
            stop = r.get_stop_sequences()
        except Exception as e:  # a renderer that cannot work with this tokenizer at all
            print(f"{rname:15s} cannot be built for SmolLM2's tokenizer: {type(e).__name__}: {e}")
            continue
        print(f"{rname:15s} stop sequences {stop}")
        for cname, convo in CONVERSATIONS.items():
            ref_gen = _ids(tok.apply_chat_template(convo[:-1], tokenize=True, add_generation_prompt=True))
            ref_sup = _ids(tok.apply_chat_template(convo, tokenize=True))
            try:
                gen = r.build_generation_prompt(convo[:-1]).to_ints()
                sup = r.build_supervised_example(convo)[0].to_ints()
            except Exception as e:
                print(f"  {cname:30s} error: {type(e).__name__}: {str(e)[:120]}")
                smollm2_ok &= rname != RENDERER_NAME
                continue
            g = "equal" if gen == ref_gen else _diff(tok, ref_gen, gen)
            if sup == ref_sup:
                s = "equal"
            elif sup == ref_sup[:-1] and tok.decode(ref_sup[-1:]) == "\n":
                s = "equal but for the template's '\\n' after the final <|im_end|> (the stop token ends the sample)"
            else:
                s = _diff(tok, ref_sup, sup)
            print(f"  {cname:30s} prompt: {g}\n  {'':30s} supervised: {s}")
            if rname == RENDERER_NAME and gen != ref_gen:
                smollm2_ok = False
    return 0 if smollm2_ok else 1


if __name__ == "__main__":
    sys.exit(main())
