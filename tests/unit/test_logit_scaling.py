"""The trainer's lean forward (body + output head on response positions) against transformers' own logits.

Every architecture on ``rlvr.models.heads.LEAN_HEADS`` is built from a tiny random config whose logit transform
is set large enough to matter (Granite ``logits_scaling`` 8, Cohere ``logit_scale`` 0.125, Gemma soft-cap 0.5),
and ``lean_output_head(model)(model.model(x).last_hidden_state)`` must equal ``model(x).logits``. The bare
``lm_head`` (what the lean forward computed before) is off by several nats on the scaled ones; the check below
asserts that too, so a case whose transform is a no-op cannot pass silently.
"""

from __future__ import annotations

import types

import pytest
import torch

from rlvr.models.heads import LEAN_HEADS, lean_output_head

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
            eos_token_id=2)  # fmt: skip

# class name -> (model_type, config overrides, transform applied after lm_head: True when it changes logits)
CASES = {
    "LlamaForCausalLM": ("llama", {}, False),
    "MistralForCausalLM": ("mistral", {}, False),
    "Qwen2ForCausalLM": ("qwen2", {}, False),
    "Qwen3ForCausalLM": ("qwen3", {}, False),
    "Qwen3MoeForCausalLM": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32), False),
    "GemmaForCausalLM": ("gemma", {}, False),
    "Phi3ForCausalLM": ("phi3", {}, False),
    "Olmo2ForCausalLM": ("olmo2", {}, False),
    "SmolLM3ForCausalLM": ("smollm3", {}, False),
    "Gemma2ForCausalLM": ("gemma2", dict(final_logit_softcapping=0.5), True),
    "Gemma3ForCausalLM": ("gemma3_text", dict(final_logit_softcapping=0.5), True),
    "GraniteForCausalLM": ("granite", dict(logits_scaling=8.0), True),
    "GraniteMoeForCausalLM": ("granitemoe", dict(logits_scaling=8.0, num_local_experts=4, num_experts_per_tok=2), True),
    "CohereForCausalLM": ("cohere", dict(logit_scale=0.125), True),
    "Cohere2ForCausalLM": ("cohere2", dict(logit_scale=0.125), True),
}


def _tiny(model_type: str, overrides: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**BASE, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.5)  # large weights: logits of several nats, so a missing scale shows
    return model


def _inputs():
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    am[1, 6:] = 0  # right padding, as TrainBatch packs
    return ids, am


def test_every_allow_listed_architecture_has_a_case():
    assert set(LEAN_HEADS) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_lean_head_equals_transformers_logits(name):
    model_type, overrides, transformed = CASES[name]
    model = _tiny(model_type, overrides)
    assert type(model).__name__ == name
    ids, am = _inputs()
    real = am.bool()
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=am).logits  # [2, 9, 64]
        hidden = model.model(input_ids=ids, attention_mask=am).last_hidden_state  # [2, 9, 32]
        lean = lean_output_head(model)(hidden[real])  # [N, 64]
        bare = model.get_output_embeddings()(hidden[real])
    assert float((lean - full[real]).abs().max()) < 1e-5
    gap = float((bare - full[real]).abs().max())
    assert gap > 1.0 if transformed else gap < 1e-5  # the transform is real (or truly absent)


@pytest.mark.parametrize("model_type, overrides", [
    ("hyperclovax", dict(logits_scaling=0.25)),  # multiplies by logits_scaling: Granite's name, the inverse use
    ("minicpm3", dict(num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8,
                      qk_rope_head_dim=8, v_head_dim=16, dim_model_base=8)),  # hidden / (32 / 8) before the head
])  # fmt: skip
def test_other_architectures_take_the_full_forward(model_type, overrides):
    model = _tiny(model_type, overrides)
    assert lean_output_head(model) is None
    ids, am = _inputs()
    with torch.no_grad():  # the bare head would be wrong for them: body + lm_head is not their forward
        bare = model.get_output_embeddings()(model.model(input_ids=ids, attention_mask=am).last_hidden_state)
        full = model(input_ids=ids, attention_mask=am).logits
    assert float((bare - full)[am.bool()].abs().max()) > 1.0


def test_same_class_name_outside_transformers_is_not_trusted():
    model = _tiny("llama", {})
    remote = type("LlamaForCausalLM", (type(model),), {"__module__": "transformers_modules.someone.modeling"})
    model.__class__ = remote
    assert lean_output_head(model) is None


@pytest.mark.parametrize("model_type, overrides", [
    ("granite", dict(logits_scaling=8.0)),  # lean, scaled
    ("cohere", dict(logit_scale=0.125)),  # lean, scaled
    ("hyperclovax", dict(logits_scaling=0.25)),  # full forward
])  # fmt: skip
def test_policy_forward_logprobs_equal_transformers(model_type, overrides):
    """PolicyWorker._forward's response logprobs at temperature 0.7 equal log_softmax(model(x).logits / 0.7)."""
    from rlvr.train.batch import TrainBatch
    from rlvr.train.policy import PolicyWorker

    model = _tiny(model_type, overrides)
    ids, am = _inputs()
    loss_mask = torch.zeros(2, 8)
    loss_mask[0, 3:8] = 1.0  # response targets ids[0, 4:9]
    loss_mask[1, 2:5] = 1.0  # response targets ids[1, 3:6] (then padding)
    mb = TrainBatch(input_ids=ids, attention_mask=am, loss_mask=loss_mask, rollout_logprobs=torch.zeros(2, 8),
                    advantages=torch.zeros(2), max_new_tokens=8)  # fmt: skip
    worker = types.SimpleNamespace(device=torch.device("cpu"), temperature=0.7, ds=False, packing=False,
                                   _autocast=lambda: torch.autocast("cpu", enabled=False))
    with torch.no_grad():
        lp, _ = PolicyWorker._forward(worker, model, mb, need_entropy=False)
        want = torch.log_softmax(model(input_ids=ids, attention_mask=am).logits[:, :-1].double() / 0.7, dim=-1)
    want = want.gather(-1, ids[:, 1:, None]).squeeze(-1).float() * loss_mask
    assert float((lp - want).abs().max()) < 1e-4
    assert float(want[loss_mask.bool()].abs().min()) > 0.0  # real logprobs compared, not zeros
