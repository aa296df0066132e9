"""The memory model (rlvr/runtime/memory.py) against the measured peak of a trainer step and of an engine, on CPU.

For each model (the embedded SmolLM2-135M-Instruct, and a random Qwen2-0.5B-shaped model built offline from a
config: hidden 896, 24 layers, 14 heads, 2 kv heads, intermediate 4864, vocabulary 151936, tied embeddings, with
the embedded model's tokenizer, its ids < 49152 all inside the larger vocabulary), two fresh subprocesses:

- ``trainer``: :class:`rlvr.train.policy.PolicyWorker` as the recipe builds it (torch AdamW at one rank, bf16
  autocast over fp32 weights where the CPU has bf16), then ``--steps`` real ``train_step`` calls on a synthetic
  batch of the recipe's size (``prompts_per_step x samples_per_prompt`` sequences of ``--prompt`` prompt tokens and
  ``--response`` response tokens, the last sequence 3 tokens shorter so that the batch is padded as a real one is).
  Measured: the peak RSS of each step (VmHWM of /proc/self/status, reset by writing 5 to /proc/self/clear_refs
  before the step) less the process's RSS before the model was loaded (python + torch + transformers imported);
  the largest over the steps (step 1 creates AdamW's state, step 2 is the steady state);
- ``engine``: :class:`rlvr.rollout.vllm_engine.VLLMEngine` (``rollout.kv_cache_gib``), one ``generate`` of the
  recipe's prompts x samples x ``--response`` tokens; measured: peak RSS less the RSS after ``import torch``.

Both children run with ``MALLOC_MMAP_THRESHOLD_=131072`` (glibc's threshold fixed, so freed tensors go back to the
system and the high-water mark follows live memory, as in benchmarks/logprob_memory.py). The model's figure is
:func:`rlvr.runtime.memory.trainer_memory` / :func:`~rlvr.runtime.memory.engine_memory` for the same sizes.

    .venv/bin/python benchmarks/memory_model.py                         # both models, ~15 min on 2 busy cores
    .venv/bin/python benchmarks/memory_model.py --models smollm2-135m-instruct --steps 1
    .venv/bin/python benchmarks/memory_model.py trainer.gradient_checkpointing=true --roles trainer   # overrides first

On a GPU, ``--cuda --roles trainer``: the trainer on the device, measured by torch's allocator (the peak of
``max_memory_allocated`` per step less what was allocated before the model loaded; the pool reserved beside it),
against ``trainer_memory(..., gpu=True)``; ``--models /tmp/qwen2-1.5b-shaped`` adds a random Qwen2-1.5B-shaped
model; ``--tokenizer-from DIR`` takes the shaped models' tokenizer files from ``DIR`` where the embedded model
cannot be built (no package index). Written 2026-12-04 for a lent H200 that was withdrawn before it ran: not yet
run on a GPU.

    python benchmarks/memory_model.py --cuda --roles trainer --models /tmp/qwen2-0.5b-shaped /tmp/qwen2-1.5b-shaped \\
        --prompt 512 --response 1024

Measured 2026-12-03 on a 2-core, 24 GB CPU machine with AVX512-BF16 (bf16 autocast; other jobs beside it), the
smoke recipe, sequences of 48 + 64 tokens, the trainer's 16 sequences as two micro-batches of 8, 2 steps, GiB:

    model              role     setting                       model  measured  measured/model
    smollm2-135m       trainer  torch AdamW                    3.31      3.52            1.06
    qwen2-0.5b-shaped  trainer  torch AdamW                   10.35     10.55            1.02
    qwen2-0.5b-shaped  trainer  gradient_checkpointing=true    9.20      8.72            0.95
    smollm2-135m       trainer  trainer.lora.rank=16           1.49      1.67            1.12   (2026-12-03, a later run; full 3.31 / 3.55 the same day)
    smollm2-135m       trainer  backend=deepspeed (ZeRO-2)     4.31      4.22            0.98
    smollm2-135m       engine   kv_cache_gib=1                 1.96      1.96            1.00  (fitted)
    qwen2-0.5b-shaped  engine   kv_cache_gib=1                 3.29      3.29            1.00  (fitted)
    smollm2-135m       engine   kv_cache_gib=2                 2.96      2.96            1.00
    qwen2-0.5b-shaped  engine   model.dtype=float32            4.47      4.55            1.02

The two engine rows marked fitted set ENGINE_CPU_OVERHEAD and SAMPLER_ROWS (two constants, two rows); the other
two engine rows check them. With one micro-batch of 8 (``--trainer-batch 8``) the first model summed the gradients
with the activations and over-counted the Qwen2-0.5B-shaped step (10.35 against 8.70 measured): the torch backend
frees the gradients after each step (``set_to_none``), which :attr:`rlvr.runtime.memory.RoleMemory.total` now
follows (8.51 modelled).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / ".wtpath")]  # this checkout's rlvr before any installed one
QWEN_SHAPED = Path(tempfile.gettempdir()) / "qwen2-0.5b-shaped"
QWEN15_SHAPED = Path(tempfile.gettempdir()) / "qwen2-1.5b-shaped"
SHAPES = {
    QWEN_SHAPED: dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=4864),
    QWEN15_SHAPED: dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                        intermediate_size=8960),
}
"""Random models built offline (:func:`build_qwen_shaped`) in the shapes of Qwen2-0.5B and Qwen2-1.5B (their
config.json: vocabulary 151936, tied embeddings, both)."""
GIB = 1 << 30


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field (VmRSS, VmHWM) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> None:
    """Set VmHWM to the current RSS (Linux: ``echo 5 > /proc/self/clear_refs``)."""
    Path("/proc/self/clear_refs").write_text("5")


def build_qwen_shaped(out: Path, tokenizer: Path | None = None) -> Path:
    """A random model of ``SHAPES[out]`` (fp32 safetensors) with the embedded SmolLM2 tokenizer (or the tokenizer
    files of the folder ``tokenizer``), into ``out``."""
    if (out / "config.json").exists():
        return out
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlvr.models import resolve_model

    src = tokenizer or Path(resolve_model("smollm2-135m-instruct"))
    cfg = Qwen2Config(**SHAPES[out], vocab_size=151936, tie_word_embeddings=True,
                      max_position_embeddings=32768, bos_token_id=1, eos_token_id=2, pad_token_id=2, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(src / f, out / f)
    return out


def _recipe(args, role: str):
    """The recipe with ``--model``; the trainer's batch is one prompt x ``--trainer-batch`` samples (the default 16
    is two of the smoke recipe's micro-batches of 8: as in its 64 sequences, the first micro-batch's gradients are
    alive in the second's forward; the same peak in a quarter of the time)."""
    from rlvr.recipe import load_recipe

    extra = ["rollout.prompts_per_step=1", f"rollout.samples_per_prompt={args.trainer_batch}"] if role == "trainer" else []
    return load_recipe(args.recipe, [f"model.path={args.model}", *args.overrides, *extra])


def child_trainer(args) -> dict:
    import importlib

    importlib.import_module("transformers")  # the baseline includes torch and transformers

    from rlvr.models import resolve_model
    from rlvr.train.policy import PolicyWorker

    r = _recipe(args, "trainer")
    model_dir = resolve_model(r.model.path)
    if args.cuda:  # the trainer takes the GPU when one is visible (rlvr.train.policy); torch's allocator counts
        return _cuda_trainer(args, r, model_dir)
    base = status_kib("VmRSS")
    w = PolicyWorker(r, model_dir, 0, 1)
    w.setup(*w.rendezvous_address())  # DeepSpeed (trainer.backend=deepspeed) joins a one-rank group there
    loaded = status_kib("VmRSS") - base
    batch = _synthetic_batch(args, r)
    peaks = []
    for _ in range(args.steps):
        reset_peak()
        w.train_step(batch)
        peaks.append((status_kib("VmHWM") - base) * 1024)
    return {"measured": max(peaks), "steps": peaks, "after_load": loaded * 1024, "dtype": r.model.dtype}


def _synthetic_batch(args, r):
    """``r.samples_per_step`` sequences of ``--prompt`` + ``--response`` random token ids (the last one 3 shorter),
    packed as the trainer's batch."""
    import torch

    from rlvr.train.batch import pack
    from rlvr.types import Completion

    g = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(r.samples_per_step):
        n = args.response - (3 if i == r.samples_per_step - 1 else 0)
        ids = torch.randint(3, 40000, (args.prompt + n,), generator=g).tolist()
        seqs.append(Completion(prompt_index=i // r.rollout.samples_per_prompt, sample_index=i, prompt_ids=ids[: args.prompt],
                               token_ids=ids[args.prompt :], logprobs=[-1.0] * n, text="", finish_reason="length",
                               policy_version=0))  # fmt: skip
    return pack(seqs, torch.randn(len(seqs), generator=g), pad_id=2, max_new_tokens=args.response)


def _cuda_trainer(args, r, model_dir) -> dict:
    """``--cuda``: the trainer on the GPU; measured: the peak of ``torch.cuda.max_memory_allocated`` over each step
    (reset before it), less what was allocated before the model loaded; reserved (the caching allocator's pool) too."""
    import torch

    from rlvr.train.policy import PolicyWorker

    base = torch.cuda.memory_allocated()
    w = PolicyWorker(r, model_dir, 0, 1)
    w.setup(*w.rendezvous_address())
    loaded = torch.cuda.memory_allocated() - base
    batch = _synthetic_batch(args, r)
    peaks, reserved = [], []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        w.train_step(batch)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        reserved.append(torch.cuda.max_memory_reserved())
    return {"measured": max(peaks), "steps": peaks, "after_load": loaded, "dtype": r.model.dtype,
            "reserved": max(reserved), "device": torch.cuda.get_device_name()}


def child_engine(args) -> dict:
    import importlib

    importlib.import_module("torch")  # the baseline includes torch

    base = status_kib("VmRSS")
    from rlvr.models import resolve_model
    from rlvr.rollout.vllm_engine import VLLMEngine
    from rlvr.types import Prompt, SamplingConfig

    r = _recipe(args, "engine")
    e = VLLMEngine(resolve_model(r.model.path), dtype=r.model.dtype, max_model_len=r.max_sequence_tokens,
                   kv_cache_gib=r.rollout.kv_cache_gib, threads=r.rollout.threads)
    up = status_kib("VmRSS") - base
    prompts = [Prompt(index=i, text="", prompt_ids=list(range(100 + i, 100 + i + args.prompt)), gold="")
               for i in range(r.rollout.prompts_per_step)]  # fmt: skip
    out = e.generate(prompts, SamplingConfig(n=r.rollout.samples_per_prompt, max_new_tokens=args.response, seed=0))
    return {"measured": (status_kib("VmHWM") - base) * 1024, "after_start": up * 1024,
            "tokens": sum(len(c.token_ids) for c in out), "dtype": r.model.dtype,
            "anon_file": [status_kib("RssAnon") * 1024, status_kib("RssFile") * 1024]}


def modelled(args, role: str) -> int:
    from rlvr.models import resolve_model
    from rlvr.runtime.memory import ModelShape, engine_memory, load_config, trainer_memory

    r = _recipe(args, role)
    shape = ModelShape.from_config(load_config(resolve_model(r.model.path)))
    if role == "trainer":
        return trainer_memory(r, shape, device="gpu0" if args.cuda else "cpu", gpu=args.cuda,
                              seq_tokens=args.prompt + args.response,
                              response_tokens=args.response)  # fmt: skip
    return engine_memory(r, shape, device="cpu", gpu=False)


def run_child(args, model: str, role: str) -> dict:
    # the overrides first: after the options argparse read the first one as --child's value
    cmd = [sys.executable, __file__, *args.overrides, "--child", role, "--model", model, "--recipe", args.recipe,
           "--prompt", str(args.prompt), "--response", str(args.response), "--steps", str(args.steps),
           "--trainer-batch", str(args.trainer_batch), *(["--cuda"] if args.cuda else [])]
    tmp = Path(tempfile.gettempdir()) / "rlvr_memory_model"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", PYTHONPATH=os.pathsep.join(
        [str(ROOT), str(ROOT / ".wtpath"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        VLLM_CACHE_ROOT=str(tmp / "vllm"), TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"), VLLM_LOGGING_LEVEL="ERROR",
        # DeepSpeed's compiled shared-memory op, where rlvr's roles keep it (rlvr.runtime.roles.role_env)
        TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache/rlvr/torch_extensions")))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        raise RuntimeError(f"{role} on {model} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=["smollm2-135m-instruct", str(QWEN_SHAPED)])
    ap.add_argument("--recipe", default=str(ROOT / "recipes/smoke_cpu.yaml"))
    ap.add_argument("--prompt", type=int, default=48, help="prompt tokens of each synthetic sequence")
    ap.add_argument("--response", type=int, default=64, help="response tokens (the engine samples as many)")
    ap.add_argument("--steps", type=int, default=2, help="trainer steps measured (the largest peak is reported)")
    ap.add_argument("--trainer-batch", type=int, default=16, help="sequences of the trainer's synthetic batch")
    ap.add_argument("--roles", nargs="*", default=["trainer", "engine"])
    ap.add_argument("--cuda", action="store_true", help="the trainer on the GPU (measured by torch's allocator; "
                    "the trainer role only)")
    ap.add_argument("--tokenizer-from", type=Path, default=None,
                    help="the shaped models' tokenizer files from this folder (default: the embedded SmolLM2's)")
    ap.add_argument("--child", choices=["trainer", "engine"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="recipe overrides for both roles, e.g. trainer.gradient_checkpointing=true")
    args = ap.parse_args()
    if args.child:
        res = (child_trainer if args.child == "trainer" else child_engine)(args)
        print("RESULT " + json.dumps(res), flush=True)
        return
    if args.cuda and args.roles != ["trainer"]:
        ap.error("--cuda measures the trainer role only: add --roles trainer (the engine is vLLM's, not on this path)")
    for shaped in SHAPES:
        if str(shaped) in args.models:
            build_qwen_shaped(shaped, args.tokenizer_from)
    print(f"recipe {args.recipe} {' '.join(args.overrides)}; sequences of {args.prompt} + {args.response} tokens; "
          f"trainer batch {args.trainer_batch}")
    print(f"{'model':<28} {'role':<8} {'dtype':<9} {'model GiB':>9} {'measured GiB':>12} {'measured/model':>14}  detail")
    for model in args.models:
        for role in args.roles:
            args.model = model
            res = run_child(args, model, role)
            m = modelled(args, role)
            detail = (f"steps {[round(p / GIB, 2) for p in res['steps']]}, after load {res['after_load'] / GIB:.2f}"
                      + (f", reserved {res['reserved'] / GIB:.2f} ({res['device']})" if args.cuda else "")
                      if role == "trainer" else f"after start {res['after_start'] / GIB:.2f}, {res['tokens']} tokens, RSS anon/file at the end "
                      f"{res['anon_file'][0] / GIB:.2f}/{res['anon_file'][1] / GIB:.2f}")
            terms = (f"; model terms w/g/opt/act/logits/other {m.weights / GIB:.2f}/{m.grads / GIB:.2f}/"
                     f"{m.optimizer / GIB:.2f}/{m.activations / GIB:.2f}/{m.logits / GIB:.2f}/{m.other / GIB:.2f}")
            print(f"{Path(model).name:<28} {role:<8} {res['dtype']:<9} {m.total / GIB:>9.2f} "
                  f"{res['measured'] / GIB:>12.2f} {res['measured'] / m.total:>14.2f}  {detail}{terms}", flush=True)


if __name__ == "__main__":
    main()
