"""Chunked logprobs and entropy (issue 27): :func:`rlvr.algos.logprobs.logprobs_and_entropy` equals the plain
unchunked autograd computation in values and gradients (fp32 and float64, chunk sizes 1, 3, N and > N,
temperatures 1 and 0.7, ``-inf`` logits, entropy with and without grad, bf16 logits), case R1 by hand, gradcheck
in float64, and it keeps no [N, V] tensor for backward beyond the logits themselves."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algos.logprobs import entropy_from_logits, logprobs_and_entropy, token_logprobs

N, V = 7, 11


def _inputs(dtype, seed=0, banned=True):
    """[N, V] logits (a few ``-inf``, never at a target), [N] targets, [N] upstream weights for lp and entropy."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, V, generator=gen, dtype=torch.float64) * 3
    ids = torch.randint(0, V, (N,), generator=gen)
    if banned:
        x[1, (ids[1] + 1) % V] = -math.inf
        x[4, [(ids[4] + 2) % V, (ids[4] + 5) % V]] = -math.inf
    w_lp = torch.randn(N, generator=gen, dtype=torch.float64)
    w_ent = torch.randn(N, generator=gen, dtype=torch.float64)
    return x.to(dtype), ids, w_lp, w_ent


def _plain(x, ids, temperature):
    """Today's unchunked path in float64 autograd: log_softmax gather, and logsumexp - sum softmax * z."""
    z = x.double() / temperature
    lp = torch.log_softmax(z, -1).gather(-1, ids[:, None]).squeeze(-1)
    p = torch.softmax(z, -1)
    ent = torch.logsumexp(z, -1) - (p * torch.where(torch.isfinite(z), z, torch.zeros_like(z))).sum(-1)
    return lp, ent


def _grads(fn, x, ids, w_lp, w_ent, temperature, with_lp=True, with_ent=True):
    x = x.detach().clone().requires_grad_(True)
    lp, ent = fn(x, ids, temperature)
    loss = 0
    if with_lp:
        loss = loss + (lp.double() * w_lp).sum()
    if with_ent:
        loss = loss + (ent.double() * w_ent).sum()
    (g,) = torch.autograd.grad(loss, x)
    return lp.detach(), ent.detach(), g


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("chunk", [1, 3, N, N + 5])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("terms", ["both", "lp", "ent"])
def test_values_and_gradients_equal_the_plain_computation(dtype, tol, chunk, temperature, terms):
    x, ids, w_lp, w_ent = _inputs(dtype)
    with_lp, with_ent = terms in ("both", "lp"), terms in ("both", "ent")

    def chunked(x, ids, t):
        return logprobs_and_entropy(x, ids, t, need_entropy=True, entropy_grad=True, chunk_tokens=chunk)

    lp, ent, g = _grads(chunked, x, ids, w_lp, w_ent, temperature, with_lp, with_ent)
    lp_ref, ent_ref, g_ref = _grads(_plain, x, ids, w_lp, w_ent, temperature, with_lp, with_ent)
    assert lp.dtype == ent.dtype == (torch.float64 if dtype == torch.float64 else torch.float32) and g.dtype == dtype
    assert torch.allclose(lp.double(), lp_ref, atol=tol, rtol=0)
    assert torch.allclose(ent.double(), ent_ref, atol=tol, rtol=0)
    assert torch.isfinite(g).all()
    assert torch.allclose(g.double(), g_ref.double(), atol=tol, rtol=0)
    assert (g[x == -math.inf] == 0).all()  # a banned token gets no gradient


@pytest.mark.parametrize("chunk", [1, 3, N + 5])
def test_entropy_without_grad_keeps_no_graph(chunk):
    x, ids, w_lp, _ = _inputs(torch.float32)
    xg = x.clone().requires_grad_(True)
    lp, ent = logprobs_and_entropy(xg, ids, 0.7, need_entropy=True, entropy_grad=False, chunk_tokens=chunk)
    assert lp.requires_grad and not ent.requires_grad and ent.grad_fn is None
    (g,) = torch.autograd.grad((lp.double() * w_lp).sum(), xg)
    lp_ref, ent_ref, g_ref = _grads(_plain, x, ids, w_lp, None, 0.7, with_ent=False)
    assert torch.allclose(ent.double(), ent_ref, atol=1e-5) and torch.allclose(g.double(), g_ref.double(), atol=1e-5)
    # entropy only, no targets, no grad: nothing differentiable comes back
    lp2, ent2 = logprobs_and_entropy(xg, None, 0.7, need_entropy=True, entropy_grad=False, chunk_tokens=chunk)
    assert lp2 is None and not ent2.requires_grad and torch.equal(ent2, ent)
    with torch.no_grad():
        lp3, ent3 = logprobs_and_entropy(xg, ids, 0.7, need_entropy=True, chunk_tokens=chunk)
    assert lp3.grad_fn is None and ent3.grad_fn is None and torch.equal(lp3, lp.detach())


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_logits_get_a_bf16_gradient(chunk, temperature):
    """As in the trainer under autocast: bf16 logits, fp32 maths, the gradient back in bf16 like ``.float()``'s."""
    x, ids, w_lp, w_ent = _inputs(torch.bfloat16, seed=3)
    xb = x.clone().requires_grad_(True)
    lp, ent = logprobs_and_entropy(xb, ids, temperature, need_entropy=True, chunk_tokens=chunk)
    ((lp.double() * w_lp).sum() + (ent.double() * w_ent).sum()).backward()
    xr = x.clone().requires_grad_(True)  # today's path: an fp32 copy with autograd
    lp_r, ent_r = _plain(xr.float(), ids, temperature)
    ((lp_r * w_lp).sum() + (ent_r * w_ent).sum()).backward()
    assert xb.grad.dtype == torch.bfloat16
    assert torch.allclose(lp.double(), lp_r, atol=1e-5) and torch.allclose(ent.double(), ent_r, atol=1e-5)
    # the two differ only by the final rounding to bf16 (8 bits of mantissa)
    assert torch.allclose(xb.grad.float(), xr.grad.float(), atol=1e-2, rtol=1e-2)


def test_case_r1_by_hand():
    # logits [2, 1, 0], temperature 0.5, token 0: z = [4, 2, 0], lp = 4 - log(e^4 + e^2 + 1) = -0.1429
    x = torch.tensor([[2.0, 1.0, 0.0]], requires_grad=True)
    lp, ent = logprobs_and_entropy(x, torch.tensor([0]), 0.5, need_entropy=True)
    assert lp.item() == pytest.approx(-0.1429, abs=1e-4)
    assert lp.item() == pytest.approx(4 - math.log(math.e**4 + math.e**2 + 1), abs=1e-6)
    e = [math.exp(v) for v in (4.0, 2.0, 0.0)]
    p = [v / sum(e) for v in e]
    assert ent.item() == pytest.approx(-sum(q * math.log(q) for q in p), abs=1e-6)
    lp.sum().backward()
    # d lp / d x = (onehot(0) - p) / T
    assert x.grad[0].tolist() == pytest.approx([(1 - p[0]) / 0.5, -p[1] / 0.5, -p[2] / 0.5], abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_gradcheck_float64(temperature, chunk):
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 5, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    ids = torch.tensor([0, 4, 2, 2])

    def both(x):
        return logprobs_and_entropy(x, ids, temperature, need_entropy=True, chunk_tokens=chunk)

    def lp_only(x):
        return logprobs_and_entropy(x, ids, temperature, chunk_tokens=chunk)[0]

    def ent_only(x):
        return logprobs_and_entropy(x, None, temperature, need_entropy=True, chunk_tokens=chunk)[1]

    for fn in (both, lp_only, ent_only):
        assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-8)


def test_target_at_minus_inf_and_wrappers_match():
    x = torch.tensor([[0.0, -math.inf, 1.0]])
    assert logprobs_and_entropy(x, torch.tensor([1]), 1.0)[0].item() == -math.inf
    # the [B, T, V] wrappers, on a non-contiguous slice too (one block per sequence), equal the [N, V] function
    x3, ids, _, _ = _inputs(torch.float32)
    x3 = torch.cat([x3, x3.flip(0)]).view(2, N, V)[:, :-1]
    ids3 = torch.stack([ids, ids.flip(0)])[:, :-1]
    lp_ref, ent_ref = _plain(x3.reshape(-1, V), ids3.reshape(-1), 0.7)
    for chunk in (None, 1, 4):
        assert torch.allclose(token_logprobs(x3, ids3, 0.7, chunk_tokens=chunk).double().view(-1), lp_ref, atol=1e-5)
        assert torch.allclose(entropy_from_logits(x3, 0.7, chunk_tokens=chunk).double().view(-1), ent_ref, atol=1e-5)


def test_errors():
    x = torch.zeros(3, 4)
    with pytest.raises(ValueError):
        logprobs_and_entropy(x[None], torch.zeros(3, dtype=torch.long), 1.0)
    with pytest.raises(ValueError):
        logprobs_and_entropy(x, torch.zeros(2, dtype=torch.long), 1.0)
    with pytest.raises(ValueError):
        logprobs_and_entropy(x, torch.full((3,), 4), 1.0)
    with pytest.raises(ValueError):
        logprobs_and_entropy(x, torch.zeros(3, dtype=torch.long), 0.0)
    with pytest.raises(ValueError):
        logprobs_and_entropy(x, torch.zeros(3, dtype=torch.long), 1.0, chunk_tokens=0)


def test_saves_only_the_logits_and_per_row_values():
    """What autograd keeps for backward: the logits (alive anyway) and [N]-sized tensors, no [N, V] float32 copy,
    log-softmax or softmax (the plain path keeps several)."""
    x = torch.randn(64, 100, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, 100, (64,))

    def saved(fn):
        kept = []

        def pack(t):
            kept.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return [t for t in kept if t.numel() >= x.numel() and t.data_ptr() != x.data_ptr()]

    big = saved(lambda: logprobs_and_entropy(x, ids, 0.7, need_entropy=True, chunk_tokens=8))
    assert big == []
    plain = saved(lambda: _plain(x.float(), ids, 0.7))
    assert len(plain) >= 3  # the check can see them


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logits_left_unchanged(dtype, temperature):
    """The in-place work of each chunk never writes into the caller's logits (fp32 at T = 1 is worked on directly)."""
    x, ids, _, _ = _inputs(dtype)
    before = x.clone()
    xg = x.requires_grad_(True)
    lp, ent = logprobs_and_entropy(xg, ids, temperature, need_entropy=True, chunk_tokens=3)
    (lp.sum() + ent.sum()).backward()
    assert torch.equal(xg.detach(), before)


def test_no_tokens():
    """A micro-batch without response tokens: empty results and an empty gradient of the logits' dtype."""
    x = torch.zeros(0, 5, dtype=torch.bfloat16, requires_grad=True)
    lp, ent = logprobs_and_entropy(x, torch.zeros(0, dtype=torch.long), 0.7, need_entropy=True)
    (lp.sum() + ent.sum()).backward()
    assert lp.shape == ent.shape == (0,) and x.grad.shape == (0, 5) and x.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("amp", [None, torch.bfloat16])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_policy_forward_equals_the_plain_path(amp, entropy_grad):
    """PolicyWorker._forward on a tiny random llama (the lean head): logprobs, entropy and the parameters' gradient
    of a loss on both equal the plain path on the same logits (fp32 copy, log_softmax, softmax entropy); the
    entropy has no graph without ``entropy_grad``. Under bf16 autocast the logits are bf16, as on bf16 machines."""
    import types

    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr.train.batch import TrainBatch
    from rlvr.train.policy import PolicyWorker

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                               max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.5)
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    am[1, 6:] = 0
    loss_mask = torch.zeros(2, 8)
    loss_mask[0, 3:8] = 1.0
    loss_mask[1, 2:5] = 1.0
    mb = TrainBatch(input_ids=ids, attention_mask=am, loss_mask=loss_mask, rollout_logprobs=torch.zeros(2, 8),
                    advantages=torch.zeros(2), max_new_tokens=8)
    cast = (lambda: torch.autocast("cpu", dtype=amp)) if amp else (lambda: torch.autocast("cpu", enabled=False))
    worker = types.SimpleNamespace(device=torch.device("cpu"), temperature=0.7, ds=False, _autocast=cast, packing=False)
    w = torch.randn(2, 8, generator=torch.Generator().manual_seed(1)) * loss_mask

    def loss_of(lp, ent):
        return (lp * w).sum() + ((ent * w.flip(0)).sum() if ent.requires_grad else 0.0)

    model.zero_grad()
    lp, ent = PolicyWorker._forward(worker, model, mb, need_entropy=True, entropy_grad=entropy_grad)
    assert lp.requires_grad and ent.requires_grad == entropy_grad and (entropy_grad or ent.grad_fn is None)
    loss_of(lp, ent).backward()
    ours = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    with cast():
        hidden = model.model(input_ids=ids, attention_mask=am).last_hidden_state[:, :-1]
        logits = model.lm_head(hidden[loss_mask.bool()])  # [N, V]
    assert logits.dtype == (amp or torch.float32)
    z = logits.float() / 0.7
    lp_ref = torch.zeros(2, 8).masked_scatter(
        loss_mask.bool(), torch.log_softmax(z, -1).gather(-1, ids[:, 1:][loss_mask.bool()][:, None]).squeeze(-1))
    zc = z if entropy_grad else z.detach()
    ent_flat = torch.logsumexp(zc, -1) - (torch.softmax(zc, -1) * zc).sum(-1)
    ent_ref = torch.zeros(2, 8).masked_scatter(loss_mask.bool(), ent_flat)
    loss_of(lp_ref, ent_ref).backward()
    tol = 1e-5 if amp is None else 2e-2
    assert torch.allclose(lp, lp_ref, atol=1e-5) and torch.allclose(ent, ent_ref, atol=1e-4)
    for g, p in zip(ours, model.parameters()):
        assert torch.allclose(g, p.grad, atol=tol, rtol=tol)
