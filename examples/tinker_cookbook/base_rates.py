"""How often does the untrained model already earn the recipes' rewards? (no server needed)

    source examples/tinker_cookbook/env.sh
    nice python examples/tinker_cookbook/base_rates.py --model-dir ~/.cache/rlvr/models/smollm2-135m-instruct

Samples SmolLM2-135M-Instruct locally with transformers (temperature 1, as the recipes sample),
on the recipes' own prompts built by the ``smollm2`` renderer, and scores with the recipes'
own reward code:
- math_rl ``env=arithmetic``: ArithmeticEnv's few-shot prompt and question, x, y in [0, 100],
  ``max_tokens`` new tokens; correct = ArithmeticEnv.check_answer (last integer equals x + y);
  format = the stop token came within max_tokens (reward = correct + format_coef * (format - 1),
  ProblemEnv's formula, ArithmeticEnv's format_coef 0.1);
- rl_loop: its GSM8K prompt (strawberry few-shot, boxed-answer suffix), ``get_reward``.
A baseline for reading the recipes' reward curves; the server's sampler may differ in numerics.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="the model folder (rlvr's embedded SmolLM2)")
    ap.add_argument("--arithmetic", type=int, default=40, help="arithmetic problems (x --samples each)")
    ap.add_argument("--arithmetic-max-tokens", type=int, default=5)
    ap.add_argument("--gsm8k", type=int, default=8, help="GSM8K questions (x --samples each)")
    ap.add_argument("--gsm8k-max-tokens", type=int, default=256)
    ap.add_argument("--samples", type=int, default=4, help="samples per problem or question")
    args = ap.parse_args()

    import datasets
    from rlvr_smollm2_hook import MODEL_NAME, RENDERER_NAME
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv
    from tinker_cookbook.recipes.rl_loop import get_reward
    from tinker_cookbook.tokenizer_utils import get_tokenizer
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    tok = get_tokenizer(MODEL_NAME)
    r = renderers.get_renderer(RENDERER_NAME, tok)
    stop = r.get_stop_sequences()[0]
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()

    def sample(prompt: list[int], n: int, max_new: int) -> list[list[int]]:
        ids = torch.tensor([prompt] * n)
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new,
                eos_token_id=stop,
                pad_token_id=stop,
            )
        # generate pads finished rows with the stop token: keep up to the first one
        return [s[: s.index(stop) + 1] if stop in s else s for s in (x[len(prompt) :].tolist() for x in out)]

    def text(tokens: list[int]) -> str:
        return renderers.get_text_content(r.parse_response(tokens)[0])

    rng = np.random.RandomState(0)
    t = time.time()
    correct = fmt = n = 0
    # the recipe's own problems (x, y drawn as ArithmeticDataset draws them, here from seed 0): its question, answer
    # check and format_coef
    fewshot = ArithmeticEnv.standard_fewshot_prefix()
    envs = [
        ArithmeticEnv(rng.randint(0, 101), rng.randint(0, 101), r, convo_prefix=fewshot) for _ in range(args.arithmetic)
    ]
    for env in envs:
        convo = env.convo_prefix + [{"role": "user", "content": env.get_question()}]
        for s in sample(r.build_generation_prompt(convo).to_ints(), args.samples, args.arithmetic_max_tokens):
            correct += env.check_answer(text(s))
            fmt += stop in s
            n += 1
    if n:
        print(
            f"arithmetic (x, y in [0, 100], {args.arithmetic_max_tokens} new tokens): correct {correct}/{n} = "
            f"{correct / n:.3f}, stop token in time {fmt}/{n} = {fmt / n:.3f}, "
            f"mean reward {(correct + envs[0].format_coef * (fmt - n)) / n:+.3f} ({time.time() - t:.0f} s)"
        )

    suffix = " Provide a numerical answer without units, written inside \\boxed{}."
    prefix = [
        {"role": "user", "content": "How many r's are in strawberry?" + suffix},
        {
            "role": "assistant",
            "content": "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a "
            "5) w 6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}",
        },
    ]
    ds = datasets.load_dataset("openai/gsm8k", "main")["train"]
    t = time.time()
    rewards, lengths = [], []
    for i in range(args.gsm8k):
        prompt = r.build_generation_prompt(prefix + [{"role": "user", "content": ds[i]["question"] + suffix}]).to_ints()
        for s in sample(prompt, args.samples, args.gsm8k_max_tokens):
            rewards.append(get_reward(text(s), ds[i]["answer"]))
            lengths.append(len(s))
    if rewards:
        print(
            f"gsm8k (rl_loop prompt, first {args.gsm8k} train questions, {args.gsm8k_max_tokens} new tokens): "
            f"reward {sum(rewards):.0f}/{len(rewards)} = {np.mean(rewards):.3f}, mean completion "
            f"{np.mean(lengths):.0f} tokens ({time.time() - t:.0f} s)"
        )


if __name__ == "__main__":
    main()
