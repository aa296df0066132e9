"""Token-budget micro-batches (issue 40, ``trainer.max_tokens_per_micro_batch``): the split and the deal to ranks
by hand, and the whole update invariant to the split (rows or tokens, packed or padded) on the tiny model in fp32.
Data-parallel ranks (W = 1 vs 2 under DeepSpeed): tests/integration/test_data_parallel.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.train.packing import balanced_shares, micro_batches

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")


def test_micro_batches_by_hand():
    lengths = [10, 8, 5, 4, 3, 1]
    order = list(range(6))
    # budget 15, packed: [10] (a row of 10; a second row would be 20); [8] (8 + 5 > 8 and 2 x 8 > 15); then rows
    # of 5: [5], [4], [3] is 15 computed, and the 1 fits beside the 4
    assert micro_batches(order, lengths, 15, packed=True) == [[0], [1], [2, 3, 4, 5]]
    # padded: every sequence is a row of the longest: 4 x 5 = 20 > 15 leaves the 1 alone
    assert micro_batches(order, lengths, 15, packed=False) == [[0], [1], [2, 3, 4], [5]]
    # budget 20: two rows of 10 hold the 10 and the 8; packed, rows of 5: 5 | 4 1 | 3 (15)
    assert micro_batches(order, lengths, 20, packed=True) == [[0, 1], [2, 3, 4, 5]]
    # a sequence over the budget is a micro-batch of its own
    assert micro_batches([0, 1], [30, 2], 10, packed=True) == [[0], [1]]
    assert micro_batches([], [], 10, packed=True) == []
    # packed rows by hand: 6 | 3 3 fits the second row exactly (12 computed); 6 | 3 2, and the last 2 finds 1 left
    # (a third row would be 18 > 12); a 6 leaves its row no room for a 1; ties are longest first too
    assert micro_batches([0, 1, 2], [6, 3, 3], 12, packed=True) == [[0, 1, 2]]
    assert micro_batches([0, 1, 2, 3], [6, 3, 2, 2], 12, packed=True) == [[0, 1, 2], [3]]
    assert micro_batches([0, 1], [6, 1], 6, packed=True) == [[0], [1]]
    assert micro_batches([0, 1], [5, 5], 10, packed=True) == [[0, 1]]
    with pytest.raises(ValueError, match="positive number of tokens"):
        micro_batches(order, lengths, 0, packed=True)
    with pytest.raises(ValueError, match="longest first"):
        micro_batches([5, 0], lengths, 10, packed=True)


def test_balanced_shares_by_hand():
    # longest first to the rank with the fewest tokens: 10 -> r0, 8 -> r1, 5 -> r1 (13), 4 -> r0 (14),
    # 3 -> r1 (16), 1 -> r0 (15)
    assert balanced_shares(list(range(6)), [10, 8, 5, 4, 3, 1], 2) == [[0, 3, 5], [1, 2, 4]]
    assert balanced_shares([2, 0, 1], [1, 1, 1], 3) == [[0], [1], [2]]  # ties: by index, the lowest rank
    assert balanced_shares([0], [7], 2) == [[0], []]


PROMPTS = [[1, 4, 41, 5], [1, 4, 42, 43, 44, 5]]
RESPONSES = [[6], [7, 8], [9, 10, 11, 12, 13], [14] * 9, [15, 16] * 8 + [17], [18] * 30, [19, 20, 2], [21] * 12]


def _batch():
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    comps = [Completion(prompt_index=i % 2, sample_index=i // 2, prompt_ids=PROMPTS[i % 2], token_ids=r,
                        logprobs=[-1.0 - 0.1 * j for j in range(len(r))], text="x", finish_reason="length",
                        policy_version=0) for i, r in enumerate(RESPONSES)]  # fmt: skip
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.25, -0.25, 2.0, -2.0])
    return pack(comps, adv, 0, 32)


def _step(*overrides: str):
    """Two epochs (old logprobs recomputed: the no-grad path splits too) on one mini-batch of 8; the weights after,
    the metrics, and how many training forwards ran."""
    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.train.policy import PolicyWorker

    r = load_recipe(TINY, ["run.executor=local", "model.dtype=float32", "rollout.prompts_per_step=2",
                           "rollout.samples_per_prompt=4", "trainer.backend=torch", "trainer.lr=1e-3",
                           "algorithm.ppo_epochs=2", *overrides])  # fmt: skip
    w = PolicyWorker(r, resolve_model("tiny-random"), 0, 1, "127.0.0.1", 0)
    calls = []
    forward = w._forward
    w._forward = lambda model, mb, need_entropy, **kw: (calls.append((len(mb), need_entropy)), forward(model, mb, need_entropy, **kw))[1]
    stats = w.train_step(_batch())
    weights = {n: p.detach().clone() for n, p in w.module.named_parameters()}
    return weights, stats, sum(1 for _, grad in calls if grad), w.packing


@pytest.fixture(scope="module")
def reference():
    return _step("trainer.packing=false", "trainer.micro_batch_size=8")


@pytest.mark.parametrize(("overrides", "forwards"), [
    (("trainer.packing=false", "trainer.micro_batch_size=1"), 2 * 8),
    (("trainer.packing=true", "trainer.micro_batch_size=4"), 2 * 2),
    (("trainer.packing=true", "trainer.max_tokens_per_micro_batch=60"), None),
    (("trainer.packing=false", "trainer.max_tokens_per_micro_batch=60"), None),
    (("trainer.packing=true", "trainer.max_tokens_per_micro_batch=1"), 2 * 8),  # each sequence alone
])  # fmt: skip
def test_the_update_is_the_same_whatever_the_split(reference, overrides, forwards):
    w0, s0, f0, packed0 = reference
    w1, s1, f1, packed1 = _step(*overrides)
    assert f0 == 2 and not packed0 and packed1 == ("trainer.packing=true" in overrides)
    if forwards is not None:
        assert f1 == forwards
    else:  # 60 tokens: lengths 36, 21, 17, 16, 13, 9, 7 and 5 fill more than one micro-batch, fewer than 8
        assert 2 * 2 <= f1 <= 2 * 6
    for k in ("train/loss", "train/grad_norm", "train/entropy", "train/rollout_gap_abs"):
        assert s1[k] == pytest.approx(s0[k], rel=2e-5, abs=1e-7), k
    # prompts 4 and 6 tokens (4 each), responses 1+2+5+9+17+30+3+12 = 79: 119 tokens, two epochs
    assert s0["train/tokens"] == s1["train/tokens"] == 2 * 119
    # within 1% of one step (lr 1e-3): measured 4.5e-6 and 4.9e-6 at most, in 1-2 of 341,120 weights, where the
    # gradient is near 0 and Adam's m / sqrt(v) magnifies fp32 rounding of other summation orders
    for n in w0:
        assert torch.allclose(w1[n], w0[n], atol=1e-5, rtol=0), n
    moved = sum(int((w0[n] != _start()[n]).sum()) for n in w0)
    assert moved > 0  # the step changed the weights


_START: dict = {}


def _start():
    if not _START:
        from transformers import AutoModelForCausalLM

        from rlvr.models import resolve_model

        m = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random"), dtype=torch.float32)
        _START.update({n: p.detach().clone() for n, p in m.named_parameters()})
    return _START


def test_a_negative_budget_is_refused():
    from rlvr.recipe import RecipeError, load_recipe

    with pytest.raises(RecipeError, match="max_tokens_per_micro_batch must be >= 0"):
        load_recipe(TINY, ["trainer.max_tokens_per_micro_batch=-1"])


def _critic_step(*overrides: str):
    """The critic's values of the batch, then one train_step (two epochs, one mini-batch of 8) on fixed returns:
    the values, the weights after, the metrics and how many forwards the update ran."""
    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.train.critic import CriticWorker

    r = load_recipe(TINY, ["run.executor=local", "model.dtype=float32", "rollout.prompts_per_step=2",
                           "rollout.samples_per_prompt=4", "critic.lr=1e-3", "algorithm.ppo_epochs=2", *overrides])
    w = CriticWorker(r, resolve_model("tiny-random"))
    batch = _batch()
    values = w.compute_values(batch)
    returns = torch.linspace(-1.0, 1.0, values.numel()).reshape(values.shape) * batch.loss_mask
    calls = []
    forward = w.model.forward
    w.model.forward = lambda ids, mask: (calls.append(len(ids)), forward(ids, mask))[1]
    stats = w.train_step(batch, values, returns)
    return values, {n: p.detach().clone() for n, p in w.model.named_parameters()}, stats, calls


def test_the_critic_follows_the_token_budget():
    v0, w0, s0, c0 = _critic_step("trainer.packing=false", "critic.micro_batch_size=8")
    v1, w1, s1, c1 = _critic_step("trainer.packing=true", "trainer.max_tokens_per_micro_batch=60")
    assert c0 == [8, 8]  # one micro-batch of all 8 a step, two epochs
    assert 2 * 2 <= len(c1) <= 2 * 6 and sum(c1) == 16  # lengths 36, 21, 17, 16, 13, 9, 7, 5 in 60-token parts
    assert torch.allclose(v1, v0, atol=1e-6, rtol=0)
    for k in ("critic/value_loss", "critic/value_mse", "critic/grad_norm"):
        assert s1[k] == pytest.approx(s0[k], rel=2e-5), k
    for n in w0:
        assert torch.allclose(w1[n], w0[n], atol=1e-5, rtol=0), n
