"""Advantage estimators against cases A1-A3 (/work/shared/cases/README.md) and group-wise properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algos import ADVANTAGES
from rlvr.algos.advantages import GRPOSettings
from rlvr.registry import NoSettings

STD = GRPOSettings(std_normalize=True)
NO_STD = GRPOSettings(std_normalize=False)
NONE = NoSettings()  # dr_grpo and rloo take no settings
A1 = torch.tensor([[1.0, 1, 1, 0, 0, 0, 0, 0]])


def _settings(name: str, std: bool):
    """The entry's own settings: grpo's std_normalize, none for dr_grpo / rloo."""
    return GRPOSettings(std_normalize=std) if name == "grpo" else NONE


def _pos_neg(adv: torch.Tensor) -> tuple[float, float]:
    return adv[0, 0].item(), adv[0, -1].item()


def test_registry_names():
    assert {"grpo", "dr_grpo", "rloo"} <= set(ADVANTAGES.names())


@pytest.mark.parametrize(
    "name,cfg,pos,neg",
    [
        ("grpo", STD, 1.2076, -0.7246),  # unbiased std (G - 1 = 7)
        ("grpo", NO_STD, 0.625, -0.375),  # mean-centring only
        ("dr_grpo", NONE, 0.625, -0.375),  # no std division (no settings)
        ("rloo", NONE, 0.7143, -0.4286),  # 1 - 2/7, 0 - 3/7
    ],
)
def test_case_a1(name, cfg, pos, neg):
    adv = ADVANTAGES.get(name)(A1, cfg)
    assert adv.dtype == torch.float32 and adv.shape == (1, 8)
    p, n = _pos_neg(adv)
    assert p == pytest.approx(pos, abs=1e-4)
    assert n == pytest.approx(neg, abs=1e-4)
    assert torch.allclose(adv[0, :3], torch.full((3,), p)) and torch.allclose(adv[0, 3:], torch.full((5,), n))
    assert abs(adv.sum().item()) < 1e-5


def test_case_a1_not_population_std():
    p, n = _pos_neg(ADVANTAGES.get("grpo")(A1, STD))
    assert p != pytest.approx(1.291, abs=1e-3) and n != pytest.approx(-0.775, abs=1e-3)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("std", [True, False])
@pytest.mark.parametrize(
    "rewards",
    [
        torch.tensor([[1.0], [0.0], [0.3]]),  # one sample per group
        torch.tensor([[0.1, 0.1, 0.1], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]),  # equal rewards
        torch.full((2, 16), 0.7),
    ],
)
def test_case_a2_exactly_zero(name, std, rewards):
    adv = ADVANTAGES.get(name)(rewards, _settings(name, std))
    assert adv.shape == rewards.shape
    assert torch.equal(adv, torch.zeros_like(adv))


def test_case_a3_per_group_not_batch():
    adv = ADVANTAGES.get("grpo")(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), STD).reshape(-1)
    assert torch.allclose(adv, torch.tensor([0.7071, -0.7071, 0.0, 0.0]), atol=1e-4)
    assert not torch.allclose(adv, torch.tensor([0.5, -1.5, 0.5, 0.5]), atol=1e-2)


def test_rloo_leave_one_out_by_hand():
    # rewards 3, 1, 2: baselines (1+2)/2, (3+2)/2, (3+1)/2 -> 1.5, -1.5, 0
    adv = ADVANTAGES.get("rloo")(torch.tensor([[3.0, 1.0, 2.0]]), NONE)
    assert torch.allclose(adv, torch.tensor([[1.5, -1.5, 0.0]]))


@pytest.mark.parametrize("bad", [torch.tensor([1.0, 0.0]), torch.tensor([[1.0, float("nan")]])])
def test_rejects_bad_rewards(bad):
    with pytest.raises(ValueError):
        ADVANTAGES.get("grpo")(bad, STD)


rewards_st = st.integers(1, 6).flatmap(
    lambda p: st.integers(1, 9).flatmap(
        lambda g: st.lists(
            st.lists(st.one_of(st.sampled_from([0.0, 1.0]), st.floats(-10, 10)), min_size=g, max_size=g),
            min_size=p,
            max_size=p,
        )
    )
)


@settings(max_examples=60, deadline=None)
@given(rows=rewards_st, name=st.sampled_from(["grpo", "dr_grpo", "rloo"]), std=st.booleans())
def test_property_sum_zero_finite(rows, name, std):
    rewards = torch.tensor(rows, dtype=torch.float32)
    adv = ADVANTAGES.get(name)(rewards, _settings(name, std))
    assert torch.isfinite(adv).all()
    scale = 1.0 + rewards.abs().max().item()
    assert torch.allclose(adv.sum(dim=-1), torch.zeros(len(rows)), atol=1e-4 * scale * rewards.shape[1])
    equal = rewards.amax(-1) == rewards.amin(-1)
    assert torch.equal(adv[equal], torch.zeros_like(adv[equal]))
    # each group is handled on its own: shuffling rows permutes the result rows
    perm = torch.randperm(len(rows))
    assert torch.allclose(ADVANTAGES.get(name)(rewards[perm], _settings(name, std)), adv[perm])
