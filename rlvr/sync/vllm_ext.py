"""Engine side of weight sync: a vLLM worker extension (``worker_extension_cls``): receive and load
(:meth:`WeightSyncExtension.rlvr_receive`), then read back what was loaded (:meth:`WeightSyncExtension.rlvr_readback`).

vLLM mixes this class into its worker; the engine reaches the methods through ``LLM.collective_rpc(name, args)``.
Tensors never travel inside ``collective_rpc`` arguments (they cannot in multiprocess mode): only the
:class:`~rlvr.sync.weights.WeightSpec` list does, and the tensors come over the weight-sync process group.

Loading uses ``reload_weights(weights_iterator=..., is_checkpoint_format=True)`` (HF checkpoint names), which
works on CPU where ``model.load_weights`` does not (vLLM repacks CPU weights). The caller must reset the prefix
cache afterwards (stale KV blocks computed with the old weights otherwise survive: ~16 nats logprob errors).

Tied output heads (``tie_word_embeddings``, e.g. SmolLM2): the checkpoint has no ``lm_head.weight`` and the head
shares the embedding's ``Parameter``, so a reload writes the new embedding into the head's storage too, but vLLM
0.32's layer-wise reload (``model_loader/reload/layerwise.py``, ``finalize_layerwise_processing``) sees no weight
loaded *for the head*, logs "ParallelLMHead: Failed to load weights" and puts the old kernel tensors back without
running ``process_weights_after_loading``. On CPU that method is what builds the head's GEMM
(``UnquantizedEmbeddingMethod`` -> ``dispatch_cpu_unquantized_gemm``: a packed copy of the weight inside
``layer.cpu_linear``), so the logits kept using the start-up head. :func:`refresh_tied_layers` re-runs it for every
layer whose weight is shared with another (a no-op on GPU, where the head reads ``layer.weight`` directly).
"""

from __future__ import annotations

import torch

from rlvr.sync.weights import Received, WeightSpec, WeightSyncError, create_group, drain, receive_stream


def refresh_tied_layers(model: torch.nn.Module) -> list[str]:
    """Re-run ``quant_method.process_weights_after_loading`` on every layer whose ``weight`` is the same tensor as
    another layer's (tied embeddings), so derived kernel state (CPU packed GEMM weights) follows the new values.

    Returns the names of the refreshed layers. Errors: ``NotImplementedError`` for a tied layer under a quantized
    method (re-processing quantized weights in place is not known to be safe; rlvr syncs unquantized models).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    by_weight: dict[int, list[tuple[str, torch.nn.Module]]] = {}
    for name, mod in model.named_modules():
        w = mod._parameters.get("weight") if hasattr(mod, "_parameters") else None
        if w is not None and getattr(mod, "quant_method", None) is not None:
            by_weight.setdefault(id(w), []).append((name, mod))
    refreshed = []
    for group in by_weight.values():
        if len(group) < 2:
            continue
        for name, mod in group:
            if not isinstance(mod.quant_method, UnquantizedEmbeddingMethod):
                raise NotImplementedError(
                    f"{name}: tied weight under {type(mod.quant_method).__name__}; live sync supports unquantized "
                    "tied embeddings only"
                )
            mod.quant_method.process_weights_after_loading(mod)
            refreshed.append(name)
    return refreshed


class WeightSyncExtension:
    """Methods added to each vLLM worker."""

    def rlvr_seed(self, seed: int) -> bool:
        """Seed the worker's global RNGs (torch CPU/CUDA, Python, NumPy): requests without a seed of their own draw
        from them, so the same calls after the same seed sample the same tokens (exact resume)."""
        import random

        import numpy as np

        torch.manual_seed(seed)
        random.seed(seed)
        from rlvr.seeding import numpy_seed

        np.random.seed(numpy_seed(seed))
        return True

    def rlvr_init_sync(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float, name: str) -> bool:
        """Join the weight-sync group as group rank ``rank + `` this worker's rank in its engine (tensor parallel)."""
        self._rlvr_pg = create_group(
            host=host, port=port, rank=rank + int(getattr(self, "rank", 0)), world_size=world_size, backend=backend,
            timeout_s=timeout_s, name=name,
        )
        self._rlvr_timeout = timeout_s
        return True

    def rlvr_receive(self, specs: list[tuple[str, tuple[int, ...], str]], bucket_mb: float = 0.0) -> float:
        """Receive one full set of weights (packed as the sender packs them: ``bucket_mb``, 0 = one broadcast per
        tensor) and load it as it arrives: vLLM's ``reload_weights`` consumes :func:`receive_stream` lazily and its
        layer-wise reload buffers a layer's tensors only until the layer is complete (the sender sends layer by
        layer), so this worker holds a few buckets beyond its weights, never the whole model; under tensor
        parallelism each loaded tensor is cut to this worker's shard and the full one dropped.
        Returns the checksum of what was received.
        Errors: :class:`WeightSyncError` when the transfer fails, or the loader stopped before the last tensor."""
        wspecs = [WeightSpec(n, tuple(s), d) for n, s, d in specs]
        device = self.device if hasattr(self, "device") else torch.device("cpu")
        model_dtype = next(self.model_runner.get_model().parameters()).dtype
        got = Received()
        stream = receive_stream(self._rlvr_pg, wspecs, device, self._rlvr_timeout, bucket_mb, got)
        self.reload_weights(weights_iterator=((n, t.to(model_dtype)) for n, t in stream), is_checkpoint_format=True)
        left = drain(stream)  # the loader should have taken all; the sender's broadcasts must be answered anyway
        if left:
            raise WeightSyncError(f"the engine's loader stopped after {got.count - left} of {len(wspecs)} tensors")
        with torch.no_grad():
            refresh_tied_layers(self.model_runner.get_model())  # a tied head follows its embedding (module doc)
        return got.checksum

    def rlvr_receive_adapter(self, specs: list[tuple[str, tuple[int, ...], str]], bucket_mb: float, folder: str,
                             config_json: str) -> float:
        """Receive one set of LoRA adapter tensors (``trainer.lora.sync: adapter``; PEFT's names, packed as the
        sender packs them) and, on this engine's first worker, write them as a PEFT folder ``folder``
        (``adapter_model.safetensors`` + ``adapter_config.json`` = ``config_json``; written under a temporary name
        and renamed, so a reader sees a whole folder or none), which the engine then registers as a ``LoRARequest``
        (vLLM reads it in every worker). The adapters are kilobytes to megabytes: held whole. Returns the checksum
        of what was received. Errors: :class:`WeightSyncError` when the transfer fails."""
        import os
        import shutil

        from safetensors.torch import save_file

        from rlvr.sync.weights import receive_into

        wspecs = [WeightSpec(n, tuple(s), d) for n, s, d in specs]
        tensors, checksum = receive_into(self._rlvr_pg, wspecs, torch.device("cpu"), self._rlvr_timeout, bucket_mb)
        if int(getattr(self, "rank", 0)) == 0:
            tmp = folder + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            save_file({n: t.clone() for n, t in tensors}, os.path.join(tmp, "adapter_model.safetensors"))
            with open(os.path.join(tmp, "adapter_config.json"), "w") as f:
                f.write(config_json)
            shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
        return checksum

    def rlvr_readback(self, names: list[str], dtype: str) -> list[tuple]:
        """This worker's read-back of what it loaded (:func:`rlvr.sync.readback.vllm_blocks`): blocks of the
        checkpoint tensors ``names`` it holds, values in ``dtype`` (the sync's). A call of its own, after
        :meth:`rlvr_receive`, so that it checks whatever that did."""
        from rlvr.sync.readback import vllm_blocks
        from rlvr.sync.weights import DTYPES

        return vllm_blocks(self.model_runner.get_model(), names, DTYPES[dtype])
