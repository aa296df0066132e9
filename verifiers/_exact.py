"""Exact equality of exact numbers for the ``math`` verifier (private helper of :mod:`rlvr_verifiers.math`).

math-verify 0.9.0 compares two non-atomic numbers by ``(a - b).evalf(chop=True, n=15) == 0``: a difference
below float precision is chopped to 0, so ``\\frac{1}{10^{20}}`` equals ``\\frac{1}{10^{20}+1}``,
``\\frac{1}{20!}`` equals ``\\frac{1}{21!}`` and ``e^{-100}`` equals ``e^{-101}`` (false positives). Here, when
both sides are **exact** (no decimal ``Float`` anywhere, no percent sign, no free symbol):

- values that are rational (integers, fractions, integer powers, exact roots, factorials, binomials) are
  computed as :class:`fractions.Fraction` and compared exactly;
- values holding an irrational constant (``\\pi``, ``e``, ``\\sqrt{2}``, ``\\log 3``...) are evaluated to
  ``P = 40 + D`` significant digits (``D``: the digit bound below) and equal only when they agree to ``P - 10``
  digits relative to the larger, far past float precision;
- an exact expression with symbols (``x + 10^{-30}`` against ``x``) skips the chopped float test and is
  decided by math-verify's symbolic test (``simplify(a - b)`` is zero), which is exact.

Decimals keep math-verify's own rule (rounding to 6 places; ``0.333333`` equals ``\\frac{1}{3}``), and so do
percentages (case V4).

**Size bound.** Before anything is computed, :func:`digits_bound` estimates from the exponents and
arguments alone how many decimal digits the exact value (numerator and denominator) may need. An expression
holding a power, factorial or binomial above :data:`MAX_DIGITS` (``2^{2^{2^{100}}}``, ``1000000!``,
``10^{10^{10}}``) is never evaluated: :func:`has_huge` flags it and the verifier compares it *as written*
(equal only to an answer that parses to the identical expression). math-verify itself hangs on
``2^{2^{100}}`` against ``3`` (it evaluates the power).

:func:`exact_numbers` installs the exact rule into ``math_verify.grader`` for the duration of a ``with``
block (a depth counter under a lock, so nested and concurrent uses are safe); outside it math-verify is
untouched (the benchmark calls the plain one in the same process for its "before" counts).
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from fractions import Fraction
from typing import Iterator

MAX_DIGITS = 10_000
"""Largest exact value (decimal digits of numerator plus denominator, estimated) that is ever computed."""

_LN10 = math.log(10.0)
_LOCK = threading.Lock()
_STATE: dict[str, object] = {"depth": 0}


def _sympy():
    import sympy

    return sympy


def _int_digits(n: int) -> float:
    return n.bit_length() * 0.30103 + 1.0


def _small_value(e) -> Fraction | None:
    """The rational value of ``e`` when its digit bound is small (exponents, factorial arguments), else None."""
    if digits_bound(e) > 40:
        return None
    return rational_value(e)


def digits_bound(e) -> float:
    """An upper estimate of the decimal digits needed to hold the exact value of ``e`` (a sympy expression),
    from its integers, exponents and factorial arguments, computing nothing large; ``inf`` when a power's
    exponent or a factorial's argument is itself huge, or when ``e`` holds something it cannot bound.

    The rule, by node: an integer n: ``bit_length(n) * 0.30103 + 1`` (within log10(2) + 1 of its digits); p/q:
    the sum of both; a Float: 20; a symbol or constant (pi, e, i, oo): 1; ``b^x`` (``exp(x)`` is ``E^x``): inf
    when b is unbounded or bound(x) > 20, ``1 + bound(x)`` when b is 0, 1 or -1, ``bound(b) + bound(x)`` when x
    has a symbol, else ``max(1, ceil(|x|)) * max(bound(b), 1) + 1``; ``n!`` (and binomial, gamma...): inf when
    its arguments' bounds sum over 20, ``lgamma(|n| + 2) / ln 10 + 1 + that sum`` for a rational n, else that
    sum + 1; anything else: ``1 + the sum over its arguments``."""
    sp = _sympy()
    if isinstance(e, sp.Integer):
        return _int_digits(abs(int(e.p)))
    if isinstance(e, sp.Rational):
        return _int_digits(abs(int(e.p))) + _int_digits(int(e.q))
    if isinstance(e, sp.Float):
        return 20.0
    if isinstance(e, (sp.NumberSymbol, sp.Symbol)) or e is sp.I or e in (sp.oo, -sp.oo, sp.zoo, sp.nan):
        return 1.0
    if isinstance(e, (sp.Pow, sp.exp)):
        base, expo = (e.args[0], e.args[1]) if isinstance(e, sp.Pow) else (sp.E, e.args[0])
        db = digits_bound(base)
        if db == math.inf:
            return math.inf
        bv = _small_value(base) if db <= 40 else None
        if bv is not None and bv in (0, 1, -1):  # 1^{huge} is 1; (-1)^n, 0^n stay small
            return 1.0 + digits_bound(expo)
        if expo.free_symbols:
            return db + digits_bound(expo)
        dx = digits_bound(expo)
        if dx > 20:
            return math.inf
        xv = _small_value(expo)
        if xv is None:  # an irrational exponent (2^{\sqrt 2}): its magnitude
            try:
                mag = abs(complex(expo.evalf(20)))
            except (TypeError, ValueError):
                return math.inf
        else:
            mag = abs(float(xv))
        return max(1.0, math.ceil(mag)) * max(db, 1.0) + 1.0
    if isinstance(e, (sp.factorial, sp.binomial, sp.gamma, sp.factorial2, sp.RisingFactorial, sp.FallingFactorial)):
        args_bound = sum(digits_bound(a) for a in e.args)
        if args_bound > 20:
            return math.inf
        n = _small_value(e.args[0]) if not e.args[0].free_symbols else None
        if n is None:
            return args_bound + 1.0
        n_abs = abs(float(n))
        return math.lgamma(n_abs + 2.0) / _LN10 + 1.0 + args_bound
    total = 1.0
    for a in e.args:
        if not hasattr(a, "args"):
            continue
        total += digits_bound(a)
        if total == math.inf:
            return total
    return total


def has_huge(e) -> bool:
    """Whether ``e`` holds a power, exponential, factorial or binomial whose exact value is over
    :data:`MAX_DIGITS` digits (by :func:`digits_bound`); then nothing in it may be evaluated."""
    sp = _sympy()
    kinds = (sp.Pow, sp.exp, sp.factorial, sp.binomial, sp.gamma, sp.factorial2, sp.RisingFactorial,
             sp.FallingFactorial)
    if not isinstance(e, sp.Basic):
        return False
    for node in sp.preorder_traversal(e):
        if isinstance(node, kinds) and digits_bound(node) > MAX_DIGITS:
            return True
    return False


def _exact_root(v: Fraction, q: int) -> Fraction | None:
    """``v^(1/q)`` when it is rational (``v >= 0``), else None."""
    from sympy import integer_nthroot

    if v < 0:
        return None
    rn, exact_n = integer_nthroot(v.numerator, q)
    rd, exact_d = integer_nthroot(v.denominator, q)
    return Fraction(int(rn), int(rd)) if exact_n and exact_d else None


def rational_value(e) -> Fraction | None:
    """The exact rational value of a symbol-free, Float-free sympy expression, or None when it is irrational
    or holds something other than integers, fractions, sums, products, powers, factorials and binomials.
    Call only under :func:`digits_bound` ``<=`` :data:`MAX_DIGITS` (nothing here bounds sizes)."""
    sp = _sympy()
    if isinstance(e, sp.Integer):
        return Fraction(int(e.p))
    if isinstance(e, sp.Rational):
        return Fraction(int(e.p), int(e.q))
    if isinstance(e, sp.UnevaluatedExpr):
        return rational_value(e.args[0])
    if isinstance(e, (sp.Add, sp.Mul)):
        acc = Fraction(0) if isinstance(e, sp.Add) else Fraction(1)
        for a in e.args:
            v = rational_value(a)
            if v is None:
                return None
            acc = acc + v if isinstance(e, sp.Add) else acc * v
        return acc
    if isinstance(e, sp.Pow):
        base, expo = rational_value(e.args[0]), rational_value(e.args[1])
        if base is None or expo is None:
            return None
        if base == 0:
            return Fraction(0) if expo > 0 else None
        if expo.denominator != 1:
            root = _exact_root(base, expo.denominator)
            if root is None:
                return None
            base, expo = root, Fraction(expo.numerator)
        return base ** int(expo)
    if isinstance(e, sp.factorial):
        n = rational_value(e.args[0])
        return Fraction(math.factorial(int(n))) if n is not None and n.denominator == 1 and n >= 0 else None
    if isinstance(e, sp.binomial):
        n, k = rational_value(e.args[0]), rational_value(e.args[1])
        if n is None or k is None or n.denominator != 1 or k.denominator != 1 or n < 0 or k < 0:
            return None
        return Fraction(math.comb(int(n), int(k)))
    return None


def is_exact(e) -> bool:
    """A plain number expression with no decimal (Float), percent, infinity or undefined part (sets,
    tuples, relations and matrices are not: math-verify compares their elements, which come back here)."""
    sp = _sympy()
    if not isinstance(e, sp.Expr) or isinstance(e, (sp.MatrixBase, sp.MatrixExpr)):
        return False
    if e.atoms(sp.Float) or e.has(sp.oo, -sp.oo, sp.zoo, sp.nan):
        return False
    if e.has(sp.UnevaluatedExpr(sp.Rational(1, 100))):  # a percent sign: math-verify's rule (case V4)
        return False
    return not e.atoms(sp.core.function.AppliedUndef)


def _evalf_or_zero(e, digits: int):
    """``e`` to ``digits`` significant digits, or exactly 0 when sympy cannot find a single one of them: ``e`` is
    zero to its working precision (``\\sin(\\pi)``, ``\\sqrt{2} - \\sqrt{2}`` unevaluated; a plain ``evalf`` gives
    them as ``0.e-181``, which compares unequal to 0 and to each other). A non-zero value that the digit bound
    counts for (``e^{-1000} + 1 - 1``: bound 1006, so 1046 digits) is resolved, not taken for 0."""
    from sympy.core.evalf import PrecisionExhausted

    try:
        return e.evalf(digits, strict=True)
    except PrecisionExhausted:
        return _sympy().Integer(0)


def exact_equal(a, b) -> bool | None:
    """Exact verdict on two sympy expressions, or None when the exact rule does not apply (module docstring).

    Both exact and symbol-free: True/False decided exactly (rationals) or to ``P`` digits (irrationals); over
    the size bound: False (they were not identical as written). Exact with symbols: None (math-verify's
    symbolic test decides).
    """
    if not (is_exact(a) and is_exact(b)) or a.free_symbols or b.free_symbols:
        return None
    da, db = digits_bound(a), digits_bound(b)
    if max(da, db) > MAX_DIGITS:
        return a == b
    va, vb = rational_value(a), rational_value(b)
    if va is not None and vb is not None:
        return va == vb
    digits = int(40 + max(da, db))
    try:
        sa, sb = _evalf_or_zero(a, digits), _evalf_or_zero(b, digits)
        diff, scale = abs(sa - sb), max(abs(sa), abs(sb))
        if scale == 0:
            return True
        return bool(diff <= scale * _sympy().Rational(1, 10 ** (digits - 10)))
    except (TypeError, ValueError, OverflowError, ArithmeticError):  # not a number after all: math-verify
        return None


def _install() -> None:
    import math_verify.grader as grader

    orig_numeric, orig_symbolic = grader.sympy_numeric_eq, grader.sympy_symbolic_eq

    def numeric_eq(a, b, float_rounding, numeric_precision):
        verdict = exact_equal(a, b)
        if verdict is not None:
            return verdict
        if is_exact(a) and is_exact(b):  # exact with symbols: no chopped float test; symbolic decides
            return False
        return orig_numeric(a, b, float_rounding, numeric_precision)

    def symbolic_eq(a, b):
        verdict = exact_equal(a, b)
        return orig_symbolic(a, b) if verdict is None else verdict

    _STATE["orig"] = (orig_numeric, orig_symbolic)
    grader.sympy_numeric_eq, grader.sympy_symbolic_eq = numeric_eq, symbolic_eq


def _uninstall() -> None:
    import math_verify.grader as grader

    grader.sympy_numeric_eq, grader.sympy_symbolic_eq = _STATE.pop("orig")  # type: ignore[misc]


@contextmanager
def exact_numbers() -> Iterator[None]:
    """Within the block, math-verify's ``verify`` compares exact numbers exactly (module docstring).

    Errors: ``AttributeError`` when the installed math-verify lacks ``grader.sympy_numeric_eq`` /
    ``sympy_symbolic_eq`` (the functions this rule replaces; pinned for 0.9.0).
    """
    with _LOCK:
        if _STATE["depth"] == 0:
            _install()
        _STATE["depth"] = int(_STATE["depth"]) + 1  # type: ignore[arg-type]
    try:
        yield
    finally:
        with _LOCK:
            _STATE["depth"] = int(_STATE["depth"]) - 1  # type: ignore[arg-type]
            if _STATE["depth"] == 0:
                _uninstall()
