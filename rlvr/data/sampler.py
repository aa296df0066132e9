"""Epoch-aware, seeded, resumable prompt sampler.

Epoch ``e`` visits every item once, in the order ``torch.randperm(N, generator=manual_seed(seed + e))``
(``0..N-1`` when not shuffling). Batches run straight through the epochs: a batch that reaches the end of an
epoch takes the rest of it and continues with the next epoch's order. The state is the position of the next
item, ``(epoch, offset)``, so a sampler restored from :meth:`PromptSampler.state_dict` yields exactly what an
uninterrupted one would have (case C1 of ``cases/README.md``).
"""

from __future__ import annotations

from typing import Any


class PromptSampler:
    """Draws batches of item indices (positions in the prompt list) epoch after epoch.

    Args: ``num_items`` N >= 1; ``batch_size`` P, 1 <= P <= N (a batch never repeats an item unless it
    crosses an epoch boundary, where the next epoch may draw one again); ``seed``; ``shuffle``.

    Errors: ``ValueError`` for N < 1, P < 1, or P > N (with the recipe key to change).
    """

    def __init__(self, num_items: int, batch_size: int, seed: int, shuffle: bool = True) -> None:
        if num_items < 1:
            raise ValueError(f"no prompts to sample from (num_items={num_items}); check data.source and data.limit")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be >= 1 (rollout.prompts_per_step)")
        if batch_size > num_items:
            raise ValueError(
                f"batch_size {batch_size} > {num_items} prompts: a batch would hold a prompt twice; set "
                f"rollout.prompts_per_step <= {num_items}, or use more data (data.limit, data.generated.size, "
                "data.max_prompt_tokens)"
            )
        self.num_items = num_items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self._epoch = 0
        self._offset = 0
        self._order_epoch = -1
        self._order: list[int] = []

    @property
    def epoch(self) -> int:
        """Epochs completed so far = the epoch the next batch starts in (0 at first)."""
        return self._epoch

    @property
    def batches_per_epoch(self) -> float:
        """N / P: batches in one epoch (fractional when P does not divide N)."""
        return self.num_items / self.batch_size

    def order(self, epoch: int) -> list[int]:
        """[N] the visiting order of ``epoch``: a permutation of 0..N-1 (seeded with ``seed + epoch``)."""
        if epoch != self._order_epoch:
            if self.shuffle:
                import torch

                from rlvr.seeding import epoch_seed

                gen = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
                self._order = torch.randperm(self.num_items, generator=gen).tolist()
            else:
                self._order = list(range(self.num_items))
            self._order_epoch = epoch
        return self._order

    def next_batch(self) -> list[int]:
        """[P] the next ``batch_size`` item indices; advances the state (may cross into the next epoch)."""
        out: list[int] = []
        while len(out) < self.batch_size:
            take = min(self.batch_size - len(out), self.num_items - self._offset)
            out.extend(self.order(self._epoch)[self._offset : self._offset + take])
            self._offset += take
            if self._offset == self.num_items:
                self._epoch += 1
                self._offset = 0
        return out

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "offset", "seed"}``: the position of the next item and the seed (plain ints, JSON-safe)."""
        return {"epoch": self._epoch, "offset": self._offset, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict` (the saved seed replaces this sampler's).

        Errors: ``ValueError`` when a key is missing or the offset does not fit this data set (the prompt
        list changed size since the checkpoint: resuming would not reproduce the run).
        """
        missing = [k for k in ("epoch", "offset", "seed") if k not in state]
        if missing:
            raise ValueError(f"sampler state lacks {missing}; expected keys epoch, offset, seed (got {sorted(state)})")
        epoch, offset, seed = int(state["epoch"]), int(state["offset"]), int(state["seed"])
        if epoch < 0 or not 0 <= offset < self.num_items:
            raise ValueError(
                f"sampler state epoch={epoch}, offset={offset} does not fit {self.num_items} prompts: the data "
                "changed since the checkpoint (data.source, data.limit, data.max_prompt_tokens); restore them"
            )
        self._epoch, self._offset, self.seed = epoch, offset, seed
        self._order_epoch = -1
