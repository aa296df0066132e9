"""Values of pass@k and the bootstrap interval that the earlier tests left open (issue 23: the mutants of
``rlvr/metrics/{passk,intervals}.py`` they let live; ``benchmarks/mutation_score.py``, docs/mutation.md).

Every expected value is worked out by hand in the comment beside it (Chen et al. 2021, eq. 1, for pass@k;
Efron & Tibshirani 1993, ch. 13.3, for the percentile interval)."""

from __future__ import annotations

import numpy as np
import pytest

from rlvr.metrics import group_pass_at_k
from rlvr.metrics.intervals import bootstrap_ci


def test_group_pass_at_k_one_sample_groups_and_a_mixed_empty_one():
    # n = 1 is a group like any other: pass@1 of [True] is 1, of [False, True] is 1/2 -> mean 3/4
    assert group_pass_at_k([[True], [False, True]], [1]) == {1: pytest.approx(0.75)}
    # one empty group among full ones is refused by name (not by pass_at_k's n >= 1 check on the way)
    with pytest.raises(ValueError, match="every problem needs at least one sample"):
        group_pass_at_k([[True], []], [1])


def test_bootstrap_equals_the_unchunked_percentile_interval():
    # The definition, written out without the chunking: R = 130 resamples (two chunks of 64 and a remainder of
    # 2) of P = 30 row indices from default_rng(seed).integers(0, P, (R, P)); each resample's column means; the
    # 2.5% and 97.5% quantiles (numpy's default linear interpolation).
    values = np.random.default_rng(11).random((30, 2))
    idx = np.random.default_rng(7).integers(0, 30, size=(130, 30))
    means = values[idx].mean(axis=1)  # [R, M]
    lo, hi = bootstrap_ci(values, resamples=130, seed=7)
    assert lo.shape == hi.shape == (2,)
    assert np.allclose(lo, np.quantile(means, 0.025, axis=0), rtol=0, atol=1e-12)
    assert np.allclose(hi, np.quantile(means, 0.975, axis=0), rtol=0, atol=1e-12)
    # 80%: the 10% and 90% quantiles
    lo80, hi80 = bootstrap_ci(values, resamples=130, seed=7, level=0.8)
    assert np.allclose(lo80, np.quantile(means, 0.1, axis=0), rtol=0, atol=1e-12)
    assert np.allclose(hi80, np.quantile(means, 0.9, axis=0), rtol=0, atol=1e-12)
    # a 1-D input gives 0-d ends, the same as its column in a [P, 1] input
    lo1, hi1 = bootstrap_ci(values[:, 0], resamples=130, seed=7)
    assert np.ndim(lo1) == np.ndim(hi1) == 0 and (lo1, hi1) == (lo[0], hi[0])


def test_bootstrap_setting_boundaries():
    # one resample is allowed (its mean is both ends); level must lie strictly inside (0, 1)
    lo, hi = bootstrap_ci([0.0, 1.0, 2.0], resamples=1)
    assert lo == hi and lo * 3 == round(lo * 3) and 0.0 <= lo <= 2.0
    for level in (0.0, 1.0):
        with pytest.raises(ValueError, match="0 < level < 1"):
            bootstrap_ci([0.0, 1.0], level=level)
    with pytest.raises(ValueError, match="resamples >= 1"):
        bootstrap_ci([0.0, 1.0], resamples=0)
