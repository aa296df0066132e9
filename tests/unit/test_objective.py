"""The micro-batch loss assembled by rlvr.algos.objective, against values worked out by hand.

Case: B = 2 sequences, T = 3 positions, response tokens (0,1), (0,2), (1,1); the whole mini-batch has 6 response
tokens (this micro-batch is half of it); old = current logprobs (ratio 1, PPO-clip unclipped), advantages
[1, -2], reference logprobs for a k1 KL (log pi - log pi_ref) of [0.5, -1.0, 1.0] on those tokens, entropies
[2, 4, 3]. Per-token loss ``-A * ratio + 0.1 * kl - 0.01 * H``:
(0,1) -1 + 0.05 - 0.02 = -0.97; (0,2) -1 - 0.10 - 0.04 = -1.14; (1,1) 2 + 0.10 - 0.03 = 2.07; sum -0.04;
token mean over the mini-batch's 6 tokens: -0.04 / 6; world size 2 doubles what is back-propagated.
"""

from __future__ import annotations

import pytest
import torch

from rlvr.algos.kl import dph_forward_kl
from rlvr.algos.objective import dph_term, micro_batch_loss
from rlvr.config import AlgorithmConfig

MASK = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
ADV = torch.tensor([1.0, -2.0])
REF = torch.tensor([[-1.0, -1.0, -1.0], [-3.0, -2.0, -1.0]])
ENT = torch.tensor([[0.0, 2.0, 4.0], [0.0, 3.0, 0.0]])


def _lp():
    return torch.tensor([[-1.0, -0.5, -2.0], [-3.0, -1.0, -1.0]], requires_grad=True)


def _loss(cfg, lp, **kw):
    return micro_batch_loss(cfg, lp, lp.detach(), ADV, MASK, rollout_logprobs=lp.detach(), num_tokens=6.0,
                            num_seqs=2.0, max_len=3, ref_logprobs=REF, entropy=ENT, **kw)  # fmt: skip


def test_policy_kl_and_entropy_terms_by_hand():
    cfg = AlgorithmConfig(policy_loss="ppo_clip", loss_agg="token_mean", kl_coef=0.1, kl_penalty="loss",
                          kl_estimator="k1", entropy_coef=0.01)  # fmt: skip
    lp = _lp()
    out = _loss(cfg, lp, world_size=2)
    assert float(out.loss.detach()) == pytest.approx(-0.04 / 6, abs=1e-7)
    assert float(out.backward.detach()) == pytest.approx(-0.08 / 6, abs=1e-7)
    assert torch.allclose(out.stats["kl"] * MASK, torch.tensor([[0.0, 0.5, -1.0], [0.0, 1.0, 0.0]]))
    out.backward.backward()
    # d/d lp(1,1): -A * d ratio = 2, + 0.1 * d kl = 0.1; / 6 tokens; x 2 ranks
    assert float(lp.grad[1, 1]) == pytest.approx(2.1 / 6 * 2, abs=1e-6)
    assert float(lp.grad[0, 0]) == 0.0  # a prompt position carries no loss


def test_kl_in_the_reward_is_reported_not_added_and_dph_is_added_as_is():
    cfg = AlgorithmConfig(policy_loss="ppo_clip", loss_agg="token_mean", kl_coef=0.1, kl_penalty="reward",
                          kl_estimator="k1", entropy_coef=0.0)  # fmt: skip
    out = _loss(cfg, _lp(), dph_loss=torch.tensor(0.5))
    assert float(out.loss.detach()) == pytest.approx((-1.0 - 1.0 + 2.0) / 6 + 0.5, abs=1e-7)  # policy terms only, + DPH
    assert "kl" in out.stats


def test_entropy_bonus_without_entropy_is_refused():
    cfg = AlgorithmConfig(entropy_coef=0.01)
    with pytest.raises(ValueError, match="entropy"):
        micro_batch_loss(cfg, _lp(), _lp().detach(), ADV, MASK, rollout_logprobs=REF, num_tokens=6.0, num_seqs=2.0,
                         max_len=3)  # fmt: skip


def test_dph_term_by_hand():
    """forward KL per token = log pi_ref - log pi (rlvr.algos.kl.dph_forward_kl): on the masked tokens
    [-1 - (-0.5), -1 - (-2), -2 - (-1)] = [-0.5, 1, -1]; sum -0.5; coef 2, over 4 DPH tokens: -0.25."""
    loss, div = dph_term(dph_forward_kl, _lp(), REF, MASK, coef=2.0, total_tokens=4.0)
    assert torch.allclose(div, torch.tensor([[0.0, -0.5, 1.0], [0.0, -1.0, 0.0]]))
    assert float(loss) == pytest.approx(-0.25)
    assert float(dph_term(dph_forward_kl, _lp(), REF, MASK, coef=2.0, total_tokens=4.0, weight=0.0)[0]) == 0.0
