"""pass@k against cases P1-P2 and a brute-force enumeration of draws without replacement."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.metrics import group_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    "n,c,k,expected", [(4, 1, 4, 1.0), (4, 1, 2, 0.5), (16, 4, 8, 0.961538), (1000, 1, 500, 0.5)]
)
def test_case_p1(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-6)


def test_case_p1_not_bootstrap():
    assert pass_at_k(4, 1, 4) != pytest.approx(1 - (3 / 4) ** 4, abs=1e-3)  # 0.6836, biased


def test_large_n_no_overflow():
    # C(2000, 1000) overflows a float; 1 - prod_{i=1001}^{2000} (1 - 1000/i) is ~1 - tiny
    v = pass_at_k(2000, 1000, 1000)
    assert v == pytest.approx(1.0, abs=1e-12) and v <= 1.0
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)


def test_case_p2_nothing_correct_is_zero_even_when_k_exceeds_n():
    assert pass_at_k(2, 0, 5) == 0.0
    assert pass_at_k(8, 0, 8) == 0.0


def test_k_exceeds_n_with_correct_raises():
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 5)


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 0)])
def test_invalid(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_property_matches_enumeration(nck):
    n, c, k = nck
    samples = [True] * c + [False] * (n - c)
    draws = list(itertools.combinations(range(n), k))
    brute = sum(any(samples[i] for i in d) for d in draws) / len(draws)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_group_pass_at_k_mean_over_prompts():
    correct = [[True, False, False, False], [False] * 4, [True, True, False, False]]
    out = group_pass_at_k(correct, [1, 2, 4])
    # pass@1 = c/n per prompt: (0.25 + 0 + 0.5) / 3; pass@2: (0.5 + 0 + 5/6) / 3; pass@4: (1 + 0 + 1) / 3
    assert out[1] == pytest.approx(0.75 / 3)
    assert out[2] == pytest.approx((0.5 + 5 / 6) / 3)
    assert out[4] == pytest.approx(2 / 3)


def test_group_pass_at_k_empty():
    with pytest.raises(ValueError):
        group_pass_at_k([], [1])
