"""Check what each engine worker *loaded*: a sample of every sent tensor read back from the engine's own parameters
after the reload, compared exactly with the same sample of the trainer's tensors as sent.

Why: the transfer checksum (:mod:`rlvr.sync.weights`) covers the wire only, and the probe (:mod:`rlvr.sync.probe`)
compares logprobs, which in bf16 differ by up to ~0.05 nats after a *good* sync (kernels, rounding), as much as a
sync that loaded nothing after an lr-1e-5 step: in bf16 the probe cannot see a skipped or partial reload. The
read-back is exact in any dtype: the engine holds the sent values bit for bit (the sender rounds to the recipe
dtype, the engine loads in that dtype), so a single differing element is a fault.

The sample (:func:`rlvr.sync.weights.sample_columns`): every row of each tensor, at
:data:`rlvr.sync.weights.SAMPLE_COLUMNS` (16) columns (all columns of a narrower tensor; 1-D tensors are read whole),
fixed per tensor. A reload that skips a tensor or the whole model shows at the first sync that changes the tensor's
rounded values: a step of N(0, 1e-5^2) per weight (an lr-1e-5 update's size) changed 19.3% (``tiny-random``) and
19.6% (a SmolLM2-135M-shaped random model) of the sampled bf16 elements, all of them in fp32
(``tests/integration/test_sync_readback.py``). Errors confined to unsampled columns are the probe's to catch.
Cost on that SmolLM2-shaped model, CPU, one engine: 0.08-0.23 s in the engine (8.2 MB of samples in bf16) and
0.04-0.07 s to compare, against 0.8-0.9 s of transfer and reload (``sync/seconds``) per sync.

Engine side (:func:`vllm_blocks`, in each vLLM worker): vLLM stacks checkpoint tensors (``q_proj``/``k_proj``/
``v_proj`` -> ``qkv_proj``, ``gate_proj``/``up_proj`` -> ``gate_up_proj``), shards them by tensor-parallel rank,
pads the vocabulary, and on CPU repacks linear weights into kernel formats and drops ``layer.weight`` (vLLM 0.32,
``dispatch_cpu_unquantized_gemm``). So linear and output-head columns are read through the layer's own GEMM
(``quant_method.apply``) on one-hot inputs: e_k W^T is column k of the weight the kernel uses, exact in any dtype
(one product by 1, the rest by 0). Each worker reports *blocks*: rectangles of checkpoint coordinates it holds (its
shard, by the layer's ``tp_rank``/sizes) with the sampled values there. The controller (:func:`check_loaded`)
compares every block with the trainer's sample and checks that each engine's blocks cover every sent tensor, so each
tensor-parallel worker is checked on the shard it loaded.

Trainer side: :func:`rlvr.sync.weights.trainer_sample` of each tensor as sent (``WeightSender.send`` returns them
as ``samples``).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from rlvr.sync.weights import DTYPES, WeightSpec, WeightSyncError, n_cols, sample_columns, trainer_sample

Block = tuple  # (name, r0, r1, c0, c1, dtype, data): checkpoint rows [r0, r1) x columns [c0, c1) of ``name``;
# ``data``: the sampled values there (rows x the sampled columns within [c0, c1)), C order, ``dtype`` (a DTYPES
# name), as bytes (bytes cross every RPC layer: vLLM's worker queues, Ray).


def _block(name: str, r0: int, c0: int, c1: int, values: torch.Tensor, dtype: torch.dtype) -> Block:
    v = values.detach().to("cpu", dtype).contiguous()
    return (name, r0, r0 + v.shape[0], c0, c1, str(dtype).removeprefix("torch."), v.view(torch.uint8).numpy().tobytes())


def _whole_block(name: str, p: torch.Tensor, dtype: torch.dtype) -> Block:
    """The block of a parameter held whole (not sharded, not stacked): its sample exactly as the trainer takes it
    (:func:`rlvr.sync.weights.trainer_sample`), over all its rows and columns."""
    return _block(name, 0, 0, n_cols(p.shape), trainer_sample(name, p), dtype)


def _local_cols(name: str, full_cols: int, c0: int, c1: int) -> list[int]:
    """Sampled columns of ``name`` inside the shard [c0, c1), as local indices (minus c0)."""
    return [c - c0 for c in sample_columns(name, full_cols) if c0 <= c < c1]


# -- engine side: vLLM ------------------------------------------------------------------------------------------------
def _gemm_columns(layer: torch.nn.Module, local_cols: list[int], k_local: int, like: torch.Tensor) -> torch.Tensor:
    """Columns ``local_cols`` of the weight ``layer``'s kernel computes with: [N_local, len(local_cols)], via its
    ``quant_method.apply`` on one-hot rows (no bias)."""
    if not local_cols:  # a shard with no sampled column: nothing to read, the block still claims its rectangle
        return torch.empty(sum(layer.output_partition_sizes), 0, dtype=like.dtype)
    x = torch.zeros(len(local_cols), k_local, dtype=like.dtype, device=like.device)
    x[torch.arange(len(local_cols)), torch.tensor(local_cols, dtype=torch.long)] = 1
    with torch.no_grad():
        y = layer.quant_method.apply(layer, x, None)
    return y.t()


def _linear_segments(layer, mod_name: str, packed: dict) -> tuple[list[tuple[str, int, int, int]], int]:
    """(checkpoint module name, local row offset, rows, checkpoint row offset) of each stacked part of a vLLM
    linear layer on this worker, and the checkpoint column offset of its input shard."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, ReplicatedLinear, RowParallelLinear,
    )

    prefix, _, short = mod_name.rpartition(".")
    parts = [f"{prefix}.{p}" if prefix else p for p in packed.get(short, [])]
    rank, tp = layer.tp_rank, layer.tp_size
    if isinstance(layer, QKVParallelLinear):
        if len(parts) != 3:
            raise NotImplementedError(f"{mod_name}: QKV layer without a q/k/v packing in packed_modules_mapping")
        hq = layer.num_heads * layer.head_size
        hk, hv = layer.num_kv_heads * layer.head_size, layer.num_kv_heads * layer.v_head_size
        kv = rank // layer.num_kv_head_replicas  # the kv heads' shard (replicated when tp > kv heads)
        return [(parts[0], 0, hq, rank * hq), (parts[1], hq, hk, kv * hk), (parts[2], hq + hk, hv, kv * hv)], 0
    if isinstance(layer, MergedColumnParallelLinear):
        if len(parts) != len(layer.output_sizes):
            raise NotImplementedError(f"{mod_name}: merged layer of {len(layer.output_sizes)} parts, packing {parts}")
        segs, off = [], 0
        for p, size in zip(parts, layer.output_sizes):
            segs.append((p, off, size // tp, rank * (size // tp)))
            off += size // tp
        return segs, 0
    if isinstance(layer, ColumnParallelLinear):
        n = layer.output_size_per_partition
        return [(mod_name, 0, n, rank * n)], 0
    if isinstance(layer, RowParallelLinear):
        return [(mod_name, 0, layer.output_size, 0)], rank * layer.input_size_per_partition
    if isinstance(layer, ReplicatedLinear):
        return [(mod_name, 0, layer.output_size, 0)], 0
    raise NotImplementedError(f"{mod_name}: {type(layer).__name__} is not a linear layer rlvr can read back")


def _linear_blocks(layer, mod_name: str, packed: dict, dtype: torch.dtype) -> list[Block]:
    from vllm.model_executor.layers.linear import ColumnParallelLinear, UnquantizedLinearMethod

    if not isinstance(layer.quant_method, UnquantizedLinearMethod):
        raise NotImplementedError(
            f"{mod_name}: quantized ({type(layer.quant_method).__name__}); rlvr syncs unquantized models")
    segs, col0 = _linear_segments(layer, mod_name, packed)
    k_full = layer.input_size
    k_local = getattr(layer, "input_size_per_partition", k_full)  # ReplicatedLinear has none: the whole input
    names = [f"{p}.weight" for p, *_ in segs]
    wanted = sorted({c for n in names for c in _local_cols(n, k_full, col0, col0 + k_local)})
    w = _gemm_columns(layer, wanted, k_local, layer.weight)  # [N_local, len(wanted)]
    pos = {c: i for i, c in enumerate(wanted)}
    out = []
    for (p, lr0, rows, r0), n in zip(segs, names):
        idx = [pos[c] for c in _local_cols(n, k_full, col0, col0 + k_local)]
        out.append(_block(n, r0, col0, col0 + k_local, w[lr0 : lr0 + rows][:, idx], dtype))
        if getattr(layer, "bias", None) is not None:
            b = layer.bias[lr0 : lr0 + rows] if isinstance(layer, ColumnParallelLinear) else layer.bias
            out.append(_block(f"{p}.bias", r0 if isinstance(layer, ColumnParallelLinear) else 0, 0, 1, b[:, None], dtype))
    return out


def _embedding_blocks(layer, name: str, dtype: torch.dtype, head: bool) -> list[Block]:
    """Rows of the original vocabulary on this shard; an output head read through its GEMM (on CPU the logits use a
    packed copy of the weight), an input embedding from its weight (what its lookup reads)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    if not isinstance(layer.quant_method, UnquantizedEmbeddingMethod):
        raise NotImplementedError(f"{name}: quantized ({type(layer.quant_method).__name__}); rlvr syncs unquantized models")
    si, k = layer.shard_indices, layer.embedding_dim
    rows = si.org_vocab_end_index - si.org_vocab_start_index
    cols = _local_cols(name, k, 0, k)
    if head:
        w = _gemm_columns(layer, cols, k, layer.weight)[:rows]
    else:
        w = layer.weight[:rows][:, cols]
    return [_block(name, si.org_vocab_start_index, 0, k, w, dtype)]


def vllm_blocks(model: torch.nn.Module, names: Iterable[str], dtype: torch.dtype) -> list[Block]:
    """This worker's blocks (module doc) of every checkpoint tensor in ``names`` it holds, values in ``dtype`` (the
    sync's). Parameters that map to no sent name are skipped (the controller's coverage check reports a sent
    tensor no block covers). Errors: ``NotImplementedError`` for quantized or unknown sharded layer types."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    names = set(names)
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    owner: dict[int, str] = {}  # id(param) -> checkpoint name, for tied heads (the head shares the embedding's)
    for mod_name, mod in model.named_modules():
        if not isinstance(mod, ParallelLMHead):
            for pname, p in mod._parameters.items():
                if p is not None:
                    owner.setdefault(id(p), f"{mod_name}.{pname}")
    out: list[Block] = []
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            params = {k: v for k, v in mod._parameters.items() if v is not None}
            if not params:
                continue
            if isinstance(mod, LinearBase):
                out += _linear_blocks(mod, mod_name, packed, dtype)
            elif isinstance(mod, VocabParallelEmbedding):
                head = isinstance(mod, ParallelLMHead)
                name = owner.get(id(mod.weight), f"{mod_name}.weight")
                if name in names:
                    out += _embedding_blocks(mod, name, dtype, head)
            else:  # norms and other replicated parameters: read as they are, when the sent shape matches
                for pname, p in params.items():
                    name = f"{mod_name}.{pname}"
                    if name in names and p.dim() >= 1:
                        out.append(_whole_block(name, p, dtype))
    return [b for b in out if b[0] in names]


def module_blocks(model: torch.nn.Module, names: Iterable[str], dtype: torch.dtype) -> list[Block]:
    """Blocks of a plain torch module whose parameter names are the checkpoint names (the transformers engine):
    each sent tensor whole, from the parameter itself."""
    names = set(names)
    return [_whole_block(name, p, dtype) for name, p in model.named_parameters(remove_duplicate=False) if name in names]


# -- controller side ------------------------------------------------------------------------------------------------
def check_loaded(samples: dict[str, torch.Tensor], workers: Sequence[Sequence[Block]], specs: Sequence[WeightSpec],
                 who: str) -> float:
    """Compare one engine's read-back (``workers``: each worker's blocks) with the trainer's ``samples``
    (:func:`rlvr.sync.weights.trainer_sample` of each sent tensor) and check coverage.

    Returns the fraction of the engine's read-back elements that differ from the trainer's (0.0 after a good sync).
    Errors: :class:`WeightSyncError` naming ``who``, the worker and up to 5 tensors when any element differs (NaN
    equals NaN here), or when the blocks of all workers together do not cover every sent tensor (a tensor the
    engine does not hold where rlvr can find it, or a shard no worker holds)."""
    by_name = {s.name: s for s in specs}
    rects: dict[str, set] = {s.name: set() for s in specs}
    bad, differ, total = [], 0, 0
    for j, blocks in enumerate(workers):
        for name, r0, r1, c0, c1, dtype, data in blocks:
            spec = by_name.get(name)
            if spec is None:
                raise WeightSyncError(f"{who} (worker {j}) read back {name!r}, a tensor the sync did not send")
            cols = sample_columns(name, n_cols(spec.shape))
            js = [i for i, c in enumerate(cols) if c0 <= c < c1]
            exp = samples[name][r0:r1, js]
            got = torch.frombuffer(bytearray(data), dtype=DTYPES[dtype]).view(r1 - r0, len(js)).to(exp.dtype)
            ne = int((~((got == exp) | (got.isnan() & exp.isnan()))).sum())
            differ, total = differ + ne, total + got.numel()
            if ne:
                bad.append(f"worker {j} {name} rows {r0}-{r1} cols {c0}-{c1}: {ne} of {got.numel()} differ")
            rects[name].add((r0, r1, c0, c1))
    frac = differ / max(total, 1)
    if bad:
        raise WeightSyncError(
            f"weight sync to {who}: the engine's loaded weights differ from the trainer's ({differ} of {total} "
            f"read-back elements, {frac:.3g}), e.g. " + "; ".join(bad[:5]) + f" ({len(bad)} blocks). The transfer "
            "checksum matched, so the engine received the right tensors but did not load them (a skipped or partial "
            "reload, a wrong name mapping or shard); the run stops rather than learn from another policy's rollouts."
        )
    missing = []
    for s in specs:
        area = sum((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in rects[s.name])
        if area != s.numel:
            missing.append(f"{s.name} ({area} of {s.numel} elements)")
    if missing:
        raise WeightSyncError(
            f"weight sync to {who}: the engine's read-back does not cover {len(missing)} sent tensors, e.g. "
            + "; ".join(missing[:5]) + ". Either no worker loaded them (a shard or tensor left out) or their layer is "
            "not one rlvr can read back (rlvr.sync.readback: unquantized vLLM linear, embedding and plain layers); "
            "sync.check: false turns the checksum and this read-back off."
        )
    return frac
