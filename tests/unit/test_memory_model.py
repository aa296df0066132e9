"""The memory model of ``--dry-run`` (rlvr/runtime/memory.py, issue 27): parameter counts against transformers'
own models, ZeRO partitioning, activations with and without gradient checkpointing, the logits term, placement
and the card a GPU recipe needs, each against numbers worked out by hand here."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.recipe import load_recipe
from rlvr.runtime.memory import (
    GIB, ModelShape, activation_bytes, engine_memory, format_plan, logits_bytes, memory_plan, trainer_memory, _place,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny_test.yaml"

SMOLLM2 = {  # the embedded smollm2-135m-instruct's config.json (rlvr/models/embedded.py builds it)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "mlp_bias": False,
    "head_dim": 64, "hidden_size": 576, "intermediate_size": 1536, "max_position_embeddings": 8192,
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True, "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}
QWEN2_05B = {  # Qwen2-0.5B / Qwen2.5-0.5B's shape
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "tie_word_embeddings": True,
    "vocab_size": 151936, "max_position_embeddings": 32768,
}
# by hand: embedding 151936 x 896 = 136134656; a layer: q 896 x 896 = 802816, k and v 2 x 896 x 128 = 229376,
# o 802816, q/k/v biases 896 + 2 x 128 = 1152, MLP 3 x 896 x 4864 = 13074432, two norms 1792: 14912384;
# 24 layers 357897216; final norm 896; tied head 0
QWEN2_05B_PARAMS = 136134656 + 24 * 14912384 + 896


def _numel(config: dict, meta: bool) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    cfg.pop("architectures")
    cfg = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    if meta:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)  # random init, ~0.5 GB for 135M
    return sum(p.numel() for p in model.parameters())


def test_param_count_of_the_embedded_model_equals_transformers():
    assert ModelShape.from_config(SMOLLM2).params() == _numel(SMOLLM2, meta=False) == 134515008


def test_param_count_of_a_qwen2_05b_shape_equals_transformers_and_the_count_by_hand():
    assert QWEN2_05B_PARAMS == 494032768
    assert ModelShape.from_config(QWEN2_05B).params() == QWEN2_05B_PARAMS == _numel(QWEN2_05B, meta=True)


def test_untied_head_and_llama_biases_count():
    cfg = {**SMOLLM2, "tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True, "num_hidden_layers": 2}
    assert ModelShape.from_config(cfg).params() == _numel(cfg, meta=True)


def test_mixture_of_experts_is_refused():
    with pytest.raises(ValueError, match="not modelled: mixture of experts"):
        ModelShape.from_config({**QWEN2_05B, "num_experts": 8})


SMALL = ModelShape(vocab=10, hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, tied=True)
# P by hand: embedding 80; a layer: q 64 + k 32 + v 32 + o 64 + MLP 384 + norms 16 = 592; 2 layers 1184; norm 8
SMALL_P = 80 + 2 * 592 + 8


def test_activations_by_hand_and_checkpointing_lowers_them():
    assert SMALL.params() == SMALL_P == 1272
    # bf16 autocast: 36 h + 8 I = 288 + 128 = 416 bytes per token per layer; T = 10 tokens, N = 4 response tokens:
    # 10 x (2 x 416 + 8 x 8) + 4 x 2 x 8 = 8960 + 64
    assert activation_bytes(SMALL, 10, 4, amp=True, checkpointing=False) == 9024
    # checkpointing: 4 h L = 64 kept per token, plus one layer (416) recomputed: 10 x (64 + 416 + 64) + 64
    assert activation_bytes(SMALL, 10, 4, amp=True, checkpointing=True) == 5504
    # fp32: 44 h + 16 I = 352 + 256 = 608; 10 x (1216 + 64) + 4 x 4 x 8
    assert activation_bytes(SMALL, 10, 4, amp=False, checkpointing=False) == 12928
    # a real size: checkpointing saves most of it
    q = ModelShape.from_config(QWEN2_05B)
    full, ckpt = (activation_bytes(q, 4 * 1408, 4 * 1024, True, c) for c in (False, True))
    assert ckpt < full / 5


def test_logits_by_hand():
    # logits and their gradient [4, 10] in bf16: 2 x 4 x 10 x 2 = 160; one chunk (all 4 rows) fp32 x 1.4: 224
    assert logits_bytes(SMALL, 4, 2) == 384
    # V = 151936: a chunk is 441 rows (256 MiB / (4 V)), whatever N
    assert logits_bytes(ModelShape.from_config(QWEN2_05B), 4096, 2) == 2 * 4096 * 151936 * 2 + int(1.4 * 441 * 151936 * 4)


def _recipe(*overrides: str):
    return load_recipe(TINY, ["model.dtype=bfloat16", *overrides])


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_partitioning_by_hand(stage):
    """4 ranks, P = 1272: torch-like at ZeRO-0; stage 1 shards AdamW (8 P / 4) and keeps an fp32 master partition
    (4 P / 4); stage 2 also the gradients (4 P / 4); stage 3 also the weights (4 P / 4)."""
    r = _recipe("trainer.backend=deepspeed", f"trainer.zero_stage={stage}", "trainer.num_workers=4",
                "rollout.prompts_per_step=8")
    m = trainer_memory(r, SMALL, device="cpu", gpu=False)
    P = SMALL_P
    expected = {0: (4 * P, 4 * P, 8 * P), 1: (4 * P, 4 * P, 2 * P + P), 2: (4 * P, P, 3 * P), 3: (P, P, 3 * P)}
    assert (m.weights, m.grads, m.optimizer) == expected[stage]
    bucket = 4 * P if stage else 0  # on a CPU the reduce bucket's written pages: the gradients, at most
    prefetch = 4 * (int(5e7) + SMALL.layer_params()) if stage == 3 else 0
    assert m.other == bucket + prefetch
    assert m.transient == (P if stage else 4 * P)


def test_torch_backend_and_reference_and_total():
    """One rank, torch AdamW, bf16 autocast, KL on: weights/grads 4 P, AdamW 8 P, reference 4 P (fp32 under
    autocast), activations include the 2 P bf16 weight copies; total = persistent + max(act + logits, 4 P)."""
    r = _recipe("trainer.backend=torch", "algorithm.kl_coef=0.01", "trainer.micro_batch_size=2")
    P = SMALL_P
    m = trainer_memory(r, SMALL, device="cpu", gpu=False, seq_tokens=5, response_tokens=2)
    assert (m.weights, m.grads, m.optimizer, m.reference, m.other) == (4 * P, 4 * P, 8 * P, 4 * P, 0)
    assert m.activations == activation_bytes(SMALL, 10, 4, True, False) + 2 * P
    assert m.logits == logits_bytes(SMALL, 4, 2)
    assert m.total == 20 * P + max(m.activations + m.logits, 4 * P)  # 8 micro-batches: the gradients stay alive
    # one micro-batch per optimizer step: the gradients are None while the forward runs (set_to_none)
    one = trainer_memory(_recipe("trainer.backend=torch", "trainer.micro_batch_size=16"), SMALL, device="cpu",
                         gpu=False, seq_tokens=5, response_tokens=2)
    assert one.total == 12 * P + max(one.activations + one.logits, 8 * P)


def test_a_token_budget_bounds_the_micro_batch():
    """trainer.max_tokens_per_micro_batch: T = the budget (whatever micro_batch_size), N in the responses'
    proportion; a sequence longer than the budget is its own micro-batch, so T = that sequence."""
    r = _recipe("trainer.backend=torch", "trainer.micro_batch_size=2", "trainer.max_tokens_per_micro_batch=40")
    m = trainer_memory(r, SMALL, device="cpu", gpu=False, seq_tokens=5, response_tokens=2)
    assert m.activations == activation_bytes(SMALL, 40, 16, True, False) + 2 * SMALL_P  # 40 x 2 / 5 = 16
    assert m.logits == logits_bytes(SMALL, 16, 2)
    assert any("at most 40 computed tokens" in n for n in m.notes)
    over = trainer_memory(r, SMALL, device="cpu", gpu=False, seq_tokens=100, response_tokens=60)
    assert over.activations == activation_bytes(SMALL, 100, 60, True, False) + 2 * SMALL_P
    assert any("a sequence of 100 is one of its own" in n for n in over.notes)


def test_placement_first_fit():
    assert _place([("trainer", 0.5), ("engine", 0.4)]) == ["gpu0", "gpu0"]
    assert _place([("trainer", 0.5), ("engine", 0.6)]) == ["gpu0", "gpu1"]
    assert _place([("trainer", 1), ("trainer", 1), ("engine", 0.5), ("engine", 0.5)]) == ["gpu0", "gpu1", "gpu2", "gpu2"]
    assert _place([("trainer", 0), ("engine", 0)]) == ["cpu", "cpu"]


def test_card_needed_for_a_shared_gpu():
    """Trainer (0.5) and engine (utilisation 0.4) on one GPU: the card is the larger of trainer / (1 - 0.4) and
    engine need / 0.4; the engine then takes 0.4 of that card."""
    r = _recipe("trainer.num_gpus=0.5", "rollout.num_gpus=0.4", "rollout.gpu_memory_utilization=0.4")
    cfg = {**QWEN2_05B}
    plan = memory_plan(r, cfg)
    shape = ModelShape.from_config(cfg)
    t = trainer_memory(r, shape, device="gpu0", gpu=True).total
    e = engine_memory(r, shape, device="gpu0", gpu=True).total
    assert plan.card_bytes == int(max(t / 0.6, e / 0.4))
    trainer, engine = plan.roles
    assert engine.total == int(0.4 * plan.card_bytes)
    assert plan.devices == {"gpu0": t + engine.total}
    assert format_plan(plan)[-1].startswith("memory needed: a GPU card of")


def test_cpu_engine_is_weights_kv_cache_head_copy_sampler_and_overhead():
    from rlvr.runtime.memory import ENGINE_CPU_OVERHEAD, SAMPLER_ROWS

    r = _recipe("rollout.kv_cache_gib=2")
    m = engine_memory(r, SMALL, device="cpu", gpu=False)
    # bf16 weights 2 P; the packed output layer V x h x 2 = 160 bytes; the sampler's fp32 rows x V
    assert (m.weights, m.other) == (2 * SMALL_P, 2 * GIB + 160 + int(SAMPLER_ROWS * 10 * 4) + ENGINE_CPU_OVERHEAD)


def test_gradient_checkpointing_lowers_the_trainer_total():
    q = ModelShape.from_config(QWEN2_05B)
    off, on = (trainer_memory(_recipe(f"trainer.gradient_checkpointing={g}"), q, device="cpu", gpu=False)
               for g in ("false", "true"))  # fmt: skip
    assert on.activations < off.activations and on.total < off.total
    assert on.weights == off.weights and on.logits == off.logits


def test_the_gpu_recipe_header_states_the_models_figures():
    """recipes/gsm8k_qwen2.5_0.5b_gpu.yaml's header gives the trainer's GiB and the card the model needs (Qwen2.5-0.5B
    has QWEN2_05B's shape): a change to the recipe or the model that moves them must move the header too."""
    path = ROOT / "recipes" / "gsm8k_qwen2.5_0.5b_gpu.yaml"
    header = path.read_text().split("\nrun:")[0]
    plan = memory_plan(load_recipe(path), QWEN2_05B)
    trainer = next(m for m in plan.roles if m.role == "trainer")
    assert f"trainer {trainer.total / GIB:.1f} = " in header
    assert f"a card of {plan.card_bytes / 1e9:.0f} GB ({plan.card_bytes / GIB:.1f} GiB)" in header
    small = memory_plan(load_recipe(path, ["trainer.backend=torch", "trainer.micro_batch_size=2"]), QWEN2_05B)
    assert small.card_bytes < 24e9  # 22.5 GB: within a 24 GB card
    assert f"trainer.backend=torch trainer.micro_batch_size=2 needs {small.card_bytes / 1e9:.1f} GB" in header


def test_lora_counts_equal_peft_and_the_trainer_by_hand():
    """LoRA rank 16 on the seven projections of SmolLM2-135M (h 576, q 576, h_kv 192, I 1536, 30 layers): adapters
    per layer 16 x ((576 + 576) + 2 (576 + 192) + (576 + 576) + 2 (576 + 1536) + (1536 + 576)) = 16 x 10176, so
    A = 30 x 162816 = 4884480 (PEFT's own count on the meta model, here too); frozen Linears per layer 2 x 576^2 +
    2 x 576 x 192 + 3 x 576 x 1536 = 3538944, F = 106168320. The trainer (torch, bf16 autocast, KL on): weights
    4 (P - F) + 2 F + 4 A, grads 4 A, AdamW 8 A, no reference (the adapters switched off), AdamW's transient 4 A,
    autocast copies 2 (P - F + A); a rank-0 recipe keeps the full counts."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr.runtime.memory import lora_params

    shape = ModelShape.from_config(SMOLLM2)
    A, F, missed = lora_params(shape, 16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    assert (A, F, missed) == (4884480, 106168320, "")
    cfg = dict(SMOLLM2)
    cfg.pop("architectures")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    frozen = sum(m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head")
    peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                                  "gate_proj", "up_proj", "down_proj"]))
    assert (sum(p.numel() for p in peft.parameters() if p.requires_grad), frozen) == (A, F)
    assert lora_params(shape, 16, ("all-linear",))[:2] == (A, F)
    assert lora_params(shape, 8, ("model.layers.0.self_attn.q_proj", "fc"))[::2] == (30 * 8 * 1152, "fc")
    P = shape.params()
    r = load_recipe(TINY, ["model.dtype=bfloat16", "trainer.backend=torch", "algorithm.kl_coef=0.01",
                           "trainer.lora.rank=16", "trainer.lora.alpha=32"])  # fmt: skip
    m = trainer_memory(r, shape, device="cpu", gpu=False, seq_tokens=5, response_tokens=2)
    assert (m.weights, m.grads, m.optimizer, m.reference, m.transient) == (4 * (P - F) + 2 * F + 4 * A, 4 * A, 8 * A, 0, 4 * A)
    assert m.activations == activation_bytes(shape, 5 * r.trainer.micro_batch_size, 2 * r.trainer.micro_batch_size,
                                             True, False) + 2 * (P - F + A)  # fmt: skip
    full = trainer_memory(load_recipe(TINY, ["model.dtype=bfloat16", "trainer.backend=torch", "algorithm.kl_coef=0.01"]),
                          shape, device="cpu", gpu=False, seq_tokens=5, response_tokens=2)  # fmt: skip
    assert (full.weights, full.reference) == (4 * P, 4 * P)


def test_the_distillation_teacher_is_an_engine_of_its_own_model():
    """A teacher (the Qwen2-0.5B shape, fp32, teacher.kv_cache_gib 2) beside a SmolLM2 student on CPU: a fourth
    role on the host, its weights 4 x 494032768 bytes and its KV cache 2 GiB; on GPU it takes its own
    gpu_memory_utilization (0.2) of the card. Without teacher_config the plan is the student's alone."""
    r = load_recipe(TINY, ["model.dtype=bfloat16", "algorithm.advantage=distill", "teacher.model=tiny-random",
                           "teacher.dtype=float32", "teacher.kv_cache_gib=2", "algorithm.kl_coef=0"])  # fmt: skip
    plan = memory_plan(r, SMOLLM2, teacher_config=QWEN2_05B)
    assert [m.role for m in plan.roles] == ["trainer", "engine", "teacher"]
    t = plan.roles[-1]
    assert t.weights == 4 * QWEN2_05B_PARAMS and t.device == "cpu"
    assert t.total == engine_memory(r, ModelShape.from_config(QWEN2_05B), device="cpu", gpu=False, teacher=True).total
    # the same as a rollout engine of that model at float32 with rollout.kv_cache_gib 2
    assert t.other == engine_memory(load_recipe(TINY, ["model.dtype=float32", "rollout.kv_cache_gib=2"]),
                                    ModelShape.from_config(QWEN2_05B), device="cpu", gpu=False).other
    assert plan.devices["cpu"] == sum(m.total for m in plan.roles)
    assert [m.role for m in memory_plan(r, SMOLLM2).roles] == ["trainer", "engine"]
    g = load_recipe(TINY, ["model.dtype=bfloat16", "algorithm.advantage=distill", "teacher.model=tiny-random",
                           "teacher.num_gpus=0.2", "trainer.num_gpus=0.4", "rollout.num_gpus=0.3",
                           "sync.backend=gloo"])  # fmt: skip
    gp = memory_plan(g, SMOLLM2, teacher_config=QWEN2_05B)
    assert [m.device for m in gp.roles] == ["gpu0"] * 3 and gp.roles[-1].share == 0.2


def test_engines_over_a_whole_card_are_a_value_error_and_every_recipe_that_loads_has_a_plan():
    """Issue 38 item 12: two engines on one GPU taking 0.5 each (1.0 of it) crashed the memory model with
    OverflowError (int(inf)); the recipe check now refuses them at load, and the model itself raises a ValueError
    that says why (``memory_lines`` turns it into a ``not checked`` line). Two engines at 0.45 alone on a GPU: the
    card is the larger of the trainer's need (alone on the other GPU) and one engine's need / 0.45. And every GPU layout of a sweep that passes the recipe checks gets a plan."""
    import dataclasses

    from rlvr.config import RecipeError

    ok = _recipe("trainer.num_gpus=1", "sync.backend=gloo", "rollout.num_engines=2", "rollout.num_gpus=0.5",
                 "rollout.gpu_memory_utilization=0.45")  # fmt: skip
    shape = ModelShape.from_config(QWEN2_05B)
    e = engine_memory(ok, shape, device="gpu1", gpu=True).total
    plan = memory_plan(ok, QWEN2_05B)
    assert [m.device for m in plan.roles] == ["gpu0", "gpu1", "gpu1"]
    t = trainer_memory(ok, shape, device="gpu0", gpu=True).total  # alone on gpu0: the card holds it whole
    assert plan.card_bytes == max(t, int(e / 0.45))
    over = dataclasses.replace(ok, rollout=dataclasses.replace(ok.rollout, gpu_memory_utilization=0.5))  # unchecked
    with pytest.raises(ValueError, match=r"the engines on gpu1 take gpu_memory_utilization summing to 1 >= 1"):
        memory_plan(over, QWEN2_05B)
    planned = 0
    for engines in (1, 2, 4):
        for ro_gpus in (0.25, 0.4, 0.5, 1):
            for util in (0.3, 0.5, 0.9):
                for tr in (["trainer.num_gpus=0.5"], ["trainer.num_gpus=1", "trainer.num_workers=2"]):
                    try:
                        r = _recipe(*tr, "sync.backend=gloo", f"rollout.num_engines={engines}",
                                    f"rollout.num_gpus={ro_gpus}", f"rollout.gpu_memory_utilization={util}")  # fmt: skip
                    except RecipeError:
                        continue
                    assert memory_plan(r, QWEN2_05B).card_bytes > 0
                    planned += 1
    # by hand: k = the engines that fit on one GPU (min(engines, floor(1 / num_gpus)); none share at 1) refused
    # where k x util >= 1: 2 engines at 0.25/0.4/0.5 with util 0.5 or 0.9 (6); 4 engines at 0.25 with any util
    # (3: 4 x 0.3 = 1.2), at 0.4/0.5 with 0.5 or 0.9 (4); 13 per trainer layout, 26 of 72: 46 planned
    assert planned == 46
