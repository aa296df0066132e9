"""The trainer's lean output head: which architectures may skip transformers' own ``ForCausalLM.forward``.

The policy worker (:meth:`rlvr.train.policy.PolicyWorker._forward`) runs the decoder body (``model.model``) on
the whole sequence and the output layer on the response positions only, to skip the prompt positions' [S, V]
logits. That is only right when the architecture's forward computes ``logits = post(lm_head(body(x)))`` with a
``post`` rlvr knows. transformers 5.19 has architectures that do more, for example (found by reading every
``*ForCausalLM.forward``):

- Granite, GraniteMoe(Shared/Hybrid/SWA): ``logits / config.logits_scaling``;
- Cohere, Cohere2, Cohere2Moe, CohereCompass: ``logits * config.logit_scale``;
- Gemma2/3/3n/4, VaultGemma, NanoChat: ``tanh(logits / c) * c``, ``c = config.final_logit_softcapping``;
  RecurrentGemma and xLSTM soft-cap with other config names;
- HyperCLOVAX: ``logits * config.logits_scaling`` (the same name as Granite's, the inverse use);
- FalconH1: ``logits * model.lm_head_multiplier``; MiniCPM3 scales the *hidden states* by
  ``1 / config.logits_scaling`` before the head; Inkling drops padded vocabulary columns; ModernBertDecoder
  applies a decoder after the head.

So the lean path is an allow-list, :data:`LEAN_HEADS`: class name -> the ``post`` transform of its forward; each
entry is checked against ``model(...).logits`` on a tiny random config (tests/unit/test_logit_scaling.py, which
also fails when an entry has no such case). Any other architecture, or a class of that name from outside
transformers (``trust_remote_code``), takes the plain full forward, which is right for every model (slower).
The rollout engine (vLLM 0.32) applies the same transforms in its own model code (``LogitsProcessor`` ``scale=``
for Granite/Cohere/HyperCLOVAX, ``soft_cap=`` for Gemma2).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Post = Callable[[Tensor], Tensor]
"""logits [N, V] -> logits [N, V] (the transform the architecture applies after ``lm_head``)."""


def _plain(model: torch.nn.Module) -> Post | None:
    return None


def _softcap(model: torch.nn.Module) -> Post | None:
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is None:
        return None
    return lambda z: torch.tanh(z / cap) * cap


def _divide_by_logits_scaling(model: torch.nn.Module) -> Post | None:
    s = float(model.config.logits_scaling)
    return lambda z: z / s


def _times_logit_scale(model: torch.nn.Module) -> Post | None:
    s = float(model.config.logit_scale)
    return lambda z: z * s


LEAN_HEADS: dict[str, Callable[[torch.nn.Module], Post | None]] = {
    "LlamaForCausalLM": _plain,
    "MistralForCausalLM": _plain,
    "Qwen2ForCausalLM": _plain,
    "Qwen3ForCausalLM": _plain,
    "Qwen3MoeForCausalLM": _plain,
    "GemmaForCausalLM": _plain,
    "Phi3ForCausalLM": _plain,
    "Olmo2ForCausalLM": _plain,
    "SmolLM3ForCausalLM": _plain,
    "Gemma2ForCausalLM": _softcap,
    "Gemma3ForCausalLM": _softcap,
    "GraniteForCausalLM": _divide_by_logits_scaling,
    "GraniteMoeForCausalLM": _divide_by_logits_scaling,
    "CohereForCausalLM": _times_logit_scale,
    "Cohere2ForCausalLM": _times_logit_scale,
}
"""Architectures (transformers class names) whose forward's logits are ``post(lm_head(model.model(x)))``, with the
builder of ``post`` (``None``: no transform). Verified per entry against transformers' own logits."""


def lean_output_head(model: torch.nn.Module) -> Callable[[Tensor], Tensor] | None:
    """``hidden [N, H] -> logits [N, V]`` equal to what ``model``'s own forward returns at those positions, or
    ``None`` when ``model`` is not on :data:`LEAN_HEADS` (then the caller must run the full forward).

    ``model``: a transformers ``*ForCausalLM`` (a DeepSpeed engine's ``.module``). ``None`` also when the class
    comes from outside ``transformers.models`` (remote code) or lacks the ``model`` body or an output layer.
    """
    cls = type(model)
    build = LEAN_HEADS.get(cls.__name__)
    if build is None or not cls.__module__.startswith("transformers.models."):
        return None
    head = model.get_output_embeddings()
    if head is None or getattr(model, "model", None) is None:
        return None
    post = build(model)
    if post is None:
        return head
    return lambda h: post(head(h))
