"""The rollout engine seam: what the controller asks of any engine (vLLM, transformers generate)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rlvr.types import Completion, Prompt, SamplingConfig


class Engine(Protocol):
    """A rollout engine holding one copy of the policy.

    ``generate`` returns ``len(prompts) * sampling.n`` completions ordered prompt-major (all G samples of prompt
    0, then prompt 1, ...). ``policy_version`` is the version of the weights loaded (0 = the initial model).
    """

    policy_version: int

    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[Completion]: ...

    def sequence_logprobs(self, sequences: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """Log-probabilities (nats) of tokens 1..n-1 of each sequence given its prefix: [N][len_i - 1]."""
        ...

    def probe_logprobs(self, prompt_ids: list[int], n_tokens: int) -> tuple[list[int], list[float]]:
        """The sync probe: a greedy continuation of ``prompt_ids`` generated on the engine's serving path (prefix
        cache included), ``n_tokens`` ids (eos ignored), and the logprobs [P - 1 + n_tokens] (nats, temperature 1)
        of tokens 1.. of prompt + continuation."""
        ...

    def expected_weights(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensor name -> shape, for checking a weight sync before it starts."""
        ...

    def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float, name: str) -> bool: ...

    def receive_weights(self, specs: list[tuple[str, tuple[int, ...], str]], version: int, bucket_mb: float = 0.0) -> float:
        """Receive a full weight set over the sync group, load it, drop cached prefixes, stamp ``version``.
        ``bucket_mb``: the sender's packing (``sync.bucket_mb``; 0: one broadcast per tensor).

        Returns the checksum of the received tensors (see :mod:`rlvr.sync.weights`)."""
        ...

    def loaded_blocks(self, names: list[str], dtype: str) -> list[list[tuple]]:
        """After a sync, a sample of the checkpoint tensors ``names`` read back from the weights the engine computes
        with, in ``dtype``: one list of blocks per worker (:mod:`rlvr.sync.readback`)."""
        ...

    def get_policy_version(self) -> int:
        """The version of the weights loaded (0: the initial model; a sync stamps the trainer's)."""
        ...

    def ping(self) -> bool:
        """True once the engine is up (the controller's start-up and liveness check)."""
        ...


def checkpoint_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a Hugging Face safetensors folder (headers only; no tensor is read).

    Errors: ``FileNotFoundError`` when the folder has no ``*.safetensors`` file.
    """
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files; rlvr needs a safetensors checkpoint")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                shapes[k] = tuple(h.get_slice(k).get_shape())
    return shapes
