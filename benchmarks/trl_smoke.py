"""TRL's GRPOTrainer on rlvr's smoke task, for side-by-side reward-per-step and seconds-per-step (issues 10, 14).

The same model (the embedded SmolLM2-135M-Instruct folder), questions (``data.generated`` of
``recipes/smoke_cpu.yaml``, same seed), prompt template and chat template, 8 prompts x 8 samples, 64 new tokens,
T = 1, lr 1e-5, clip 0.2, no KL, one optimizer step per rollout batch, token-mean loss (TRL ``loss_type="dapo"``),
every completion scored by rlvr's own ``math`` verifier. TRL is not an rlvr dependency: install it in a separate
environment beside rlvr's, e.g.

    python3 -m venv /tmp/trl && echo "import site; site.addsitedir('$PWD/.venv/lib/python3.11/site-packages')" \
        > /tmp/trl/lib/python3.11/site-packages/rlvr_env.pth && /tmp/trl/bin/pip install --no-deps trl==1.16.0 accelerate
    /tmp/trl/bin/python benchmarks/trl_smoke.py --steps 6 --seed 1 --dtype float32

Prints one JSON line per step: ``{"step", "reward_mean", "step_s"}`` (reward/mean as rlvr's metrics name it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16: TRL's bf16 autocast over fp32 weights (slow on a CPU without AMX)")
    p.add_argument("--out", default="/tmp/trl_smoke")
    a = p.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.recipe import load_recipe
    from rlvr.data.generated import generated_split
    from rlvr.models import resolve_model
    from rlvr.reward.base import build_verifier

    r = load_recipe(REPO / "recipes" / "smoke_cpu.yaml", [f"run.seed={a.seed}"])
    torch.set_num_threads(2)
    model_dir = resolve_model(r.model.path)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = generated_split(r.data.generated, r.run.seed)
    template = r.data.prompt_template
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": template.replace("{question}", x["question"])}],
                             "answer": x["answer"]} for x in rows])  # fmt: skip
    verifier = build_verifier(r.reward.verifiers[0])

    def reward(completions, answer, **_):
        return [float(verifier.verify(c[0]["content"] if isinstance(c, list) else c, g).score)
                for c, g in zip(completions, answer)]  # fmt: skip

    n_gen = r.rollout.samples_per_prompt
    cfg = GRPOConfig(
        output_dir=a.out, seed=a.seed, use_cpu=True, bf16=a.dtype == "bfloat16", max_steps=a.steps,
        learning_rate=r.trainer.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=r.trainer.weight_decay,
        adam_beta1=r.trainer.betas[0], adam_beta2=r.trainer.betas[1], max_grad_norm=r.trainer.grad_clip,
        per_device_train_batch_size=r.trainer.micro_batch_size,
        gradient_accumulation_steps=r.samples_per_step // r.trainer.micro_batch_size,
        num_generations=n_gen, max_completion_length=r.rollout.max_new_tokens, temperature=r.rollout.temperature,
        top_p=1.0, beta=0.0, epsilon=r.algorithm.policy_loss.settings.clip_low, num_iterations=1, loss_type="dapo",
        scale_rewards="group", logging_steps=1, report_to=[], save_strategy="no", dataloader_num_workers=0,
    )  # fmt: skip

    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok)
    trainer.train()
    for h in trainer.state.log_history:  # one entry per optimizer step (logging_steps=1), then a summary
        if "reward" in h:
            print(json.dumps({"step": h.get("step"), "reward_mean": float(h["reward"]),
                              "step_s": float(h.get("step_time", float("nan")))}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
