"""Token logprobs, entropy, masked mean and the response mask (cases R1, R3)."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algos import entropy_from_logits, masked_mean, response_mask, token_logprobs


def test_case_r1_temperature_applied():
    logits = torch.tensor([[[2.0, 1.0, 0.0]]])
    ids = torch.tensor([[0]])
    assert token_logprobs(logits, ids, 0.5).item() == pytest.approx(-0.1429, abs=1e-4)
    assert token_logprobs(logits, ids, 1.0).item() == pytest.approx(-0.4076, abs=1e-4)
    # by hand: 4 - log(e^4 + e^2 + 1)
    assert token_logprobs(logits, ids, 0.5).item() == pytest.approx(4 - math.log(math.e**4 + math.e**2 + 1), abs=1e-6)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_matches_log_softmax_and_gradients(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 11, generator=gen) * 4).requires_grad_(True)
    ids = torch.randint(0, 11, (3, 5), generator=gen)
    ours = token_logprobs(logits, ids, temperature)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    ref = torch.log_softmax(logits.double() / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    assert ours.dtype == torch.float32
    assert torch.allclose(ours.double(), ref, atol=1e-5)
    assert torch.allclose(g_ours, g_ref.float(), atol=1e-5)


def test_bf16_logits_computed_in_fp32():
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 4, 50, generator=gen) * 5).bfloat16()
    ids = torch.randint(0, 50, (2, 4), generator=gen)
    ours = token_logprobs(logits, ids, 1.0)
    ref = torch.log_softmax(logits.double(), -1).gather(-1, ids[..., None]).squeeze(-1)
    assert ours.dtype == torch.float32 and torch.allclose(ours.double(), ref, atol=1e-5)


def test_token_logprobs_errors():
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long), 1.0)
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(1, 2, 3), torch.full((1, 2), 3), 1.0)
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), 0.0)


def test_entropy_by_hand():
    # uniform over 4 -> log 4; one-hot-ish with a banned (-inf) token -> entropy of the rest
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -math.inf, -math.inf]]])
    h = entropy_from_logits(logits, 1.0)
    assert torch.allclose(h, torch.tensor([[math.log(4), math.log(2)]]), atol=1e-6)
    # logits [2, 1, 0] at temperature 0.5 -> probabilities softmax([4, 2, 0])
    p = torch.softmax(torch.tensor([4.0, 2.0, 0.0], dtype=torch.float64), -1)
    expected = -(p * p.log()).sum().item()
    assert entropy_from_logits(torch.tensor([[[2.0, 1.0, 0.0]]]), 0.5).item() == pytest.approx(expected, abs=1e-6)


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(7 / 3)
    assert torch.allclose(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 4.0]))
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


def test_case_r3_multiple_eos_ids():
    pad = 0
    ids = torch.tensor([[11, 12, 32007, pad, pad], [11, 32001, 32000, 5, pad], [1, 2, 3, 4, pad]])
    mask = response_mask(ids, [32007, 32001, 32000], pad)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]


def test_case_r3_pad_equals_eos():
    ids = torch.tensor([[5, 6, 7, 7, 7], [7, 7, 7, 7, 7], [5, 6, 8, 9, 1]])
    assert response_mask(ids, 7, 7).tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_response_mask_interior_pad_kept_when_truncated():
    # pad id generated mid-response (no eos): only the trailing pad run is masked
    ids = torch.tensor([[3, 0, 4, 0, 0]])
    assert response_mask(ids, [9], 0).tolist() == [[1, 1, 1, 0, 0]]
    with pytest.raises(ValueError):
        response_mask(ids, [], 0)
