"""Packing completions into padded tensors for the trainer.

Each sequence is its prompt followed by its response, right-padded. Tensors are in the *shifted* frame used for
next-token log-probabilities: position t of a ``[B, S-1]`` tensor refers to the token ``input_ids[:, t + 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.types import Completion


@dataclass(frozen=True)
class TrainBatch:
    """A rollout batch ready for the policy update.

    ``input_ids``: [B, S] prompt + response ids, right-padded with ``pad_id``; S = longest prompt + response.
    ``attention_mask``: [B, S] 1 on real tokens.
    ``loss_mask``: [B, S-1] 1 where the target token is a response token (up to and including eos, case R3).
    ``rollout_logprobs``: [B, S-1] the engine's sampled logprobs on response positions, 0 elsewhere.
    ``advantages``: [B] one advantage per sequence (broadcast over its tokens), or [B, S-1] one per token (``gae``,
    KL folded into the reward).
    ``max_new_tokens``: the generation limit (the constant normaliser of Dr. GRPO aggregation).
    ``versions``: [B, S-1] the policy version that sampled each response token (``Completion.token_versions``),
    -1 off the loss mask (a completion without per-token versions gives its ``policy_version`` to every token);
    None for a batch built without them (the trainer then reports no gap by token age).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    max_new_tokens: int
    versions: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, idx: list[int] | torch.Tensor) -> "TrainBatch":
        """Rows ``idx``, trimmed to their own longest sequence (less padding per micro-batch)."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        am = self.attention_mask[idx]
        s = int(am.sum(1).max())
        return TrainBatch(
            input_ids=self.input_ids[idx, :s],
            attention_mask=am[:, :s],
            loss_mask=self.loss_mask[idx, : s - 1],
            rollout_logprobs=self.rollout_logprobs[idx, : s - 1],
            advantages=self.advantages[idx] if self.advantages.dim() == 1 else self.advantages[idx, : s - 1],
            max_new_tokens=self.max_new_tokens,
            versions=self.versions[idx, : s - 1] if self.versions is not None else None,
        )


def pack(completions: list[Completion], advantages: torch.Tensor, pad_id: int, max_new_tokens: int) -> TrainBatch:
    """Pack B completions (with ``advantages``: [B]) into a :class:`TrainBatch`.

    Completions with an empty response, and those ended by an infrastructure failure (``Completion.failure``: an
    environment that raised, hung, crashed or answered garbage; not the policy's outcome), keep a zero loss mask
    (they contribute nothing, counted in no normaliser).
    A multi-turn trajectory's ``loss_mask`` (:attr:`rlvr.types.Completion.loss_mask`) is copied in: its environment
    and template tokens are inputs, never targets, so every loss, KL, entropy and normaliser counts sampled tokens
    only.
    """
    b = len(completions)
    s = max(len(c.prompt_ids) + len(c.token_ids) for c in completions)
    ids = torch.full((b, s), pad_id, dtype=torch.long)
    am = torch.zeros((b, s), dtype=torch.long)
    lm = torch.zeros((b, s - 1), dtype=torch.float32)
    rl = torch.zeros((b, s - 1), dtype=torch.float32)
    ver = torch.full((b, s - 1), -1, dtype=torch.long)
    for i, c in enumerate(completions):
        lp, lr = len(c.prompt_ids), len(c.token_ids)
        ids[i, : lp + lr] = torch.tensor(c.prompt_ids + c.token_ids)
        am[i, : lp + lr] = 1
        if lr and c.failure is None:  # position lp - 1 + t predicts response token t; sampled tokens only
            mask = torch.ones(lr) if c.loss_mask is None else torch.tensor(c.loss_mask, dtype=torch.float32)
            lm[i, lp - 1 : lp - 1 + lr] = mask
            rl[i, lp - 1 : lp - 1 + lr] = torch.tensor(c.logprobs, dtype=torch.float32) * mask
            # each sampled token's version: its own, or the sample's
            v = torch.tensor(c.token_versions if c.token_versions is not None else [c.policy_version] * lr)
            ver[i, lp - 1 : lp - 1 + lr] = torch.where(mask.bool(), v, torch.full_like(v, -1))
    return TrainBatch(
        input_ids=ids,
        attention_mask=am,
        loss_mask=lm,
        rollout_logprobs=rl,
        advantages=advantages.float().reshape(b),
        max_new_tokens=max_new_tokens,
        versions=ver,
    )
