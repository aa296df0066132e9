"""The exact-number rule's helpers, branch by branch (issue 23: the mutants of ``verifiers/_exact.py`` that the
verifier-level tests let live; ``benchmarks/mutation_score.py``, docs/mutation.md lists the equivalent ones).

Expressions are built with sympy directly (no LaTeX parsing); every expected value is worked out by hand in
the comment beside it."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import sympy as sp

from rlvr_verifiers import _exact

I, R = sp.Integer, sp.Rational


def _pow(b, e):
    return sp.Pow(b, e, evaluate=False)


def _digits(n: int) -> int:
    return len(str(abs(n)))


# ------------------------------------------------------------------------------------------------------
# digits_bound: an upper estimate


@pytest.mark.parametrize("n", [1, 9, 10, 999, 12345, 10**20, -(10**20), 2**64 - 1])
def test_integer_bound_is_within_a_digit_and_a_third(n):
    # bit_length * log10(2) + 1 >= digits; and digits >= floor((bits - 1) log10 2) + 1, so the excess is
    # below log10(2) + 1 = 1.30103
    d = _digits(n)
    assert d <= _exact.digits_bound(I(n)) <= d + 1.30103 + 1e-9


def test_fraction_bound_counts_numerator_and_denominator():
    # 1 / 10^20: 1 digit + 21 digits = 22; the excess of each part is below 1.30103
    b = _exact.digits_bound(R(1, 10**20))
    assert 22 <= b <= 22 + 2 * 1.30103


def test_power_bounds():
    # 10^100 (101 digits): bound = exponent * digits_bound(10) + 1 = 100 * (4 * 0.30103 + 1) + 1 = 221.4 >= 101
    b = _exact.digits_bound(_pow(I(10), I(100)))
    assert 101 <= b <= 100 * (4 * 0.30103 + 1) + 1 + 1e-9
    # 1^{10^30}, (-1)^{10^30}, 0^{10^30}: the value is 1, 1, 0 whatever the exponent: 1 + the exponent's digits
    # (31 digits: bound of 10^30 = 100 bits * 0.30103 + 1 = 31.1)
    for base in (1, -1, 0):
        assert _exact.digits_bound(_pow(I(base), I(10**30))) == pytest.approx(1 + 100 * 0.30103 + 1)
    # 2^{10^30}: exponent bound 31.1 > 20 -> unbounded
    assert _exact.digits_bound(_pow(I(2), I(10**30))) == math.inf
    # an exponent of 20 digits exactly at the limit is still bounded: 10^19 has 64 bits -> 20.27 > 20 -> inf;
    # 10^18 (60 bits -> 19.06) is bounded
    assert _exact.digits_bound(_pow(I(2), I(10**18))) < math.inf
    assert _exact.digits_bound(_pow(I(2), I(10**19))) == math.inf
    # a decimal exponent counts 20 (not over the limit): 2^{0.5} -> max(1, ceil 0.5) * 1.602 + 1
    assert _exact.digits_bound(_pow(I(2), sp.Float(0.5))) == pytest.approx(1.60206 + 1)
    # 2^{1/2}: ceil(0.5) = 1 -> 1 * 1.602 + 1; 1.5^2 (a decimal base counts 20): 2 * 20 + 1
    assert _exact.digits_bound(_pow(I(2), R(1, 2))) == pytest.approx(1.60206 + 1)
    assert _exact.digits_bound(_pow(sp.Float(1.5), I(2))) == pytest.approx(41)
    # 2^x: a free exponent adds its digits (1) to the base's (2 bits -> 1.602)
    x = sp.Symbol("x")
    assert _exact.digits_bound(_pow(I(2), x)) == pytest.approx(1.60206 + 1.0)
    # 2^{sqrt 2}: an irrational exponent counts by its magnitude, ceil(1.414) = 2 -> 2 * 1.602 + 1
    assert _exact.digits_bound(_pow(I(2), sp.sqrt(2))) == pytest.approx(2 * 1.60206 + 1)
    # e^{100}: exp counts as E^{100}, E bounded by 1 -> 100 * 1 + 1 (e^100 has 44 digits before the point)
    assert 44 <= _exact.digits_bound(sp.exp(I(100), evaluate=False)) == pytest.approx(101)
    # (x + 1)^{10^30}: a base holding a symbol: the exponent is over 20 digits -> unbounded
    assert _exact.digits_bound(_pow(x + 1, I(10**30))) == math.inf


def test_factorial_bounds():
    # 100! has 158 digits: lgamma(102) / ln 10 + 1 + digits_bound(100) = 159.97 + 1 + 3.1
    b = _exact.digits_bound(sp.factorial(I(100), evaluate=False))
    assert 158 <= b == pytest.approx(math.lgamma(102) / math.log(10) + 1 + (7 * 0.30103 + 1))
    # x!: no value to bound by: the argument's bound + 1
    assert _exact.digits_bound(sp.factorial(sp.Symbol("x"))) == pytest.approx(2.0)
    # (10^21)! and (10^19)! (64 bits -> 20.27): an argument over 20 digits -> unbounded; a decimal argument
    # counts 20, at the limit and not over it; it is not a rational value: 20 + 1 for 3.0!
    assert _exact.digits_bound(sp.factorial(I(10**21), evaluate=False)) == math.inf
    assert _exact.digits_bound(sp.factorial(I(10**19), evaluate=False)) == math.inf
    assert _exact.digits_bound(sp.factorial(sp.Float(3.0), evaluate=False)) == 21.0


def test_sum_bound_adds_its_terms():
    # 10^20 + 7: 1 + bound(10^20) + bound(7) = 1 + (67 * 0.30103 + 1) + (3 * 0.30103 + 1)
    e = sp.Add(I(10**20), I(7), evaluate=False)
    assert _exact.digits_bound(e) == pytest.approx(1 + 67 * 0.30103 + 1 + 3 * 0.30103 + 1)
    # a plain (non-sympy) argument is skipped, not the end of the sum: 1 + bound(7)
    assert _exact.digits_bound(sp.Basic(5, I(7))) == pytest.approx(1 + 3 * 0.30103 + 1)
    # one unbounded term makes the sum unbounded
    assert _exact.digits_bound(sp.Add(_pow(I(2), I(10**30)), I(1), evaluate=False)) == math.inf


# ------------------------------------------------------------------------------------------------------
# has_huge


def test_has_huge():
    assert not _exact.has_huge("2^1000")  # not a sympy expression: nothing to evaluate
    assert not _exact.has_huge(sp.Symbol("x") + 1)  # no power or factorial at all
    # 10^4999: bound 4999 * 2.2041 + 1 = 11019 > 10000 -> huge; 10^4536: 9998.8 + 1 <= 10000 -> not huge
    assert _exact.has_huge(_pow(I(10), I(4999)))
    assert not _exact.has_huge(_pow(I(10), I(4536)))


# ------------------------------------------------------------------------------------------------------
# rational_value and _exact_root


@pytest.mark.parametrize("expr,value", [
    (sp.UnevaluatedExpr(R(3, 4)), Fraction(3, 4)),
    (sp.Add(R(1, 2), R(1, 3), evaluate=False), Fraction(5, 6)),  # a sum starts from 0
    (sp.Mul(R(2, 3), I(3), evaluate=False), Fraction(2)),  # a product from 1
    (sp.Add(I(2), sp.sqrt(2), evaluate=False), None),  # an irrational term
    (_pow(I(0), I(3)), Fraction(0)),  # 0^3 = 0
    (_pow(I(0), I(1)), Fraction(0)),
    (_pow(I(0), R(1, 2)), Fraction(0)),  # sqrt(0) = 0
    (_pow(I(0), I(0)), None),  # 0^0: undefined here
    (_pow(I(0), I(-1)), None),  # 1/0
    (_pow(R(4, 9), R(1, 2)), Fraction(2, 3)),  # an exact root of numerator and denominator
    (_pow(R(4, 3), R(1, 2)), None),  # sqrt(3) in the denominator is irrational
    (_pow(R(3, 4), R(1, 2)), None),  # sqrt(3) in the numerator is irrational
    (_pow(I(-8), R(1, 3)), None),  # the real cube root of a negative is not taken
    (_pow(I(2), I(-3)), Fraction(1, 8)),  # a power, not a product: 2^-3
    (_pow(I(3), I(2)), Fraction(9)),
    (_pow(sp.sqrt(2), I(2)), None),  # the base itself is irrational
    (_pow(I(2), sp.sqrt(2)), None),  # an irrational exponent
    (sp.factorial(I(0), evaluate=False), Fraction(1)),  # 0! = 1
    (sp.factorial(I(5), evaluate=False), Fraction(120)),
    (sp.factorial(R(1, 2), evaluate=False), None),  # not an integer
    (sp.factorial(I(-1), evaluate=False), None),
    (sp.factorial(sp.sqrt(2), evaluate=False), None),
    (sp.binomial(I(5), I(0), evaluate=False), Fraction(1)),  # C(5, 0) = 1
    (sp.binomial(I(0), I(0), evaluate=False), Fraction(1)),
    (sp.binomial(I(6), I(2), evaluate=False), Fraction(15)),
    (sp.binomial(I(-1), I(2), evaluate=False), None),
    (sp.binomial(I(5), I(-1), evaluate=False), None),
    (sp.binomial(R(5, 2), I(1), evaluate=False), None),
    (sp.binomial(I(5), R(1, 2), evaluate=False), None),
    (sp.binomial(sp.sqrt(2), I(1), evaluate=False), None),
    (sp.binomial(I(5), sp.sqrt(2), evaluate=False), None),
])  # fmt: skip
def test_rational_value_branches(expr, value):
    assert _exact.rational_value(expr) == value


def test_exact_root():
    assert _exact._exact_root(Fraction(0), 2) == 0  # sqrt(0) = 0
    assert _exact._exact_root(Fraction(8, 27), 3) == Fraction(2, 3)
    assert _exact._exact_root(Fraction(-8), 3) is None


# ------------------------------------------------------------------------------------------------------
# is_exact and exact_equal


def test_is_exact():
    assert _exact.is_exact(R(1, 3) + sp.pi)
    assert not _exact.is_exact(sp.Float(0.5))
    assert not _exact.is_exact(sp.oo) and not _exact.is_exact(-sp.oo) and not _exact.is_exact(sp.Symbol("x") - sp.oo)
    assert not _exact.is_exact(sp.Matrix([1])) and not _exact.is_exact(sp.ImmutableMatrix([1]))
    assert not _exact.is_exact(sp.MatrixSymbol("M", 2, 2))
    assert not _exact.is_exact(sp.Eq(sp.Symbol("x"), 1))  # a relation is not an expression
    assert not _exact.is_exact(I(28) * sp.UnevaluatedExpr(R(1, 100)))  # 28%
    assert _exact.is_exact(I(28) * sp.UnevaluatedExpr(R(1, 2)))  # only the percent factor is refused
    assert not _exact.is_exact(sp.Function("f")(1))


def test_exact_equal_verdicts():
    x = sp.Symbol("x")
    assert _exact.exact_equal(x, x) is None  # symbols: math-verify's symbolic test decides
    assert _exact.exact_equal(sp.Float(0.5), R(1, 2)) is None  # a decimal: math-verify's rounding rule
    assert _exact.exact_equal(R(1, 2), sp.Float(0.5)) is None
    assert _exact.exact_equal(R(1, 2), R(2, 4)) is True
    assert _exact.exact_equal(R(1, 2), R(1, 3)) is False
    # over the size bound: equal only as written
    big = _pow(I(10), I(5000))
    assert _exact.exact_equal(big, _pow(I(10), I(5000))) is True
    assert _exact.exact_equal(big, I(3)) is False and _exact.exact_equal(I(3), big) is False
    # a tower is never evaluated, whichever side it is on (2^{2^{40}} has 3.3e11 digits)
    tower = _pow(I(2), _pow(I(2), I(40)))
    assert _exact.exact_equal(tower, I(3)) is False and _exact.exact_equal(I(3), tower) is False
    # irrational: equal to P digits, P = 40 + the digit bound
    assert _exact.exact_equal(sp.sqrt(8), 2 * sp.sqrt(2)) is True
    assert _exact.exact_equal(sp.pi, sp.pi + R(1, 10**30)) is False
    assert _exact.exact_equal(sp.pi, -sp.pi) is False  # not |a| = |b|
    assert _exact.exact_equal(sp.sqrt(2), R(141421356237, 10**11)) is False  # one side rational, one not
    zero = sp.Add(sp.sqrt(2), -sp.sqrt(2), evaluate=False)
    assert _exact.exact_equal(zero, sp.Add(sp.sqrt(3), -sp.sqrt(3), evaluate=False)) is True  # both exactly 0
    # equal irrationals whose evaluations differ in the last digits: within the P - 10 digit tolerance
    assert _exact.exact_equal(sp.sqrt(2) * sp.sqrt(3), sp.sqrt(6)) is True
    assert _exact.exact_equal(sp.log(8, evaluate=False), 3 * sp.log(2)) is True
    # a rational value that rational_value cannot see (sqrt(2)^2, unevaluated) against its rational: by value
    two = _pow(sp.sqrt(2), I(2))
    assert _exact.exact_equal(two, I(2)) is True and _exact.exact_equal(I(2), two) is True
    # against 1, a value 5e-61 below it: unequal, although the larger of the two is exactly 1
    assert _exact.exact_equal(I(1), sp.cos(R(1, 10**30))) is False
    # a tiny irrational against 0: its digit bound (e^-100: 101) sets P = 141, far past its 44 leading zeros
    assert _exact.exact_equal(sp.exp(-100), I(0)) is False


# ------------------------------------------------------------------------------------------------------
# the install, through math-verify's grader


def test_grader_functions_inside_the_block():
    import math_verify.grader as grader

    x = sp.Symbol("x")
    with _exact.exact_numbers():
        # exact and symbol-free: the exact verdict (the plain chopped float test calls these equal)
        assert grader.sympy_numeric_eq(R(1, 10**20), R(1, 10**20 + 1), 6, 15) is False
        assert grader.sympy_numeric_eq(R(1, 2), R(2, 4), 6, 15) is True
        # exact with symbols: never the float test (False here), the symbolic test decides
        assert grader.sympy_numeric_eq(x, x + R(1, 10**30), 6, 15) is False
        assert grader.sympy_symbolic_eq(x + 1, 1 + x) is True
        assert grader.sympy_symbolic_eq(R(1, 10**20), R(1, 10**20 + 1)) is False
        assert grader.sympy_symbolic_eq(R(1, 3), R(2, 6)) is True
        # a decimal on one side: math-verify's own rule (rounding)
        assert grader.sympy_numeric_eq(sp.Float(0.5), R(1, 2), 6, 15) is True


def test_depth_counter_restores_after_nesting_and_errors():
    import math_verify.grader as grader

    before = grader.sympy_numeric_eq
    with _exact.exact_numbers():
        with _exact.exact_numbers():
            pass
        assert grader.sympy_numeric_eq is not before  # still installed after the inner block
        assert _exact._STATE["depth"] == 1
    assert grader.sympy_numeric_eq is before and _exact._STATE["depth"] == 0
    with pytest.raises(RuntimeError):
        with _exact.exact_numbers():
            raise RuntimeError("inside")
    assert grader.sympy_numeric_eq is before and _exact._STATE["depth"] == 0


@pytest.mark.parametrize("gold,answer", [("0", r"\sin(\pi)"), ("0", r"\pi - \pi"), (r"\sqrt{2}-\sqrt{2}", r"\pi-\pi")])
def test_an_irrational_form_of_exactly_zero_is_right(gold, answer):
    # sympy's evalf gives these as 0.e-181 (no accurate digit), which compared unequal to 0 and to each other:
    # the exact rule scored 0 where plain math-verify scores 1 (found by the mutant 'scale == 0 -> != 0')
    from rlvr_verifiers.math import MathVerifier

    assert MathVerifier().verify(rf"\boxed{{{answer}}}", gold).score == 1.0
