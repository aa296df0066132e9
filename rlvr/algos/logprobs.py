"""Token log-probabilities, entropies and masks computed the same way the sampler does (case R1).

Dimensions: B = sequences, T = response tokens (padded), V = vocabulary. ``logits[b, t]`` are the logits
that predicted ``token_ids[b, t]`` (already shifted by the caller: the model's output at the position
before the token). The sampling transform is ``log_softmax(logits / temperature)``, in float32 whatever the
logits' dtype (bf16 logprobs are off by ~0.1 nats). Only temperature is applied: the rollout engine must
report logprobs of the same transform (no top-p/top-k renormalisation, case R2).

Memory: the [B, T, V] tensors are processed one sequence at a time, so at most one [T, V] float32 copy is
alive during a forward without grad (with grad, autograd keeps what backward needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from rlvr.lazy import lazy_module

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_module("torch")

LOG_RATIO_CLAMP = 20.0
"""|log r| bound for any log-ratio of two policies (KL estimators, importance ratios) applied before ``exp``:
exp(20) = 4.9e8 is finite in fp32 and bf16, so one stale or near-zero-probability token cannot overflow."""


def _check(logits: Tensor, temperature: float) -> None:
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _scaled_f32(logits_bt: Tensor, temperature: float) -> Tensor:
    """[T, V] logits of one sequence -> float32 logits / temperature."""
    z = logits_bt.float()
    return z if temperature == 1.0 else z / temperature


def token_logprobs(logits: Tensor, token_ids: Tensor, temperature: float) -> Tensor:
    """``log_softmax(logits / temperature)[b, t, token_ids[b, t]]`` in nats.

    logits: [B, T, V] (any float dtype); token_ids: [B, T] integer -> [B, T] float32.
    Computed as ``z[token] - logsumexp(z)`` per sequence without materialising the [B, T, V] log-softmax.
    Case R1: logits [2, 1, 0], temperature 0.5, token 0 -> -0.1429.
    Errors: ``ValueError`` on bad shapes, out-of-vocabulary ids or temperature <= 0.
    """
    _check(logits, temperature)
    if token_ids.shape != logits.shape[:-1]:
        raise ValueError(f"token_ids {tuple(token_ids.shape)} must be [B, T] = {tuple(logits.shape[:-1])}")
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= logits.shape[-1]):
        raise ValueError(f"token_ids must lie in [0, V = {logits.shape[-1]})")
    if logits.shape[0] == 0:
        return logits.new_zeros(token_ids.shape, dtype=torch.float32)
    ids = token_ids.long().unsqueeze(-1)
    rows = []
    for b in range(logits.shape[0]):
        z = _scaled_f32(logits[b], temperature)  # [T, V]
        rows.append(z.gather(-1, ids[b]).squeeze(-1) - torch.logsumexp(z, dim=-1))
    return torch.stack(rows)


def entropy_from_logits(logits: Tensor, temperature: float) -> Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at each position.

    logits: [B, T, V] -> [B, T] float32, computed as ``logsumexp(z) - sum_v softmax(z)_v * z_v``; ``-inf``
    logits (banned tokens) contribute 0. Errors: ``ValueError`` on bad shapes or temperature <= 0.
    """
    _check(logits, temperature)
    if logits.shape[0] == 0:
        return logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
    rows = []
    for b in range(logits.shape[0]):
        z = _scaled_f32(logits[b], temperature)  # [T, V]
        p = torch.softmax(z, dim=-1)
        z_finite = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
        rows.append(torch.logsumexp(z, dim=-1) - (p * z_finite).sum(dim=-1))
    return torch.stack(rows)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(x * mask) / sum(mask)`` over all elements (``dim=None``: a scalar) or along ``dim``.

    Normaliser: the number of masked elements, floored at 1, so an empty mask gives 0 (not NaN). Masked-out
    elements are replaced by 0 before the sum, so NaN/inf there do not leak in.
    x, mask: one shape (e.g. [B, T]). Errors: ``ValueError`` when the shapes differ.
    """
    if x.shape != mask.shape:
        raise ValueError(f"x {tuple(x.shape)} and mask {tuple(mask.shape)} must have one shape")
    m = mask.bool()
    total = torch.where(m, x, torch.zeros_like(x))
    if dim is None:
        return total.sum() / m.sum().clamp(min=1).to(total.dtype)
    return total.sum(dim=dim) / m.sum(dim=dim).clamp(min=1).to(total.dtype)


def response_mask(token_ids: Tensor, eos_ids: int | Iterable[int], pad_id: int) -> Tensor:
    """Loss mask of padded responses: 1 up to AND including the first end-of-sequence id, 0 after it.

    token_ids: [B, T] generated ids, right-padded with ``pad_id`` -> [B, T] float32 of 0/1.
    A response with no eos (truncated) keeps every token up to its last non-pad one; only the trailing run
    of ``pad_id`` is masked. ``pad_id`` may equal an eos id: the first one is the end and stays in the mask,
    so the model learns to stop (case R3: eos 7, pad 7, [5, 6, 7, 7, 7] -> [1, 1, 1, 0, 0]).
    Errors: ``ValueError`` when ``token_ids`` is not 2-D or ``eos_ids`` is empty.
    """
    if token_ids.dim() != 2:
        raise ValueError(f"token_ids must be [B, T], got shape {tuple(token_ids.shape)}")
    eos = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids)
    if not eos:
        raise ValueError("eos_ids is empty: give the tokenizer's end-of-sequence id(s)")
    is_eos = torch.isin(token_ids, torch.tensor(eos, dtype=token_ids.dtype, device=token_ids.device))
    eos_before = (is_eos.long().cumsum(dim=-1) - is_eos.long()) > 0  # an eos strictly before t
    content = is_eos | (token_ids != pad_id)
    content_at_or_after = content.flip(-1).long().cumsum(dim=-1).flip(-1) > 0
    return (~eos_before & content_at_or_after).float()
