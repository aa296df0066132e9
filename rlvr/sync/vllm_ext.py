"""Engine side of weight sync: a vLLM worker extension (``worker_extension_cls``).

vLLM mixes this class into its worker; the engine reaches the methods through ``LLM.collective_rpc(name, args)``.
Tensors never travel inside ``collective_rpc`` arguments (they cannot in multiprocess mode): only the
:class:`~rlvr.sync.weights.WeightSpec` list does, and the tensors come over the weight-sync process group.

Loading uses ``reload_weights(weights_iterator=..., is_checkpoint_format=True)`` (HF checkpoint names), which
works on CPU where ``model.load_weights`` does not (vLLM repacks CPU weights). The caller must reset the prefix
cache afterwards (stale KV blocks computed with the old weights otherwise survive: ~16 nats logprob errors).
"""

from __future__ import annotations

import torch

from rlvr.sync.weights import WeightSpec, create_group, receive_into


class WeightSyncExtension:
    """Methods added to each vLLM worker."""

    def rlvr_seed(self, seed: int) -> bool:
        """Seed the worker's global RNGs (torch CPU/CUDA, Python, NumPy): requests without a seed of their own draw
        from them, so the same calls after the same seed sample the same tokens (exact resume)."""
        import random

        import numpy as np

        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        return True

    def rlvr_init_sync(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float, name: str) -> bool:
        self._rlvr_pg = create_group(
            host=host, port=port, rank=rank, world_size=world_size, backend=backend, timeout_s=timeout_s, name=name
        )
        self._rlvr_timeout = timeout_s
        return True

    def rlvr_receive(self, specs: list[tuple[str, tuple[int, ...], str]]) -> float:
        """Receive one full set of weights and load it. Returns the checksum of what was received."""
        wspecs = [WeightSpec(n, tuple(s), d) for n, s, d in specs]
        device = self.device if hasattr(self, "device") else torch.device("cpu")
        named, total = receive_into(self._rlvr_pg, wspecs, device, self._rlvr_timeout)
        model_dtype = next(self.model_runner.get_model().parameters()).dtype
        named = [(n, t.to(model_dtype)) for n, t in named]
        self.reload_weights(weights_iterator=named, is_checkpoint_format=True)
        return total
