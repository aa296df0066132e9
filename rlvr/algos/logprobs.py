"""Token log-probabilities, entropies and masks computed the same way the sampler does (case R1).

Dimensions: B = sequences, T = response tokens (padded), V = vocabulary. ``logits[b, t]`` are the logits
that predicted ``token_ids[b, t]`` (already shifted by the caller: the model's output at the position
before the token). The sampling transform is ``log_softmax(logits / temperature)``, in float32 whatever the
logits' dtype (bf16 logprobs are off by ~0.1 nats). Only temperature is applied: the rollout engine must
report logprobs of the same transform (no top-p/top-k renormalisation, case R2).

Memory (issue 27): everything goes through :func:`logprobs_and_entropy`, a ``torch.autograd.Function`` that works
on ``chunk_tokens`` rows of the [N, V] logits at a time in float32 and keeps for backward only the logits themselves
(already alive: the output layer's result), the targets and two floats per row (the logsumexp and the entropy);
backward recomputes each chunk's softmax. So beside the logits at most one chunk's float32 work is alive (two
[chunk, V] tensors, with transients while a chunk is cast), in forward and backward alike, plus the [N, V] gradient
in the logits' dtype. The plain autograd version kept several [N, V] float32 tensors (the fp32 copies, the
log-softmax / softmax, the masked logits): at N = 4096 and V = 151936 each is 2.5 GB (benchmarks/logprob_memory.py).
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


CHUNK_BYTES = 256 * 2**20
"""Float32 bytes of one chunk's [rows, V] work in :func:`logprobs_and_entropy` when no ``chunk_tokens`` is given:
256 MiB, i.e. 441 rows for a 151936-token vocabulary (a few such tensors are alive within a chunk)."""


def default_chunk_tokens(vocab: int) -> int:
    """Rows per chunk for a ``vocab``-wide float32 block of :data:`CHUNK_BYTES` (at least 1)."""
    return max(1, CHUNK_BYTES // (4 * max(1, vocab)))


def _work_dtype(dtype):
    """float32, or float64 for float64 logits (gradcheck, exact references)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scaled(x: Tensor, temperature: float, fresh: bool = False) -> Tensor:
    """Logits [C, V] of one chunk -> float32 (float64 for float64) logits / temperature, as one new tensor (the
    logits themselves when they are float32 at temperature 1, unless ``fresh``: then a copy, safe to change)."""
    wd = _work_dtype(x.dtype)
    if x.dtype == wd:
        if temperature != 1.0:
            return x / temperature
        return x.clone() if fresh else x
    z = x.to(wd)
    return z if temperature == 1.0 else z.div_(temperature)


def _finite_(x: Tensor) -> Tensor:
    """``x`` with its non-finite entries (the ``-inf`` of banned tokens; NaN) set to 0, in place."""
    return x.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)


_FUNCTION = None


def _function():
    """The autograd Function, defined on first use (this module imports torch lazily)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION

    class ChunkedLogprobsEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, targets, temperature, chunk, need_lp, need_ent, ent_grad):
            n, like = logits.shape[0], dict(dtype=_work_dtype(logits.dtype), device=logits.device)
            lp = torch.empty(n if need_lp else 0, **like)
            ent = torch.empty(n if need_ent else 0, **like)
            lse_all = torch.empty(n, **like)
            for a in range(0, n, chunk):
                b = min(a + chunk, n)
                x = logits[a:b]
                z = _scaled(x, temperature)  # x itself (fp32 logits, T = 1) or a new tensor
                lse = torch.logsumexp(z, dim=-1)
                lse_all[a:b] = lse
                if need_lp:
                    lp[a:b] = z.gather(-1, targets[a:b, None]).squeeze(-1) - lse
                if need_ent:
                    # -sum p log p: no cancellation of two large terms as in lse - sum p z; at most two [C, V] alive
                    logp = z - lse[:, None] if z is x else z.sub_(lse[:, None])
                    del z
                    p = torch.exp(logp)
                    ent[a:b] = -p.mul_(_finite_(logp)).sum(dim=-1)
                    del logp, p
                else:
                    del z
                del x
            ctx.temperature, ctx.chunk, ctx.need_lp, ctx.ent_grad = temperature, chunk, need_lp, need_ent and ent_grad
            ctx.save_for_backward(logits, targets, lse_all, ent)
            if not ctx.ent_grad:
                ctx.mark_non_differentiable(ent)
            ctx.set_materialize_grads(False)
            return lp, ent

        @staticmethod
        def backward(ctx, g_lp, g_ent):
            logits, targets, lse_all, ent = ctx.saved_tensors
            if not ctx.need_lp:
                g_lp = None
            if not ctx.ent_grad:
                g_ent = None
            if g_lp is None and g_ent is None:
                return (None,) * 7
            t, n = ctx.temperature, logits.shape[0]
            grad = torch.empty_like(logits)
            for a in range(0, n, ctx.chunk):
                b = min(a + ctx.chunk, n)
                # in place where it can be: at most two [C, V] float32 tensors alive (log p and p), reused as dL/dz
                logp = _scaled(logits[a:b], t, fresh=True).sub_(lse_all[a:b, None])  # log softmax(z), recomputed
                p = torch.exp(logp)
                if g_ent is not None:
                    # H = -sum_v p_v log p_v, d log p_v / dz_j = [v = j] - p_j, sum_v p_v = 1
                    #   =>  dH/dz_j = -p_j log p_j - p_j + p_j sum_v p_v (log p_v + 1) = -p_j (log p_j + H)
                    gz = _finite_(logp).add_(ent[a:b, None]).mul_(p).mul_(-g_ent[a:b, None])  # logp's buffer
                    if g_lp is not None:
                        gz.addcmul_(p, g_lp[a:b, None], value=-1.0)
                else:
                    gz = p.mul_(-g_lp[a:b, None])  # p's buffer
                del logp, p
                if g_lp is not None:
                    # lp = z[target] - lse  =>  d lp / dz = onehot(target) - p
                    gz.scatter_add_(-1, targets[a:b, None], g_lp[a:b, None])
                if t != 1.0:
                    gz.div_(t)
                grad[a:b] = gz
                del gz
            return grad, None, None, None, None, None, None

    _FUNCTION = ChunkedLogprobsEntropy
    return _FUNCTION


def logprobs_and_entropy(
    logits: Tensor, targets: Tensor | None, temperature: float, need_entropy: bool = False, entropy_grad: bool = True,
    chunk_tokens: int | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """Per-row logprob of ``targets`` and entropy (nats) of ``softmax(logits / temperature)``, chunked over rows.

    logits: [N, V] (any float dtype, the output layer's result); targets: [N] integer ids, or None (no logprobs)
    -> (logprobs [N] float32 or None, entropy [N] float32 or None (``need_entropy`` False)); float64 logits
    give float64 results. The transform and the ``-inf`` handling are :func:`token_logprobs`'s and
    :func:`entropy_from_logits`'s (case R1: logits [2, 1, 0], temperature 0.5, token 0 -> -0.1429; a banned
    token gets no gradient). Works on ``chunk_tokens`` rows at a time (None:
    :func:`default_chunk_tokens`) in float32; backward recomputes each chunk's softmax and writes the gradient
    into a tensor of the logits' dtype, so beside the logits at most one chunk's float32 work is alive.
    ``entropy_grad`` False: the entropy carries no gradient (no graph), whatever the logprobs do.
    Errors: ``ValueError`` on bad shapes, out-of-vocabulary ids, temperature <= 0 or chunk_tokens < 1.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    n, vocab = logits.shape
    if targets is not None:
        if targets.shape != (n,):
            raise ValueError(f"targets {tuple(targets.shape)} must be [N] = ({n},)")
        if n and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
            raise ValueError(f"targets must lie in [0, V = {vocab})")
    chunk = default_chunk_tokens(vocab) if chunk_tokens is None else int(chunk_tokens)
    if chunk < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if targets is None and not need_entropy:
        return None, None
    ids = (targets if targets is not None else torch.zeros(n, dtype=torch.long, device=logits.device)).long()
    lp, ent = _function().apply(logits, ids, float(temperature), chunk, targets is not None, need_entropy,
                                entropy_grad)
    return (lp if targets is not None else None), (ent if need_entropy else None)


def _flat_blocks(logits: Tensor) -> list[Tensor]:
    """[B, T, V] -> 2-D [rows, V] blocks covering it in order, without copying: one view when the layout allows,
    else one block per sequence."""
    try:
        return [logits.view(-1, logits.shape[-1])]
    except RuntimeError:
        return list(logits.unbind(0))


def token_logprobs(logits: Tensor, token_ids: Tensor, temperature: float, chunk_tokens: int | None = None) -> Tensor:
    """``log_softmax(logits / temperature)[b, t, token_ids[b, t]]`` in nats.

    logits: [B, T, V] (any float dtype); token_ids: [B, T] integer -> [B, T] float32 (float64 for float64 logits).
    Computed as ``z[token] - logsumexp(z)`` in float32, ``chunk_tokens`` positions at a time
    (:func:`logprobs_and_entropy`), without materialising the [B, T, V] log-softmax, with or without grad.
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
    blocks = _flat_blocks(logits)
    ids = [token_ids.reshape(-1)] if len(blocks) == 1 else token_ids.unbind(0)
    out = [logprobs_and_entropy(x, i, temperature, chunk_tokens=chunk_tokens)[0] for x, i in zip(blocks, ids)]
    return torch.cat(out).view(token_ids.shape)


def entropy_from_logits(logits: Tensor, temperature: float, chunk_tokens: int | None = None) -> Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at each position.

    logits: [B, T, V] -> [B, T] float32, computed as ``-sum_v p_v log p_v`` with ``log p = z - logsumexp(z)``
    (= ``logsumexp(z) - sum_v p_v z_v``, without its cancellation); ``-inf`` logits (banned tokens) contribute 0.
    In float32, ``chunk_tokens`` positions at a time
    (:func:`logprobs_and_entropy`), differentiable when grad is enabled.
    Errors: ``ValueError`` on bad shapes or temperature <= 0.
    """
    _check(logits, temperature)
    if logits.shape[0] == 0:
        return logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
    out = [logprobs_and_entropy(x, None, temperature, need_entropy=True, chunk_tokens=chunk_tokens)[1]
           for x in _flat_blocks(logits)]
    return torch.cat(out).view(logits.shape[:-1])


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
