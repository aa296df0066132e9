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


def test_asynchronous_default_caps_the_behaviour_weight():
    """Issue 38 item 6: the asynchronous default (``rollout.max_staleness=1``: ``rollout_correction`` auto ->
    AReaL's decoupled objective) weighted every token by pi_prox / pi_behav with no cap but e^20. Now it drops a
    token over AReaL's cap of 5 (``rlvr.algos.losses.DECOUPLED_CAP``) unless ``tis_cap`` says otherwise.

    By hand: one sequence, three response tokens, current = old (ratio 1, unclipped), A = 1, behaviour logprobs
    2, 1 and -1 nats below old: weights e^2 = 7.389 (over 5: dropped), e = 2.718, e^-1 = 0.368. Token loss
    -A * w; token mean over the 3 tokens: -(e + e^-1) / 3 = -1.0287; uncapped (``tis_cap: 0``) it was
    -(e^2 + e + e^-1) / 3 = -3.4917."""
    import math
    from pathlib import Path

    from rlvr.recipe import load_recipe

    tiny = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    rollout = old - torch.tensor([[2.0, 1.0, -1.0]])

    def loss(cfg) -> float:
        lp = old.clone().requires_grad_(True)
        out = micro_batch_loss(cfg, lp, old, torch.tensor([1.0]), torch.ones(1, 3), rollout_logprobs=rollout,
                               num_tokens=3.0, num_seqs=1.0, max_len=3)  # fmt: skip
        return float(out.loss.detach())

    default = load_recipe(tiny, ["rollout.max_staleness=1"]).algorithm
    assert (default.rollout_correction, default.tis_cap) == ("decoupled", 5.0)
    assert loss(default) == pytest.approx(-(math.e + math.exp(-1)) / 3, abs=1e-6)
    uncapped = load_recipe(tiny, ["rollout.max_staleness=1", "algorithm.tis_cap=0"]).algorithm
    assert loss(uncapped) == pytest.approx(-(math.exp(2) + math.e + math.exp(-1)) / 3, abs=1e-5)
    # a config built by hand (not resolved at load) takes the same default
    assert loss(AlgorithmConfig(rollout_correction="decoupled")) == pytest.approx(-(math.e + math.exp(-1)) / 3, abs=1e-6)
    on_policy = load_recipe(tiny).algorithm  # on-policy: tis, off (0) as before
    assert (on_policy.rollout_correction, on_policy.tis_cap) == ("tis", 0.0)
