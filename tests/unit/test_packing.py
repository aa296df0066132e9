"""Packed micro-batches (issue 40, rlvr.train.packing): the layout by hand, and the policy's and the critic's
forward packed equal to the padded per-row forward on a tiny random llama in fp32, values and gradients.

Why a tolerance and not bit-exactness: packed, the same tokens go through matrix products of other shapes (one row
of 540 tokens instead of 4 rows of 500) and the attention softmax runs over a block-diagonal mask instead of a
padding mask, so fp32 sums are taken in another order; the differences are rounding (~1e-6 relative), while a
sequence that attends across its boundary, or a position that does not restart, moves logprobs by ~1e-1 here.
"""

from __future__ import annotations

import logging
import types

import pytest
import torch

from rlvr.train.batch import TrainBatch
from rlvr.train.packing import first_fit_rows, forward_inputs, packing_honoured, resolve_packing, sequence_lengths

LENGTHS = (1, 2, 37, 500)  # the batch: a one-token sequence, a two-token one, a short and a long one


def _tiny_llama(attn: str = "sdpa", seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model("llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                               max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return model


def _batch(lengths=LENGTHS, seed=0) -> TrainBatch:
    """Right-padded rows of ``lengths`` tokens; the loss mask covers each row's targets from token n // 2 on (a
    2-token row: its second token), with a gap of two environment tokens (masked, as a multi-turn trajectory's
    observation) in rows of 6 tokens or more."""
    gen = torch.Generator().manual_seed(seed)
    b, s = len(lengths), max(lengths)
    ids = torch.zeros(b, s, dtype=torch.long)
    am = torch.zeros(b, s, dtype=torch.long)
    lm = torch.zeros(b, s - 1)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, 64, (n,), generator=gen)
        am[i, :n] = 1
        lm[i, max(n // 2 - 1, 0) : n - 1] = 1.0  # targets ids[i, n // 2 : n]
        if n >= 6:
            lm[i, n // 2 + 1 : n // 2 + 3] = 0.0  # environment tokens: inputs, not targets
    return TrainBatch(input_ids=ids, attention_mask=am, loss_mask=lm, rollout_logprobs=torch.zeros(b, s - 1),
                      advantages=torch.zeros(b), max_new_tokens=s)


def _worker(packing: bool):
    return types.SimpleNamespace(device=torch.device("cpu"), temperature=0.7, ds=False, packing=packing,
                                 _autocast=lambda: torch.autocast("cpu", enabled=False))


def _forward_and_grads(model, mb, packing):
    from rlvr.train.policy import PolicyWorker

    model.zero_grad()
    lp, ent = PolicyWorker._forward(_worker(packing), model, mb, need_entropy=True, entropy_grad=True)
    w = torch.randn(lp.shape, generator=torch.Generator().manual_seed(3)) * mb.loss_mask
    ((lp * w).sum() + (ent * w.flip(0)).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads


# -- the layout, by hand ---------------------------------------------------------------------------------------------
def test_the_layout_by_hand():
    """Lengths 3, 1, 2 (S = 3): rows of C = 3 tokens, first-fit decreasing: [seq 0], [seq 2, seq 1]; positions
    restart at each sequence; index[i, t] = where row i's token t + 1 is predicted in the flattened [2 * 3]."""
    ids = torch.tensor([[11, 12, 13], [21, 0, 0], [31, 32, 0]])
    am = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    got = forward_inputs(ids, am, packed=True, pad_id=0)
    assert got.kwargs["input_ids"].tolist() == [[11, 12, 13], [31, 32, 21]]
    assert got.kwargs["position_ids"].tolist() == [[0, 1, 2], [0, 1, 0]]
    assert "attention_mask" not in got.kwargs  # transformers reads packing only without one
    assert got.index.tolist() == [[0, 1], [-1, -1], [3, -1]]
    assert (got.tokens, got.computed, got.padding_frac) == (6, 6, 0.0)
    # padded: the row-major place of each shifted position, and 3 of 9 positions padding
    pad = forward_inputs(ids, am, packed=False)
    assert pad.index.tolist() == [[0, 1], [3, 4], [6, 7]] and pad.kwargs["attention_mask"] is am
    assert pad.padding_frac == pytest.approx(1 / 3)


def test_a_row_tail_is_a_segment_of_its_own():
    """Lengths 5, 3, 2, 4 (S = 5): rows of 5: [5], [4], [3, 2] (no longer rows compute less); the 4's row has a
    one-token tail that restarts at 0, so no real token's segment runs into padding."""
    ids = torch.arange(1, 21).reshape(4, 5)
    am = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    got = forward_inputs(ids, am, packed=True)
    assert got.kwargs["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 0], [0, 1, 2, 0, 1]]
    assert got.kwargs["input_ids"][1].tolist() == [16, 17, 18, 19, 0]
    assert got.kwargs["input_ids"][2].tolist() == [6, 7, 8, 11, 12]
    assert (got.tokens, got.computed) == (14, 15)


def test_one_sequence_a_row_is_the_padded_batch():
    """Lengths 4, 3, 3 (S = 4): nothing pairs up in rows of 4, and longer rows compute more (8 + 4 or 12 for 10
    tokens against 12): the packed inputs are the padded batch itself."""
    ids = torch.arange(1, 13).reshape(3, 4)
    am = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]])
    got = forward_inputs(ids, am, packed=True)
    assert set(got.kwargs) == {"input_ids", "attention_mask"} and got.kwargs["input_ids"] is ids
    assert got.index.tolist() == forward_inputs(ids, am, packed=False).index.tolist()


def test_rows_grow_to_a_multiple_of_the_longest_while_padding_is_over_5_percent():
    from rlvr.train.packing import row_layout

    # 10, 6, 6, 6 (28 tokens): rows of 10 hold one each (40 computed, 30% padding); of 20: 10+6 | 6+6 (40 again, not
    # less); of 30: all four in one row (30, 6.7%), the least; of 40: one row of 40 (more)
    assert row_layout([10, 6, 6, 6]) == (30, [[0, 1, 2, 3]])
    # 8, 4, 4: rows of 8 are full ([8], [4, 4]): no longer rows tried
    assert row_layout([8, 4, 4]) == (8, [[0], [1, 2]])
    # 9, 5, 5, 5, 5 (29): rows of 9: 45 (36%); of 18: 9+5 | 5+5+5 = 36 (19%); of 27: 9+5+5+5 | 5 = 54; of 36:
    # one row of 36 (19%, not less than 36): the rows of 18
    assert row_layout([9, 5, 5, 5, 5]) == (18, [[0, 1], [2, 3, 4]])
    # 18 x 20, then 19, 11, 10 (400 tokens): rows of 20 leave 19 | 11 | 10 apart (21 rows, 420 computed, 4.8%
    # padding): within 5%, so no longer rows, though rows of 40 would compute 400 (20+20 nine times, 19+11+10)
    assert row_layout([20] * 18 + [19, 11, 10])[0] == 20
    # 18, 11, 10 instead (399 tokens): padding exactly 21 of 420 = 5%, still within the goal
    assert row_layout([20] * 18 + [18, 11, 10])[0] == 20
    # one-token sequences: rows of one token, one each
    assert row_layout([1, 1]) == (1, [[0], [1]])


def test_first_fit_decreasing_and_its_errors():
    assert first_fit_rows([5, 2, 3, 4, 1], 5) == [[0], [3, 4], [2, 1]]
    assert first_fit_rows([2, 2, 2], 4) == [[0, 1], [2]]  # ties in index order
    with pytest.raises(ValueError, match="6 tokens does not fit a packed row of 5"):
        first_fit_rows([6], 5)
    with pytest.raises(ValueError, match="right-padded"):
        sequence_lengths(torch.tensor([[0, 1, 1]]))  # left padding
    assert sequence_lengths(torch.tensor([[1, 1, 0], [1, 0, 0]])).tolist() == [2, 1]


# -- the forward, packed against padded --------------------------------------------------------------------------
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_entropy_and_gradients_equal_the_padded_forward(attn):
    model = _tiny_llama(attn)
    mb = _batch()
    lp0, ent0, g0 = _forward_and_grads(model, mb, packing=False)
    lp1, ent1, g1 = _forward_and_grads(model, mb, packing=True)
    mask = mb.loss_mask.bool()
    # targets: none of the 1-token row, 1 of the 2-token row, 19 - 2 and 250 - 2 (less the environment tokens)
    assert int(mask.sum()) == 0 + 1 + 17 + 248
    # packed rows [500], [37, 2, 1]: the 2-token row's target is read after the 37 in the same row
    assert forward_inputs(mb.input_ids, mb.attention_mask, packed=True).index[1, 0] == 500 + 37
    assert float(lp0[mask].abs().min()) > 0.0  # real logprobs compared
    assert torch.allclose(lp1, lp0, atol=1e-5, rtol=0) and torch.allclose(ent1, ent0, atol=1e-5, rtol=0)
    assert g0.keys() == g1.keys() and len(g0) == sum(1 for _ in model.parameters())
    for n in g0:
        assert torch.allclose(g1[n], g0[n], atol=1e-5, rtol=1e-4), n
    # and the padded rows equal each sequence alone (what "per-row values" means)
    i = LENGTHS.index(37)
    alone = TrainBatch(input_ids=mb.input_ids[i : i + 1, :37], attention_mask=mb.attention_mask[i : i + 1, :37],
                       loss_mask=mb.loss_mask[i : i + 1, :36], rollout_logprobs=torch.zeros(1, 36),
                       advantages=torch.zeros(1), max_new_tokens=37)
    from rlvr.train.policy import PolicyWorker

    with torch.no_grad():
        lp_alone, _ = PolicyWorker._forward(_worker(False), model, alone, need_entropy=False)
    assert torch.allclose(lp1[i, :36], lp_alone[0], atol=1e-5)


def test_the_boundary_and_the_positions_matter():
    """What the packing guards: sequences attending across their boundary (one segment: positions not
    restarting), restarting positions with the padding mask's attention (an attention_mask given) or with a KV
    cache (transformers then reads position_ids as plain positions) move the logits far beyond the tolerance
    above."""
    model = _tiny_llama()
    mb = _batch((20, 30, 10))  # rows [30], [20, 10]: the 10 follow the 20 in one row
    good = forward_inputs(mb.input_ids, mb.attention_mask, packed=True)
    mask = mb.loss_mask.bool()
    at = good.index[mask]
    with torch.no_grad():
        ref = model(**good.kwargs, use_cache=False).logits.flatten(0, 1)[at]
        cached = model(**good.kwargs).logits.flatten(0, 1)[at]  # a KV cache: transformers ignores the packing
        one_segment = {"input_ids": good.kwargs["input_ids"],
                       "position_ids": torch.arange(30).expand(2, 30)}
        crossed = model(**one_segment, use_cache=False).logits.flatten(0, 1)[at]
        ones = torch.ones_like(good.kwargs["input_ids"])
        masked = model(**good.kwargs, attention_mask=ones, use_cache=False).logits.flatten(0, 1)[at]
    assert float((crossed - ref).abs().max()) > 1e-2
    assert float((masked - ref).abs().max()) > 1e-2
    assert float((cached - ref).abs().max()) > 1e-2


def test_a_lora_model_packed_equals_padded():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny_llama(seed=1), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))
    mb = _batch((2, 37, 90))
    lp0, ent0, g0 = _forward_and_grads(model, mb, packing=False)
    lp1, ent1, g1 = _forward_and_grads(model, mb, packing=True)
    assert torch.allclose(lp1, lp0, atol=1e-5) and torch.allclose(ent1, ent0, atol=1e-5)
    assert g0.keys() == g1.keys() and all("lora_" in n for n in g0) and len(g0) == 8  # A, B of q, v in 2 layers
    for n in g0:
        assert torch.allclose(g1[n], g0[n], atol=1e-5, rtol=1e-4), n


def test_the_critic_packed_equals_padded():
    from rlvr.train.critic import ValueModel

    model = _tiny_llama()
    vm = ValueModel(model.model, 32)
    with torch.no_grad():
        vm.value_head.weight.normal_(0.0, 1.0)
        vm.value_head.bias.fill_(0.5)
    mb = _batch()
    v0 = vm(mb.input_ids, mb.attention_mask)
    vm.packed = True
    v1 = vm(mb.input_ids, mb.attention_mask)
    real = torch.arange(mb.input_ids.shape[1] - 1)[None, :] < (mb.attention_mask.sum(1) - 1)[:, None]
    assert v1.shape == v0.shape == (4, 499)
    assert torch.allclose(v1[real], v0[real], atol=1e-5) and float(v0[real].abs().min()) > 0.0
    assert torch.equal(v1[~real], torch.zeros_like(v1[~real]))  # past a sequence's end: 0 (masked anyway)


# -- which models honour it ------------------------------------------------------------------------------------------
class _CumMean(torch.nn.Module):
    """A backbone whose positions mix by a running mean over the whole row, blind to position_ids: packing would
    leak one sequence into the next."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 4)

    def forward(self, input_ids, position_ids=None, attention_mask=None, use_cache=None):
        h = self.emb(input_ids).cumsum(1) / torch.arange(1, input_ids.shape[1] + 1)[None, :, None]
        return types.SimpleNamespace(last_hidden_state=h)


def test_packing_is_checked_on_the_model(caplog):
    ok, diff = packing_honoured(_tiny_llama("sdpa"), 64)
    assert ok and diff < 1e-5
    assert packing_honoured(_tiny_llama("eager"), 64)[0]
    ok, diff = packing_honoured(_tiny_llama(), 64, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert ok and diff < 2e-2  # under the trainer's autocast (bf16)
    leaky = _tiny_llama()
    leaky.config.use_cache = True  # checked as the trainer runs it: no cache, whatever the config says
    assert packing_honoured(leaky, 64)[0]
    blind = _CumMean()
    ok, diff = packing_honoured(blind, 64)
    assert not ok and diff > 1e-2
    # relative to the largest hidden value: the same model with its hidden states x 1000 measures the same share
    with torch.no_grad():
        blind.emb.weight.mul_(1000.0)
    assert packing_honoured(blind, 64)[1] == pytest.approx(diff, rel=1e-5)
    with pytest.raises(ValueError, match="does not confine attention.*trainer.packing=auto"):
        resolve_packing(True, blind, 64)
    with caplog.at_level(logging.WARNING, logger="rlvr.train.packing"):
        assert resolve_packing("auto", blind, 64) is False
    assert "padded instead" in caplog.text
    assert resolve_packing(False, blind, 64) is False
    assert resolve_packing("auto", _tiny_llama(), 64) is True
    with pytest.raises(ValueError, match="true, false or auto"):
        resolve_packing("yes", blind, 64)
