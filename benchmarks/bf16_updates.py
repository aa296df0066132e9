"""Do small optimizer updates survive in bf16? The trainer's precision modes side by side (issue 10).

Each variant trains the same policy on the same fixed batch (random response tokens, fixed +-1 advantages) for
``--steps`` optimizer steps at ``--lr`` through rlvr's real :class:`rlvr.train.policy.PolicyWorker`, each in its own
child process (a DeepSpeed engine leaves torch.distributed state behind). After every step it records:

- ``master``: L2 distance of the fp32 master weights from their start (DeepSpeed: ``safe_get_full_fp32_param``;
  torch: the parameters themselves), and the share of master elements that sat exactly on the bf16 grid at start;
- ``visible``: the weights the forward pass and a weight sync use (``PolicyWorker._named_weights``: the recipe dtype)
  -- their L2 distance from the start, the share of elements that changed, and ``carried``, the projection
  ``<dv, dm> / |dm|^2`` of their change onto the master's change (1: the visible weights follow the master on
  average; 0: the update is lost);
- ``gain``: the objective the advantages ask for, ``mean_t adv * (lp_k - lp_0)`` over response tokens, with the
  visible weights evaluated in fp32 (what a perfect engine would sample from after the sync), in nats per token;
- ``grad``: the dtype autograd hands back for one matrix's gradient (the accumulation buffer's dtype);
- the child process's peak RSS (the worker, plus the fp32 model the benchmark evaluates with).

The fp32 torch variant is the reference; ``gain`` is also printed as a ratio to it.
Run (about 10 min on 2 cores; bf16 matmuls are ~100x slower than fp32 on a CPU without AMX/AVX512-BF16):

    .venv/bin/python benchmarks/bf16_updates.py --layers 2 --steps 6 --lr 1e-5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {  # name -> recipe overrides
    "torch-fp32": ["trainer.backend=torch", "model.dtype=float32"],
    "torch-bf16": ["trainer.backend=torch", "model.dtype=bfloat16"],
    "ds2-fp32": ["trainer.backend=deepspeed", "trainer.zero_stage=2", "model.dtype=float32"],
    "ds2-bf16": ["trainer.backend=deepspeed", "trainer.zero_stage=2", "model.dtype=bfloat16"],
    "ds3-fp32": ["trainer.backend=deepspeed", "trainer.zero_stage=3", "model.dtype=float32"],
    "ds3-bf16": ["trainer.backend=deepspeed", "trainer.zero_stage=3", "model.dtype=bfloat16"],
}


def truncated_model(name: str, layers: int, out: Path) -> str:
    """The embedded model with only its first ``layers`` decoder layers (real weights; fp32 on disk)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.models import resolve_model

    src = resolve_model(name)
    if layers <= 0:
        return src
    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    m.model.layers = m.model.layers[:layers]
    m.config.num_hidden_layers = layers
    if getattr(m.config, "layer_types", None):
        m.config.layer_types = m.config.layer_types[:layers]
    m.save_pretrained(out)
    return str(out)


def fixed_batch(vocab: int, seqs: int, prompt: int, response: int, seed: int = 0):
    import torch

    from rlvr.train.batch import pack
    from rlvr.types import Completion

    g = torch.Generator().manual_seed(seed)
    comps = [Completion(prompt_index=i // 4, sample_index=i % 4,
                        prompt_ids=torch.randint(10, vocab, (prompt,), generator=g).tolist(),
                        token_ids=torch.randint(10, vocab, (response,), generator=g).tolist(),
                        logprobs=[-5.0] * response, text="", finish_reason="length", policy_version=0)
             for i in range(seqs)]  # fmt: skip
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(seqs)])
    return pack(comps, adv, 0, response)


def one(variant: str, model_dir: str, a) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.recipe import load_recipe
    from rlvr.hardware import free_port
    from rlvr.train.policy import PolicyWorker

    r = load_recipe(str(REPO / "recipes" / "smoke_cpu.yaml"), [
        *VARIANTS[variant], f"trainer.lr={a.lr}", f"trainer.micro_batch_size={a.micro}", "rollout.prompts_per_step=1",
        f"rollout.samples_per_prompt={a.seqs}", f"rollout.max_new_tokens={a.response}", "trainer.threads=2",
    ])  # fmt: skip
    torch.manual_seed(0)
    w = PolicyWorker(r, model_dir, 0, 1, "127.0.0.1", free_port())
    ref32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = fixed_batch(ref32.config.vocab_size, a.seqs, a.prompt, a.response)
    mask = batch.loss_mask.bool()
    adv = batch.advantages[:, None].expand_as(batch.loss_mask)

    def master() -> dict[str, torch.Tensor]:
        if w.ds:
            from deepspeed.utils import safe_get_full_fp32_param

            return {n: safe_get_full_fp32_param(p).detach().float().clone() for n, p in w.module.named_parameters()}
        return {n: p.detach().float().clone() for n, p in w.module.named_parameters()}

    def visible() -> dict[str, torch.Tensor]:
        return {n: t.detach().clone() for n, t in w._named_weights()}

    @torch.no_grad()
    def lp32(weights: dict[str, torch.Tensor]) -> torch.Tensor:
        ref32.load_state_dict({n: t.float() for n, t in weights.items()}, strict=False)
        logits = ref32(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]

    grad_dtypes: set[str] = set()
    target = next(p for n, p in w.module.named_parameters() if n.endswith("mlp.down_proj.weight"))
    target.register_hook(lambda g: grad_dtypes.add(str(g.dtype).removeprefix("torch.")))
    m0, v0 = master(), visible()
    on_grid = sum(int((t.bfloat16().float() == t).sum()) for t in m0.values()) / sum(t.numel() for t in m0.values())
    base = lp32(v0)
    rows = []
    for k in range(1, a.steps + 1):
        s = w.train_step(batch)
        m, v = master(), visible()
        dm = torch.cat([(m[n] - m0[n]).flatten() for n in m0])
        dv = torch.cat([(v[n].float() - v0[n].float()).flatten() for n in m0 if n in v])
        changed = sum(int((v[n] != v0[n]).sum()) for n in v) / sum(t.numel() for t in v.values())
        gain = float((adv * (lp32(v) - base))[mask].mean())
        rows.append({"step": k, "master_l2": float(dm.norm()), "visible_l2": float(dv.norm()),
                     "carried": float((dv @ dm) / (dm @ dm).clamp(min=1e-30)), "changed": changed, "gain": gain,
                     "grad_norm": s["train/grad_norm"], "train_s": s["timing/train_inner_s"]})  # fmt: skip
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the whole process (worker + fp32 copy)
    return {"variant": variant, "on_grid": on_grid, "grad_dtype": sorted(grad_dtypes), "peak_rss_mb": peak_mb,
            "param_dtype": str(target.dtype).removeprefix("torch."), "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--layers", type=int, default=2, help="keep the first N decoder layers (0: all)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--response", type=int, default=8)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    if a.one:
        print("RESULT=" + json.dumps(one(a.one, a.model_dir, a)))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = truncated_model(a.model, a.layers, Path(tmp) / "model")
        for v in a.variants.split(","):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--one", v, "--model-dir", model_dir]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT=")]
            if proc.returncode or not lines:
                print(f"{v}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
                continue
            results.append(json.loads(lines[-1].removeprefix("RESULT=")))
            res = results[-1]
            print(f"{v}: params {res['param_dtype']}, grads {res['grad_dtype']}, master on the bf16 grid at start "
                  f"{res['on_grid']:.1%}, peak RSS {res['peak_rss_mb']:.0f} MB", flush=True)
    ref = next((r for r in results if r["variant"] == "torch-fp32"), None)
    print(f"\nlr {a.lr}, {a.seqs} seqs x ({a.prompt} prompt + {a.response} response) tokens, micro {a.micro}, "
          f"{a.layers or 'all'} layers of {a.model}")
    print(f"{'variant':<11} {'step':>4} {'|dmaster|':>10} {'|dvisible|':>10} {'carried':>8} {'changed':>8} "
          f"{'gain nats':>10} {'gain/fp32':>9} {'train s':>8}")
    for res in results:
        for i, row in enumerate(res["rows"]):
            g_ref = ref["rows"][i]["gain"] if ref else float("nan")
            print(f"{res['variant']:<11} {row['step']:>4} {row['master_l2']:>10.3e} {row['visible_l2']:>10.3e} "
                  f"{row['carried']:>8.3f} {row['changed']:>8.2%} {row['gain']:>10.3e} "
                  f"{row['gain'] / g_ref if g_ref else float('nan'):>9.3f} {row['train_s']:>8.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": results}, indent=1))


if __name__ == "__main__":
    main()
