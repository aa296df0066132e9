"""The trainer rank of ``rlvr serve`` (:class:`rlvr.serve.trainer.ServeTrainer`), in this process on ``tiny-random``
(torch backend, LoRA rank 4 with its B made non-zero so that every weight has a gradient, float32).

- the datums packed end to end give the logprobs of each datum alone (packing confines attention), and the same
  gradient as a forward of each datum alone;
- the output layer run with gradient on the trained positions only (:func:`trained_positions`) gives the same
  logprobs on every position and the same gradient as running it with gradient everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlvr.models import resolve_model
from rlvr.recipe import load_recipe
from rlvr.serve.trainer import ServeTrainer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def trainer():
    r = load_recipe(None, ["model.path=tiny-random", "model.dtype=float32", "trainer.lora.rank=4", "run.executor=local",
                           "rollout.samples_per_prompt=2", "trainer.micro_batch_size=8"])
    t = ServeTrainer(r, resolve_model("tiny-random"), 0, 1)
    t.setup("127.0.0.1", 0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B = 0 at the start: give the adapters weight, so every parameter gets a gradient
        for n, p in t.module.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return t


def _data(lengths: list[int]) -> list[tuple[list[int], dict[str, np.ndarray]]]:
    rng = np.random.default_rng(1)
    out = []
    for n in lengths:
        toks = rng.integers(4, 50, size=n).tolist()
        w = np.zeros(n, dtype=np.float32)
        w[n // 2 :] = rng.uniform(0.5, 1.5, size=n - n // 2)  # the first half: "prompt" positions, weight 0
        out.append((toks, {"target_tokens": rng.integers(4, 50, size=n).astype(np.int64), "weights": w}))
    return out


def _grads(t: ServeTrainer, lps: list[torch.Tensor], data) -> dict[str, torch.Tensor]:
    t.module.zero_grad(set_to_none=True)
    loss = -sum((lp * torch.tensor(inp["weights"])).sum() for lp, (_, inp) in zip(lps, data))
    loss.backward()
    return {n: p.grad.clone() for n, p in t.module.named_parameters() if p.grad is not None}


def test_packed_datums_give_each_datum_alone(trainer):
    data = _data([9, 4, 13])
    assert trainer.packing  # tiny-random runs sdpa: packed
    together = trainer._datum_logprobs(data, grad=True)
    g_together = _grads(trainer, together, data)
    alone = [trainer._datum_logprobs([d], grad=True)[0] for d in data]
    g_alone = _grads(trainer, alone, data)
    for a, b in zip(together, alone):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert g_together.keys() == g_alone.keys() and len(g_alone) > 0
    for n in g_alone:
        torch.testing.assert_close(g_together[n], g_alone[n], atol=1e-5, rtol=1e-4)


def test_the_output_layer_with_gradient_on_trained_positions_only(trainer):
    from rlvr.algos.tinker_losses import trained_positions

    data = _data([7, 12, 5])
    trained = torch.cat([trained_positions("cross_entropy", {k: torch.tensor(v) for k, v in inp.items()})
                         for _, inp in data])  # fmt: skip
    assert 0 < int(trained.sum()) < len(trained)
    full = trainer._datum_logprobs(data, grad=True)
    g_full = _grads(trainer, full, data)
    split = trainer._datum_logprobs(data, grad=True, trained=trained)
    g_split = _grads(trainer, split, data)
    for a, b in zip(full, split):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)  # every position's logprob, trained or not
    for n in g_full:
        torch.testing.assert_close(g_split[n], g_full[n], atol=1e-6, rtol=1e-5)
    # the untrained rows carry no gradient: their logprobs' sum has none to give to any parameter
    lp = torch.cat(trainer._datum_logprobs(data, grad=True, trained=trained))
    params = [p for p in trainer.module.parameters() if p.requires_grad]
    got = torch.autograd.grad(lp[~trained].sum(), params, allow_unused=True, retain_graph=True)
    assert all(g is None or float(g.abs().max()) == 0.0 for g in got)
    got = torch.autograd.grad(lp[trained].sum(), params, allow_unused=True)
    assert any(g is not None and float(g.abs().max()) > 0.0 for g in got)
