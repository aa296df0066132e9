"""LoRA on the policy (``trainer.lora``): the adapters wrapped with PEFT, the checks against the model, the merged
weights a sync sends and the adapter state a checkpoint keeps.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv 2106.09685, eq. 3): a targeted
Linear with weight ``W [out, in]`` computes ``h = W x + (alpha / r) B A x`` with ``A [r, in]`` (random init) and
``B [out, r]`` (zeros), so the starting policy is the base model; only A and B train. "LoRA without regret"
(Thinking Machines Lab, 2025) measured rank-1 to 32 adapters on every layer (attention and MLP) learning like
full fine-tuning in policy-gradient RL, at about 10x the learning rate.

Names: PEFT wraps the model as ``PeftModel -> LoraModel -> <the transformers model>`` and a targeted Linear as
``<name>.base_layer`` (W) beside ``<name>.lora_A.default`` and ``<name>.lora_B.default``. The transformers model
inside (:func:`inner`) keeps the checkpoint's names except for ``.base_layer``; :func:`merged_named_weights`
yields exactly the checkpoint's names (``model.layers.0.self_attn.q_proj.weight``), so an engine loads them as it
loads a full-weight sync.

PEFT (``pip install 'rlvr[lora]'``) is imported where it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import torch

from rlvr.config import RecipeError

if TYPE_CHECKING:
    from rlvr.config import TrainerLoraConfig

ALL_LINEAR = "all-linear"
ADAPTER = "default"
"""PEFT's name of the one adapter rlvr trains."""


def matches(module_name: str, target: str) -> bool:
    """PEFT's rule for a list of target names: ``target`` is the module's full name or its last dotted parts
    (``q_proj`` and ``self_attn.q_proj`` match ``model.layers.0.self_attn.q_proj``; ``proj`` does not)."""
    return module_name == target or module_name.endswith("." + target)


def targeted_linears(model: torch.nn.Module, targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """{module name: (out features, in features)} of the Linear layers of ``model`` (a transformers
    ``*ForCausalLM``, on any device, ``meta`` included) that ``targets`` select: by :func:`matches`, or with
    ``("all-linear",)`` every Linear but the output layer (as PEFT's ``all-linear``)."""
    out_layer = model.get_output_embeddings()
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    if tuple(targets) == (ALL_LINEAR,):
        chosen = [n for n, m in linears.items() if m is not out_layer]
    else:
        chosen = [n for n in linears if any(matches(n, t) for t in targets)]
    return {n: (linears[n].out_features, linears[n].in_features) for n in chosen}


def lora_target_errors(cfg: TrainerLoraConfig, model: torch.nn.Module, model_name: str) -> list[str]:
    """What ``trainer.lora`` asks of ``model`` (``model_name``: ``model.path``, for the message) that it cannot
    give: a target name that matches no module, or matches one that is not a Linear (rlvr merges Linear adapters
    only), and a rank larger than a targeted module's smallest dimension (r <= min(out, in), or the low-rank
    update is no low rank at all). Each message names the key and the fix. [] when rank is 0."""
    if cfg.rank <= 0:
        return []
    errs = []
    names = {n: type(m).__name__ for n, m in model.named_modules() if n}
    linear_tails = sorted({n.rsplit(".", 1)[-1] for n, k in names.items() if k == "Linear"})
    if tuple(cfg.target_modules) != (ALL_LINEAR,):
        for t in cfg.target_modules:
            hits = [n for n in names if matches(n, t)]
            if not hits:
                errs.append(f"trainer.lora.target_modules has {t!r}, which matches no module of model {model_name}: "
                            f"its Linear layers are named {linear_tails} (or use [all-linear])")
            elif any(names[n] != "Linear" for n in hits):
                other = next(n for n in hits if names[n] != "Linear")
                errs.append(f"trainer.lora.target_modules has {t!r}, which matches {other} ({names[other]}), not a "
                            f"Linear: rlvr trains adapters on Linear layers only; choose from {linear_tails}")
    shapes = targeted_linears(model, cfg.target_modules)
    if not errs and not shapes:
        errs.append(f"trainer.lora.target_modules={list(cfg.target_modules)} selects no Linear of model "
                    f"{model_name}: choose from {linear_tails}")
    out_layer = model.get_output_embeddings()
    out_name = next((n for n, m in model.named_modules() if m is out_layer), None)
    if out_name in shapes and getattr(model.config, "tie_word_embeddings", False):
        errs.append(f"trainer.lora.target_modules selects {out_name}, the output layer of model {model_name}, whose "
                    "weight is tied to the input embeddings (one tensor): leave it out")
    if shapes:
        name, (o, i) = min(shapes.items(), key=lambda kv: min(kv[1]))
        if cfg.rank > min(o, i):
            errs.append(f"trainer.lora.rank={cfg.rank} is larger than the smallest dimension of targeted module "
                        f"{name} ([{o}, {i}]) of model {model_name}: set trainer.lora.rank <= {min(o, i)} (or leave "
                        "that module out of trainer.lora.target_modules)")
    return errs


def meta_model(model_dir: str) -> torch.nn.Module:
    """The model of ``model_dir``'s config built on the ``meta`` device: its modules and shapes, no weights
    (milliseconds, no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))


def check_lora(cfg: TrainerLoraConfig, model_dir: str, model_name: str) -> str:
    """The load-time check of ``trainer.lora`` against the model (:func:`lora_target_errors` on the
    :func:`meta_model`). Returns the line saying what was checked.

    Errors: :class:`~rlvr.config.RecipeError` listing every problem; ``ImportError`` naming the install when peft
    is missing."""
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ImportError(f"trainer.lora.rank={cfg.rank} needs peft, which is not installed: pip install 'rlvr[lora]' "
                          "(or peft), or set trainer.lora.rank=0")
    model = meta_model(model_dir)
    errs = lora_target_errors(cfg, model, model_name)
    if errs:
        raise RecipeError("invalid recipe:\n  - " + "\n  - ".join(errs))
    shapes = targeted_linears(model, cfg.target_modules)
    return (f"checked: trainer.lora rank {cfg.rank} on {len(shapes)} Linear modules of model {model_name} "
            f"(smallest dimension {min(min(s) for s in shapes.values())})")


def wrap(model: torch.nn.Module, cfg: TrainerLoraConfig, model_name: str = "the model", seed: int = 0) -> torch.nn.Module:
    """``model`` (a transformers ``*ForCausalLM``) with LoRA adapters of ``cfg`` injected by PEFT
    (``get_peft_model``): a ``PeftModel`` whose only trainable parameters are the adapters' A [r, in] and
    B [out, r] (fp32, as the model's). A's random init is drawn from ``seed`` alone (the caller's RNG is left as it
    was), so every data-parallel rank starts from the same adapters whatever its own seed. The check of
    :func:`lora_target_errors` runs first.

    Errors: :class:`~rlvr.config.RecipeError` from that check."""
    from peft import LoraConfig, get_peft_model

    errs = lora_target_errors(cfg, model, model_name)
    if errs:
        raise RecipeError("invalid recipe:\n  - " + "\n  - ".join(errs))
    targets = ALL_LINEAR if tuple(cfg.target_modules) == (ALL_LINEAR,) else list(cfg.target_modules)
    peft_cfg = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                          bias="none", task_type="CAUSAL_LM")  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, peft_cfg)


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a PEFT-wrapped model."""
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


def inner(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a PEFT-wrapped ``model`` (adapters injected in its Linear layers; its forward
    runs them, and respects ``disable_adapter()``), or ``model`` itself."""
    return model.get_base_model() if is_lora(model) else model


def base_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter, torch.nn.Module | None]]:
    """(checkpoint name, parameter, its LoRA layer or None) for every parameter of the base model inside the
    PEFT-wrapped ``model``, in the model's order; the adapters' own parameters are left out. A targeted Linear's
    weight comes with its layer (whose adapter :func:`merged_weight` folds in); its bias, and every other
    parameter, with None."""
    from peft.tuners.lora import LoraLayer

    base = inner(model)
    layers = {n: m for n, m in base.named_modules() if isinstance(m, LoraLayer)}
    for name, p in base.named_parameters():
        if ".lora_" in name:
            continue
        if ".base_layer." in name:
            owner, leaf = name.split(".base_layer.", 1)
            yield f"{owner}.{leaf}", p, (layers[owner] if leaf == "weight" else None)
        else:
            yield name, p, None


@torch.no_grad()
def merged_weight(layer: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """``W + (alpha / r) B A`` ([out, in], fp32, a new tensor: ``weight`` and the adapter are not changed) for the
    LoRA layer ``layer`` of base weight ``weight`` = W [out, in], with A [r, in], B [out, r] and scale alpha / r
    (PEFT's ``scaling``) of its adapter. Errors: ``ValueError`` for a layer storing W transposed
    (``fan_in_fan_out``, GPT-2's Conv1D)."""
    if getattr(layer, "fan_in_fan_out", False):
        raise ValueError("LoRA on a fan_in_fan_out layer (W stored [in, out]) is not supported")
    a = layer.lora_A[ADAPTER].weight.float()  # [r, in]
    b = layer.lora_B[ADAPTER].weight.float()  # [out, r]
    return weight.float() + layer.scaling[ADAPTER] * (b @ a)


def merged_named_weights(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor in ``dtype``) for every base parameter of the PEFT-wrapped ``model`` with each
    adapter folded into its weight (:func:`merged_weight`): the full model the policy computes (dropout off), under
    the names of the model's own checkpoint, what a full-weight sync and ``save_pretrained`` send. The training
    weights are not touched. Memory: one merged [out, in] tensor at a time beside the model."""
    for name, p, layer in base_parameters(model):
        t = merged_weight(layer, p.detach()) if layer is not None else p.detach()
        yield name, t.to(dtype)


def base_shapes(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """(checkpoint name, shape) of what :func:`merged_named_weights` yields, in order, without computing it."""
    return [(name, tuple(p.shape)) for name, p, _ in base_parameters(model)]


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{PEFT name: tensor} of the trainable (adapter) parameters of ``model``: what a checkpoint keeps of the
    weights (the base weights are the model folder's)."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`adapter_state`'s ``state`` into ``model``. Errors: ``KeyError`` when ``state`` lacks an adapter
    parameter of ``model`` or holds a name ``model`` does not have (a checkpoint of another LoRA setting)."""
    want = set(adapter_state(model))
    if set(state) != want:
        raise KeyError(f"checkpoint adapters do not match trainer.lora: missing {sorted(want - set(state))[:3]}, "
                       f"unexpected {sorted(set(state) - want)[:3]}")
    model.load_state_dict(state, strict=False)


# -- the adapter sync (``trainer.lora.sync: adapter``) ------------------------------------------------------------
VLLM_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32 accepts for ``max_lora_rank`` (``vllm.config.lora.MaxLoRARanks``)."""


def vllm_max_rank(rank: int) -> int:
    """vLLM's ``max_lora_rank`` for adapters of rank ``rank``: the smallest value it accepts that is >= ``rank``
    (its LoRA buffers are sized by it). Errors: ``ValueError`` above 512, vLLM's largest."""
    for m in VLLM_MAX_RANKS:
        if m >= rank:
            return m
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({VLLM_MAX_RANKS[-1]})")


def adapter_named_weights(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor in ``dtype``) of every adapter tensor of the PEFT-wrapped ``model``, under the names PEFT's
    ``save_pretrained`` writes in ``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight``
    [r, in] and ``....lora_B.weight`` [out, r]: the adapter's own name dropped, ``get_peft_model_state_dict``),
    in the model's order: what an adapter sync sends and the engine writes back as that file."""
    for name, t in _peft_adapter_state(model).items():
        yield name, t.detach().to(dtype)


def _peft_adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """PEFT's ``get_peft_model_state_dict`` of the adapter: {saved name: the parameter itself} (no copy)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model, adapter_name=ADAPTER)


def adapter_shapes(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of what :func:`adapter_named_weights` yields, in order (no tensor converted)."""
    return [(n, tuple(t.shape)) for n, t in _peft_adapter_state(model).items()]


def adapter_config_json(model: torch.nn.Module) -> str:
    """The ``adapter_config.json`` text PEFT writes for the adapter of ``model`` (its ``LoraConfig``: r,
    lora_alpha, target_modules, ...): with :func:`adapter_named_weights`' tensors, a PEFT folder that vLLM loads as
    a ``LoRARequest``."""
    import copy
    import tempfile
    from pathlib import Path

    cfg = copy.deepcopy(model.peft_config[ADAPTER])
    cfg.inference_mode = True  # as PeftModel.save_pretrained writes it
    with tempfile.TemporaryDirectory() as tmp:
        cfg.save_pretrained(tmp)
        return (Path(tmp) / "adapter_config.json").read_text()


def frozen_linears_to(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Store the frozen Linear layers of the PEFT-wrapped ``model`` (each targeted module's ``base_layer`` and every
    Linear without an adapter; weight and bias) in ``dtype``, the autocast dtype, leaving the adapters, the
    embeddings, the norms and the output layer (tied to the embeddings in many models) in fp32. Under autocast a
    Linear computes in ``dtype`` whatever its weight's dtype (autocast casts an fp32 weight at every forward), so
    the forward, the backward into the adapters and the reference are unchanged, bit for bit; memory: 2 bytes a
    frozen Linear parameter instead of 4 in bf16 (SmolLM2-135M: 106.2M of its 134.5M parameters, 212 MB). Returns
    the number of parameters cast."""
    out_layer = inner(model).get_output_embeddings()
    n = 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and mod is not out_layer and not any(p.requires_grad for p in mod.parameters()):
            n += sum(p.numel() for p in mod.parameters() if p.dtype != dtype)
            mod.to(dtype)
    return n
