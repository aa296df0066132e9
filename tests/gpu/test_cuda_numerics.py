"""Numerics on a CUDA device that need torch and transformers only (marker ``gpu``; no vLLM, Ray or NCCL): the chunked
logprobs and entropy equal the unchunked computation in values and gradients in fp32 and bf16, and the trainer's
forward runs under bf16 autocast (the logits inside its autocast region are bf16 over fp32 parameters) for
``model.dtype=bfloat16``, and in fp32 without autocast for ``float32``. Skipped without CUDA.

``DEVICE`` is the only CUDA-specific line: pointed at ``cpu`` (and the skip removed) the same checks run on a CPU,
which is how they were checked where no GPU was at hand.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (pytest -m gpu tests/gpu on a GPU machine)"),
]

DEVICE = torch.device("cuda")
N, V = 300, 32000
"""Rows (response tokens) and vocabulary of the logits: a realistic vocabulary, several chunks."""


def _inputs(dtype: torch.dtype, seed: int = 0):
    """[N, V] logits on DEVICE (a few ``-inf``, never at a target), [N] targets, [N] upstream weights of lp and
    entropy (float64)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, V, generator=gen, dtype=torch.float64) * 3
    ids = torch.randint(0, V, (N,), generator=gen)
    x[1, (ids[1] + 1) % V] = -math.inf
    x[4, [(ids[4] + 2) % V, (ids[4] + 5) % V]] = -math.inf
    w_lp, w_ent = torch.randn(N, generator=gen, dtype=torch.float64), torch.randn(N, generator=gen, dtype=torch.float64)
    return x.to(dtype).to(DEVICE), ids.to(DEVICE), w_lp.to(DEVICE), w_ent.to(DEVICE)


def _plain(x: torch.Tensor, ids: torch.Tensor, temperature: float):
    """The unchunked computation in float64 autograd: log_softmax gathered at the targets, and logsumexp - sum of
    softmax x z (a ``-inf`` logit contributes 0)."""
    z = x.double() / temperature
    lp = torch.log_softmax(z, -1).gather(-1, ids[:, None]).squeeze(-1)
    p = torch.softmax(z, -1)
    ent = torch.logsumexp(z, -1) - (p * torch.where(torch.isfinite(z), z, torch.zeros_like(z))).sum(-1)
    return lp, ent


def _grads(fn, x, ids, w_lp, w_ent, temperature):
    """(lp [N], entropy [N], d(sum w_lp lp + sum w_ent ent)/dx [N, V] in x's dtype)."""
    x = x.detach().clone().requires_grad_(True)
    lp, ent = fn(x, ids, temperature)
    (g,) = torch.autograd.grad((lp.double() * w_lp).sum() + (ent.double() * w_ent).sum(), x)
    return lp.detach().double(), ent.detach().double(), g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [7, 64, None])  # None: the default, 256 MiB of fp32 rows (all 300 rows here)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_equal_the_unchunked_values_and_gradients(dtype, chunk, temperature):
    from rlvr.algos.logprobs import logprobs_and_entropy

    x, ids, w_lp, w_ent = _inputs(dtype)

    def chunked(x, ids, t):
        return logprobs_and_entropy(x, ids, t, need_entropy=True, entropy_grad=True, chunk_tokens=chunk)

    def one_chunk(x, ids, t):
        return logprobs_and_entropy(x, ids, t, need_entropy=True, entropy_grad=True, chunk_tokens=N)

    lp, ent, g = _grads(chunked, x, ids, w_lp, w_ent, temperature)
    lp1, ent1, g1 = _grads(one_chunk, x, ids, w_lp, w_ent, temperature)
    # the reference: float64 autograd on the same logits (bf16 ones widened exactly), the gradient in x's dtype
    lp_ref, ent_ref, g_ref = _grads(_plain, x, ids, w_lp, w_ent, temperature)
    assert g.dtype == dtype and g.device.type == DEVICE.type
    # fp32 maths within each chunk whatever the logits' dtype: values agree to fp32 rounding over V = 32000 terms
    assert torch.allclose(lp, lp_ref, atol=1e-4, rtol=0) and torch.allclose(ent, ent_ref, atol=1e-4, rtol=0)
    assert torch.allclose(lp, lp1, atol=1e-5, rtol=0) and torch.allclose(ent, ent1, atol=1e-5, rtol=0)
    assert torch.isfinite(g).all() and (g[x == -math.inf] == 0).all()  # a banned token gets no gradient
    if dtype == torch.float32:
        assert torch.allclose(g.double(), g_ref.double(), atol=1e-6, rtol=1e-4)
        # chunked and one-chunk agree to the same fp32 accuracy each has against float64, not bit for bit: CUDA picks
        # its reduction kernels by shape, so 7-row chunks round differently from 300 rows (H200, 2026-12-04: at chunk
        # 7, T = 0.7, max |g - g1| 1.55e-5 while each is within 8.3e-6 of the reference; 0 on CPU)
        assert torch.allclose(g, g1, atol=1e-6, rtol=1e-4)
    else:  # the gradient rounded to bf16 (8 bits of mantissa) at the end, as ``.float()``'s backward would
        assert torch.allclose(g.float(), g_ref.float(), atol=1e-2, rtol=1e-2)
        assert torch.allclose(g.float(), g1.float(), atol=1e-2, rtol=1e-2)


def _batch():
    """Four sequences of 4 prompt + 3 response tokens (tiny-random's vocabulary), advantages +-1, +-0.5."""
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    comps = [Completion(prompt_index=i // 2, sample_index=i % 2, prompt_ids=[1, 4, 41, 5], token_ids=[6, 7, 2],
                        logprobs=[-1.0, -2.0, -0.5], text="x", finish_reason="stop", policy_version=0)
             for i in range(4)]  # fmt: skip
    return pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, 8)


@pytest.mark.parametrize("dtype, logits", [("bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_the_trainers_forward_runs_under_the_recipes_autocast(tmp_path, dtype, logits):
    """A hook on the output layer sees, inside the trainer's forward region (compute_logprobs and train_step): the
    autocast state and the logits' dtype (bf16 under autocast for model.dtype=bfloat16; fp32 and no autocast for
    float32), on DEVICE, over fp32 parameters either way (the master weights)."""
    from pathlib import Path

    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.train.policy import PolicyWorker

    tiny = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"
    r = load_recipe(tiny, [f"run.output_dir={tmp_path}", "run.executor=local", f"model.dtype={dtype}",
                           "trainer.backend=torch", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
                           "trainer.micro_batch_size=2"])  # fmt: skip
    worker = PolicyWorker(r, resolve_model("tiny-random"), 0, 1, "127.0.0.1", 0)
    assert worker.device.type == DEVICE.type
    seen: list[tuple[torch.dtype, bool, torch.dtype, str]] = []

    def hook(module, inputs, output):
        seen.append((output.dtype, torch.is_autocast_enabled(DEVICE.type), module.weight.dtype, output.device.type))

    worker.module.get_output_embeddings().register_forward_hook(hook)
    b = _batch()
    worker.compute_logprobs(b)
    stats = worker.train_step(b)
    assert math.isfinite(stats["train/loss"])
    assert len(seen) >= 2  # both paths went through the hook
    autocast = dtype == "bfloat16"
    assert set(seen) == {(logits, autocast, torch.float32, DEVICE.type)}
