"""Adversarial model outputs through the ScoringPool with the real math verifier and a 3 s limit.

Each input must score 0 with reason ``timeout``, ``no_answer`` or ``wrong`` (never ``crashed`` or ``error``)
within the limit + 2 s, and the pool must score a normal sample right afterwards. Seen here (2 busy cores,
load average ~5, math-verify 0.9.0), the slower of two runs, seconds for one sample:

======================  =========  =====  =======================================================
input                   chars      time   outcome
======================  =========  =====  =======================================================
tower 9^9^9^9           21         3.04   timeout (sympy evaluates the tower)
100000!                 15         0.62   wrong
braces 1e5 deep, boxed  200009     3.13   timeout (math-verify parse; our extraction takes 0.05 s)
braces, no box          100001     3.10   timeout (read as a bare expression)
1 MB prose + box        1000009    0.40   wrong
1 MB prose, no box      1000001    0.39   no_answer
1 MB "1 2 3 ..."        1020000    3.11   timeout (one bare expression for math-verify)
\\frac nested 2000      20009      3.16   timeout
\\sqrt nested 2000      14009      3.13   timeout
2^2^...^2 (500 deep)    2009       3.02   wrong (2.88 s) or timeout
unbalanced \\left(      78008      3.07   wrong or timeout
100x100 pmatrix         40132      3.04   wrong (2.91 s) or timeout
10^{10^{10}}            20         3.06   timeout
1e6 dollar signs        1000000    1.22   no_answer
100000-digit integer    100008     0.33   wrong
50000 x "1,000" boxed   350006     3.07   timeout (our thousands stripping was quadratic: > 5 s before
                                          math-verify started; now 0.11 s)
10 MB prose + box       10440009   2.00   wrong
10 MB prose, no box     10440000   3.11   wrong (2.05 s, last math span ``x^2``) or timeout
======================  =========  =====  =======================================================
"""

from __future__ import annotations

import time

import pytest

from rlvr.config import VerifierSpec
from rlvr.reward import ScoringPool

pytestmark = pytest.mark.integration

TIMEOUT_S = 3.0
SLACK_S = 2.0
_PROSE = "The quick brown fox 12 jumps $x^2$. "


def _matrix(n: int) -> str:
    rows = " \\\\ ".join(" & ".join(["1"] * n) for _ in range(n))
    return f"\\boxed{{\\begin{{pmatrix}}{rows}\\end{{pmatrix}}}}"


ADVERSARIAL: dict[str, tuple[str, str]] = {
    "tower": (r"\boxed{9^{9^{9^{9}}}}", "1"),
    "factorial": (r"\boxed{100000!}", "1"),
    "nested_braces_boxed": ("\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}", "2"),
    "nested_braces_open": ("{" * 100_000 + "1", "2"),
    "megabyte_with_box": ("word " * 200_000 + r"\boxed{1}", "2"),
    "megabyte_no_box": ("word " * 200_000 + ".", "2"),
    "megabyte_numbers": ("1 2 3 " * 170_000, "2"),
    "frac_nested": ("\\boxed{" + "\\frac{1}{" * 2000 + "2" + "}" * 2000 + "}", "1"),
    "sqrt_nested": ("\\boxed{" + "\\sqrt{" * 2000 + "2" + "}" * 2000 + "}", "1"),
    "power_tower_500": ("\\boxed{" + "2^{" * 500 + "2" + "}" * 500 + "}", "1"),
    "left_unbalanced": ("\\boxed{" + "\\left( \\left[ \\left\\{ 1 + " * 3000 + "}", "1"),
    "matrix_100x100": (_matrix(100), "1"),
    "exp_10_10_10": (r"\boxed{10^{10^{10}}}", "1"),
    "dollar_signs": ("$" * 1_000_000, "1"),
    "huge_integer": ("\\boxed{" + "9" * 100_000 + "}", "1"),
    "thousands_50000": ("\\boxed{" + ", ".join(["1,000"] * 50_000) + "}", "1"),
    "ten_megabytes_with_box": (_PROSE * 290_000 + r"\boxed{3}", "4"),
    "ten_megabytes_no_box": (_PROSE * 290_000, "4"),
}


@pytest.fixture(scope="module")
def pool():
    with ScoringPool([VerifierSpec(name="math")], num_workers=2, timeout_s=TIMEOUT_S) as p:
        yield p
        assert p.stats()["crashes"] == 0 and p.stats()["errors"] == 0


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_input_scores_zero_in_time(pool: ScoringPool, name: str) -> None:
    response, gold = ADVERSARIAL[name]
    start = time.monotonic()
    (out,) = pool.score([response], [gold], [{}])
    elapsed = time.monotonic() - start
    print(f"{name}: {len(response)} chars, {elapsed:.2f} s, {out.results['math'].reason}")
    assert out.reward == 0.0
    assert out.results["math"].reason in {"timeout", "no_answer", "wrong"}
    assert elapsed <= TIMEOUT_S + SLACK_S
    # the pool still scores a normal sample: right, then wrong
    after = pool.score([r"so $x = \boxed{\frac{1}{2}}$", r"\boxed{0.4}"], ["0.5", "1/2"], [{}, {}])
    assert [s.reward for s in after] == [1.0, 0.0]


def test_known_outcomes(pool: ScoringPool) -> None:
    """The outcomes that do not depend on the machine's speed (far from the limit either way)."""
    names = ["tower", "exp_10_10_10", "megabyte_no_box", "dollar_signs", "megabyte_with_box", "huge_integer"]
    out = pool.score([ADVERSARIAL[n][0] for n in names], [ADVERSARIAL[n][1] for n in names], [{}] * len(names))
    # towers are decided without evaluating them (verifiers/_exact.py: over 10,000 digits, a value equals only the
    # same expression), so they are "wrong" at once instead of timing out (issue 9 item 11)
    assert [s.results["math"].reason for s in out] == ["wrong", "wrong", "no_answer", "no_answer", "wrong", "wrong"]
