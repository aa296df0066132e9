"""The teacher role of on-policy distillation (:mod:`rlvr.algos.distill`, the recipe's ``teacher:`` section).

A fixed model served by the same vLLM engine code as rollout (:class:`rlvr.rollout.vllm_engine.VLLMEngine`), in a
role of its own outside the weight-sync group (its weights never change), scores the student's sampled sequences
(prompt + response ids, as the student sampled them: never re-tokenised) token by token, in ONE batched call per
step (:meth:`TeacherWorker.score`, vLLM's prompt logprobs). :func:`teacher_sequences` and :func:`align` move
between a :class:`~rlvr.train.batch.TrainBatch` and that call; the result is aligned to the batch's shifted frame
[B, S-1], like the reference's logprobs.

This module imports neither torch nor vLLM at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.train.batch import TrainBatch


class TeacherWorker:
    """The teacher role: one vLLM engine on the teacher's model.

    Args: ``model_dir`` a local HF folder (``rlvr.models.resolve_model`` of ``teacher.model``); the engine settings
    as :class:`VLLMEngine` takes them (``dtype``, ``max_model_len`` = the student's longest sequence,
    ``kv_cache_gib``, ``gpu_memory_utilization``, ``enforce_eager``, ``threads``, ``seed``).
    Errors: those of vLLM's engine start (a model that does not load)."""

    def __init__(self, model_dir: str, *, dtype: str, max_model_len: int, seed: int = 0, kv_cache_gib: float = 1.0,
                 gpu_memory_utilization: float = 0.2, enforce_eager: bool = True, threads: int = 1) -> None:
        from rlvr.rollout.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model_dir, dtype=dtype, max_model_len=max_model_len, seed=seed,
                                 kv_cache_gib=kv_cache_gib, gpu_memory_utilization=gpu_memory_utilization,
                                 enforce_eager=enforce_eager, threads=threads)  # fmt: skip

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """The teacher's logprob (nats, temperature 1: the teacher's own distribution) of every token of each
        sequence given the ones before it: [len(seq) - 1] per sequence, in order (tokens 1..; one batched engine
        call, :meth:`VLLMEngine.sequence_logprobs`). Errors: vLLM's, for a sequence over ``max_model_len``."""
        return self.engine.sequence_logprobs(sequences, temperature=1.0)

    def ping(self) -> bool:
        return True

    def shutdown(self) -> None:
        """Stop the teacher's engine now (:meth:`VLLMEngine.shutdown`)."""
        self.engine.shutdown()


def teacher_sequences(batch: TrainBatch) -> list[list[int]]:
    """Each row's real tokens (prompt + response, padding cut by ``attention_mask``): [B] lists of ids."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    return [batch.input_ids[b, : int(n)].tolist() for b, n in enumerate(lengths)]


def align(batch: TrainBatch, scored: list[list[float]]) -> Tensor:
    """The teacher's logprobs in the batch's shifted frame: [B, S-1] float32 (nats), position t of row b is the
    logprob of ``input_ids[b, t + 1]`` (``scored[b][t]``), 0 past the row's last token (padding).
    Errors: ``ValueError`` when a row's count is not its length - 1 (the teacher scored something else)."""
    import torch

    b, s = batch.input_ids.shape
    out = torch.zeros((b, s - 1), dtype=torch.float32)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    if len(scored) != b:
        raise ValueError(f"the teacher scored {len(scored)} sequences; the batch has {b}")
    for i, (row, n) in enumerate(zip(scored, lengths)):
        if len(row) != int(n) - 1:
            raise ValueError(f"the teacher returned {len(row)} logprobs for row {i} of {int(n)} tokens (expected {int(n) - 1})")
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out
