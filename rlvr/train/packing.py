"""Packed micro-batches: the sequences of a micro-batch laid end to end in a few rows, no padding computed.

A :class:`rlvr.train.batch.TrainBatch` micro-batch is ``b`` right-padded rows of ``S`` tokens. Packed, its
sequences are dealt first-fit-decreasing into rows of ``C`` tokens, ``C`` a small multiple of the longest sequence
(:func:`row_layout`: rows long enough to fill up, short enough that attention under a mask, quadratic in ``C``,
stays cheap), ``position_ids`` restarting at 0 at each sequence. transformers (5.x) reads restarting
``position_ids`` with no ``attention_mask`` as packed sequences and confines attention to each one
(``masking_utils.find_packed_sequence_indices``: sdpa, eager and flex build a block-diagonal causal mask,
flash_attention_2 its variable-length kernel), and only without a KV cache (``use_cache=False``: with one it
reads them as plain positions and every sequence attends to those before it in its row). A row's unused tail is a
segment of its own that nothing attends to.

Everything downstream stays in the padded ``[b, S-1]`` frame: :func:`forward_inputs` gives, besides the model's
inputs, the index of each ``(row, t)`` of that frame in the flattened ``[R * C]`` output, so that
``hidden.flatten(0, 1)[index[loss_mask]]`` is the hidden state that predicts each response token, packed or not.
Losses, normalisers and metrics never see the packing.

Whether a model honours packed ``position_ids`` (an architecture whose attention builds its own mask, or remote
code, may not) is checked on the model itself: :func:`packing_honoured`.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInputs:
    """What one forward takes and where its outputs go.

    ``kwargs``: the model's keyword arguments: ``input_ids`` [R, C] with ``position_ids`` [R, C] (packed) or
    ``attention_mask`` [b, S] (padded). ``index``: [b, S-1] long, the place in the flattened [R * C] (or [b * S])
    output of the position whose next token is ``input_ids[i, t + 1]`` of the padded batch; -1 past a sequence's
    end. ``tokens``: real tokens; ``computed``: tokens the forward computes (R * C or b * S)."""

    kwargs: dict[str, torch.Tensor]
    index: torch.Tensor
    tokens: int
    computed: int

    @property
    def padding_frac(self) -> float:
        """Share of the computed positions that are padding."""
        return 1.0 - self.tokens / self.computed if self.computed else 0.0


def sequence_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Tokens of each row ([b]) of a right-padded ``attention_mask`` [b, S].

    Errors: ``ValueError`` when a row is not ones followed by zeros (left padding, holes): packing would reorder
    its tokens."""
    lengths = attention_mask.sum(1)
    expect = torch.arange(attention_mask.shape[1])[None, :] < lengths[:, None]
    if not torch.equal(attention_mask.bool(), expect):
        raise ValueError("packing needs right-padded rows (an attention_mask of ones then zeros); "
                         "set trainer.packing: false for this batch layout")
    return lengths


def first_fit_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Deal sequences of ``lengths`` into rows of ``capacity`` tokens, first-fit decreasing (longest first, ties
    in index order, each into the first row with room). Returns each row's sequence indices in the order laid.
    Errors: ``ValueError`` when a sequence is longer than ``capacity``."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"a sequence of {n} tokens does not fit a packed row of {capacity}")
        for r, room in enumerate(free):
            if room >= n:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(capacity - n)
    return rows


ROW_MULTIPLES = (1, 2, 3, 4)
"""Row lengths tried, as multiples of the longest sequence (:func:`row_layout`)."""
PADDING_GOAL = 0.05
"""The padding share :func:`row_layout` settles for."""


def row_layout(lengths: list[int]) -> tuple[int, list[list[int]]]:
    """Rows for sequences of ``lengths``: (row length C, each row's sequences). C is the smallest multiple of the
    longest sequence (:data:`ROW_MULTIPLES`) whose first-fit-decreasing rows leave at most :data:`PADDING_GOAL`
    of the computed positions to padding, else the one that leaves least. Rows of the longest alone leave
    whatever cannot pair up (a 150 and a 140 beside a 268); longer rows fill better, and cost attention: under a
    mask (sdpa, eager on CPU) every position of a row is scored against every other, so C stays within 4x the
    longest. Never more positions than rows of the longest (what :func:`micro_batches` counts)."""
    longest = max(max(lengths), 1)
    best: tuple[int, int, list[list[int]]] | None = None
    for k in ROW_MULTIPLES:
        rows = first_fit_rows(lengths, k * longest)
        computed = len(rows) * k * longest
        if best is None or computed < best[0]:
            best = (computed, k * longest, rows)
        if computed - sum(lengths) <= PADDING_GOAL * computed:
            break
    assert best is not None
    return best[1], best[2]


def forward_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, packed: bool,
                   pad_id: int = 0) -> ModelInputs:
    """The inputs of one forward over a right-padded micro-batch (``input_ids``, ``attention_mask``: [b, S]),
    packed (rows of :func:`row_layout`, see the module docstring) or as it is; packed, a layout of one sequence a
    row is the padded batch itself, which it returns. See :class:`ModelInputs`. Errors: ``ValueError`` from
    :func:`sequence_lengths` when packed."""
    b, s = input_ids.shape
    if not packed:
        index = torch.arange(b)[:, None] * s + torch.arange(s - 1)[None, :]
        tokens = int(attention_mask.sum())
        return ModelInputs({"input_ids": input_ids, "attention_mask": attention_mask}, index, tokens, b * s)
    lengths = sequence_lengths(attention_mask).tolist()
    cap, rows = row_layout(lengths)
    if len(rows) == b and cap == s:  # one sequence a row: the padded batch itself (no packed mask to build)
        return forward_inputs(input_ids, attention_mask, packed=False)
    ids = torch.full((len(rows), cap), pad_id, dtype=input_ids.dtype)
    pos = torch.zeros((len(rows), cap), dtype=torch.long)
    index = torch.full((b, max(s - 1, 0)), -1, dtype=torch.long)
    for r, members in enumerate(rows):
        o = 0
        for i in members:
            n = lengths[i]
            ids[r, o : o + n] = input_ids[i, :n]
            pos[r, o : o + n] = torch.arange(n)
            if n > 1:
                index[i, : n - 1] = r * cap + o + torch.arange(n - 1)
            o += n
        pos[r, o:] = torch.arange(cap - o)  # the tail: a segment of its own
    return ModelInputs({"input_ids": ids, "position_ids": pos}, index, sum(lengths), len(rows) * cap)


def packing_honoured(model: torch.nn.Module, vocab_size: int, autocast: Callable[[], Any] = nullcontext,
                     tol: float = 2e-2) -> tuple[bool, float]:
    """Whether ``model`` (a transformers causal LM or backbone, any attention implementation) confines attention
    to each packed sequence: the last hidden state of three short sequences (5, 3 and 2 tokens) packed in one row
    against each alone, under ``autocast`` (the trainer's). Returns (honoured: the largest difference relative to
    the largest hidden value under ``tol``, that relative difference). Rounding moves it by ~1e-7 in fp32 and
    ~1e-3 under bf16; a sequence that sees its neighbour moves it by ~1e-1 and more. Runs without gradient, in
    eval mode, on the model's device; the model's mode is restored."""
    p = next(model.parameters())
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, vocab_size, (n,), generator=gen) for n in (5, 3, 2)]
    backbone = getattr(model, "base_model", model)  # the decoder of a causal LM, a backbone itself
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast():
            alone = torch.cat([backbone(input_ids=x[None].to(p.device), use_cache=False).last_hidden_state[0]
                               for x in seqs]).float()  # fmt: skip
            ids = torch.cat(seqs)[None].to(p.device)
            pos = torch.cat([torch.arange(len(x)) for x in seqs])[None].to(p.device)
            packed = backbone(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state[0].float()
    finally:
        model.train(was)
    rel = float((packed - alone).abs().max() / alone.abs().max().clamp(min=1e-12))
    return rel < tol, rel


def resolve_packing(mode: bool | str, model: torch.nn.Module, vocab_size: int, who: str = "trainer",
                    autocast: Callable[[], Any] = nullcontext) -> bool:
    """``trainer.packing`` for ``model`` (a transformers model with ``last_hidden_state`` out of its backbone):
    ``False`` pads; ``True`` packs, and raises ``ValueError`` where the model does not honour packed
    ``position_ids``; ``"auto"`` packs where it does and otherwise pads, saying so in a warning
    (:func:`packing_honoured`). Errors: ``ValueError`` for an unknown mode."""
    if not (mode is True or mode is False or mode == "auto"):
        raise ValueError(f"trainer.packing={mode!r}: expected true, false or auto")
    if mode is False:
        return False
    ok, diff = packing_honoured(model, vocab_size, autocast)
    impl = getattr(getattr(model, "config", None), "_attn_implementation", "?")
    if ok:
        log.info("%s: packed micro-batches (attention %s confines each sequence; check: relative difference %.1e)", who, impl, diff)
        return True
    msg = (f"{who}: this model ({type(model).__name__}, attention {impl}) does not confine attention to packed "
           f"sequences (hidden states differ by {diff:.3g} of their largest value from each sequence alone)")
    if mode is True:
        raise ValueError(msg + ": set trainer.packing=auto (pads instead) or false")
    log.warning("%s; micro-batches are padded instead (trainer.packing=auto)", msg)
    return False


def micro_batches(order: list[int], lengths: list[int], budget: int, packed: bool) -> list[list[int]]:
    """Split sequences ``order`` (indices into ``lengths``, longest first) into consecutive micro-batches of at
    most ``budget`` computed tokens (``trainer.max_tokens_per_micro_batch``). Computed tokens: packed, the rows of
    :func:`forward_inputs` (first-fit decreasing into rows of the micro-batch's longest sequence: rows x longest),
    padded, sequences x longest. A sequence longer than ``budget`` is a micro-batch of its own. So a micro-batch
    never computes more than max(``budget``, the longest sequence) positions (what ``--dry-run`` counts).
    Errors: ``ValueError`` for a ``budget`` < 1 or an order that is not longest first."""
    if budget < 1:
        raise ValueError(f"trainer.max_tokens_per_micro_batch={budget}: expected a positive number of tokens")
    if any(lengths[a] < lengths[b] for a, b in zip(order, order[1:])):
        raise ValueError("micro_batches needs the sequences longest first")
    out: list[list[int]] = []
    cur: list[int] = []
    free: list[int] = []  # one entry a row of the current micro-batch (padded: a sequence); packed: its room left
    cap = 0
    for i in order:
        n = lengths[i]
        if cur:
            if packed and any(room >= n for room in free):
                r = next(k for k, room in enumerate(free) if room >= n)
                free[r] -= n
                cur.append(i)
                continue
            if (len(free) + 1) * cap <= budget:
                free.append(cap - n)
                cur.append(i)
                continue
            out.append(cur)
        cur, cap, free = [i], n, [0]
    if cur:
        out.append(cur)
    return out


def split_micro_batches(order: list[int], lengths: list[int], budget: int, packed: bool, rows: int) -> list[list[int]]:
    """Micro-batches of sequences ``order`` (indices into ``lengths``): with a token ``budget`` > 0
    (``trainer.max_tokens_per_micro_batch``), :func:`micro_batches` (``order`` longest first); with 0, ``rows``
    sequences at a time in the given order."""
    if budget:
        return micro_batches(order, lengths, budget, packed)
    return [order[k : k + rows] for k in range(0, len(order), rows)]


def balanced_shares(order: list[int], lengths: list[int], world: int) -> list[list[int]]:
    """Deal sequences ``order`` to ``world`` data-parallel ranks by tokens: each, longest first, to the rank with
    the fewest tokens so far (ties: the lowest rank; the longest-processing-time rule, as verl and slime balance
    their token-budget batches). Returns each rank's sequences, longest first. Every rank computes the same deal."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(order, key=lambda i: (-lengths[i], i)):
        r = min(range(world), key=lambda k: (load[k], k))
        shares[r].append(i)
        load[r] += lengths[i]
    return shares
