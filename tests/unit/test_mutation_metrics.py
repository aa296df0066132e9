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
