"""Values of the advantage estimators, policy losses and KL terms that the earlier tests left open (issue 23:
the mutants of ``rlvr/algos/{advantages,losses,kl}.py`` they let live; ``benchmarks/mutation_score.py``,
docs/mutation.md lists the equivalent ones).

Every expected value is worked out by hand in the comment beside it, from the formula in the docstring of the
function under test and its paper (GRPO: Shao et al. 2024; RLOO: Ahmadian et al. 2024; REINFORCE++: Hu 2025;
PPO clip: Schulman et al. 2017; GSPO: Zheng et al. 2025; CISPO: MiniMax 2025; KL: Schulman 2020)."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest
import torch

from rlvr.algos.advantages import (
    ADVANTAGES,
    GRPOSettings,
    PassKSettings,
    PKPOSettings,
    comb_ratio,
    grpo,
    normalise_token_advantages,
    reinforce_pp,
    reinforce_pp_global,
    rloo,
)
from rlvr.registry import NoSettings

NO = NoSettings()


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# ------------------------------------------------------------------------------------------------------
# advantages


def test_std_eps_is_added_so_a_near_constant_group_stays_bounded():
    # rewards (0, 1e-6): centred -+5e-7, unbiased std 7.0711e-7; / (std + 1e-6) -> -+0.29289 (not -+1.707)
    a = 0.5 / (math.sqrt(0.5) + 1.0)
    assert torch.allclose(grpo(_t([[0.0, 1e-6]]), GRPOSettings()), _t([[-a, a]]), atol=1e-4)
    # REINFORCE++: the same single group is the whole batch, so the batch std is the group's: -+0.29289
    assert torch.allclose(reinforce_pp(_t([[0.0, 1e-6]]), NO), _t([[-a, a]]), atol=1e-4)
    # REINFORCE++ without a group baseline, and its token form: the same two values, the same -+0.29289
    assert torch.allclose(reinforce_pp_global(_t([[0.0, 1e-6]]), NO), _t([[-a, a]]), atol=1e-4)
    assert torch.allclose(normalise_token_advantages(_t([[0.0, 1e-6]]), _t([[1.0, 1.0]])), _t([[-a, a]]), atol=1e-4)


def test_reinforce_pp_global_all_equal_batch_is_exactly_zero():
    # 0.9 three times: the float32 mean is 0.9 + 6e-8, so (r - mean) / (0 + 1e-6) would give 0.06, not 0
    assert reinforce_pp_global(_t([[0.9, 0.9, 0.9]]), NO).tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("name,cfg,a", [
    ("grpo", GRPOSettings(), 0.5 / (math.sqrt(0.5) + 1e-6)),  # (1, 0): -+0.5 / unbiased std sqrt(0.5)
    ("dr_grpo", NO, 0.5),  # (1, 0) - mean 0.5
    ("rloo", NO, 1.0),  # (1, 0) - the other sample
])  # fmt: skip
def test_a_flat_group_beside_a_varied_one_is_zero(name, cfg, a):
    # the no-signal check is per group: a batch-wide max/min would not see group 0 as flat
    out = ADVANTAGES.get(name)(_t([[1.0, 1.0], [1.0, 0.0]]), cfg)
    assert torch.allclose(out, _t([[0.0, 0.0], [a, -a]]), atol=1e-6)


def test_two_sample_groups_are_compared():
    # RLOO, G = 2: A = r - the other sample: (1, 0) -> (+1, -1); (0.5, 2) -> (-1.5, +1.5)
    assert torch.allclose(rloo(_t([[1.0, 0.0], [0.5, 2.0]]), NO), _t([[1.0, -1.0], [-1.5, 1.5]]))
    # REINFORCE++ with B = 2: centred (0.5, -0.5), unbiased std sqrt(0.5) -> -+0.70711
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert torch.allclose(reinforce_pp(_t([[1.0, 0.0]]), NO), _t([[s, -s]]), atol=1e-6)


def test_token_normalisation_two_tokens_and_masked_values():
    # two response tokens (1, 2) and a masked-out 100: mean 1.5, unbiased std sqrt(0.5) -> (-0.70711, +0.70711, 0)
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    out = normalise_token_advantages(_t([[1.0, 2.0, 100.0]]), _t([[1.0, 1.0, 0.0]]))
    assert torch.allclose(out, _t([[-s, s, 0.0]]), atol=1e-6)


def test_token_normalisation_with_unit_variance():
    # tokens (0, 1, 2): mean 1, unbiased variance (1 + 0 + 1) / 2 = 1 -> (x - 1) / (1 + 1e-6)
    out = normalise_token_advantages(_t([[0.0, 1.0], [2.0, 0.0]]), _t([[1.0, 1.0], [1.0, 0.0]]))
    assert torch.allclose(out, _t([[-1.0, 0.0], [1.0, 0.0]]), atol=1e-5)


# ------------------------------------------------------------------------------------------------------
# settings checks at their boundary values (G = 4)

_G4 = SimpleNamespace(rollout=SimpleNamespace(samples_per_prompt=4))
_W = "algorithm.advantage"


@pytest.mark.parametrize("k,ok,fix", [(0, False, 1), (1, True, None), (4, True, None), (5, False, 4)])
def test_passk_k_boundaries(k, ok, fix):
    errs = PassKSettings(k=k).errors(_G4, _W)
    assert errs == [] if ok else errs == [f"{_W}.k={k} must be in [1, rollout.samples_per_prompt=4]: set {_W}.k={fix}"]


@pytest.mark.parametrize("baseline,k,ok", [
    ("loo_minus_one", 1, False), ("loo_minus_one", 2, True), ("loo_minus_one", 4, True), ("loo_minus_one", 5, False),
    ("loo", 0, False), ("loo", 1, True), ("loo", 3, True), ("loo", 4, False),
])  # fmt: skip
def test_pkpo_k_boundaries(baseline, k, ok):
    errs = PKPOSettings(k=k, baseline=baseline).errors(_G4, _W)
    assert (errs == []) == ok, errs
    if baseline == "loo_minus_one" and not ok:  # the fix named is the nearest k in [2, G]
        assert errs[0].endswith(f"set {_W}.k={2 if k < 2 else 4}" + (" (k = 1 has no baseline; use baseline=loo)"
                                                                        if k == 1 else ""))


def test_comb_ratio_refuses_k_over_b_and_negative_k():
    with pytest.raises(ValueError, match="comb_ratio needs 0 <= k <= b, got k = 3, b = 2"):
        comb_ratio(torch.tensor([1.0]), 2, 3)
    with pytest.raises(ValueError, match="got k = -1, b = 2"):
        comb_ratio(torch.tensor([1.0]), 2, -1)


@pytest.mark.parametrize("name,cfg,what", [
    ("passk", PassKSettings(k=9), "advantage 'passk' needs 1 <= algorithm.advantage.k <= 8"),
    ("pkpo", PKPOSettings(k=9), "advantage 'pkpo (baseline=loo_minus_one)' needs 2 <= algorithm.advantage.k <= 8"),
    ("pkpo", PKPOSettings(k=8, baseline="loo"), "advantage 'pkpo (baseline=loo)' needs 1 <= algorithm.advantage.k <= 7"),
])  # fmt: skip
def test_passk_errors_name_the_estimator(name, cfg, what):
    r = _t([[1, 1, 1, 0, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match=re.escape(what)):
        ADVANTAGES.get(name)(r, cfg)
    with pytest.raises(ValueError, match=f"advantage '{name}' is defined for binary rewards"):
        ADVANTAGES.get(name)(r * 0.5, dataclasses.replace(cfg, k=2))
