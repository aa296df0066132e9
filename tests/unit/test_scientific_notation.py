"""Issue 38, item 19: numbers in scientific notation (``4.5e33``, ``4.5E33``, ``1e+05``, ``4.5 \\times 10^{33}``)
are read as numbers by the ``math`` verifier on both sides (gold and answer), and Euler's e stays itself where it
is one (rlvr_verifiers._scientific).

math-verify 0.9.0 alone reads ``4.5e33`` as 4.5 * e * 33 (so ``4.5 \\times 10^{33}`` scored 0 and ``148.5e``
scored 1), ``1e+05`` as e + 5, and compares a float mantissa by rounding or a chopped float difference
(``1.5 \\times 10^{-30}`` = ``1.6 \\times 10^{-30}``). Every verdict below is worked out by hand in the comment
beside it: the two sides' values.
"""

from __future__ import annotations

import logging

import pytest

from rlvr_verifiers.math import MathVerifier, extract_answer
from rlvr_verifiers.numeric import NumericVerifier, last_number, parse_gold_number


@pytest.fixture(scope="module")
def mv() -> MathVerifier:
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return MathVerifier()


# gold, answer (boxed), right verdict
SCIENTIFIC = [
    # the item's example: gold 4.5e33 = 4.5 x 10^33 = 45 x 10^32 = 45 followed by 32 zeros
    ("4.5e33", r"4.5 \times 10^{33}", 1),
    ("4.5e33", "4.5e33", 1),
    ("4.5e33", "4.5E33", 1),
    ("4.5e33", "45e32", 1),  # 45 x 10^32 = 4.5 x 10^33
    ("4.5e33", "45" + "0" * 32, 1),
    ("4.5e33", r"4.5 \times 10^{34}", 0),  # ten times the gold
    ("4.5e33", "148.5e", 0),  # 4.5 * 33 = 148.5: equal to math-verify's misreading 4.5 * e * 33, not to 4.5e33
    ("4.5e33", "4.5e", 0),  # 4.5 e = 12.23..., not 4.5 x 10^33
    ("3.83e35", r"3.83 \times 10^{35}", 1),
    ("3.83e35", r"3.83 \cdot 10^{35}", 1),
    # the answer side: the gold in LaTeX, the answer in e-notation
    (r"4.5 \times 10^{33}", "4.5e33", 1),
    (r"4.5 \times 10^{33}", "4.5e34", 0),
    # signs: the minus of the number and of the exponent
    ("-4.5e-3", "-0.0045", 1),  # -4.5 / 1000
    ("-4.5e-3", r"-4.5 \times 10^{-3}", 1),
    ("-4.5e-3", "0.0045", 0),  # the sign differs
    ("-4.5e-3", "-0.0046", 0),
    # an explicit plus and a leading zero in the exponent (printf, Python), a zero after the point
    ("1e+05", "100000", 1),
    ("1e+05", "10^5", 1),
    ("1e+05", "10^6", 0),
    ("2.0e5", "200000", 1),
    ("2.0e5", "200001", 0),
    ("1.6e-19", r"1.6 \times 10^{-19}", 1),
    # capital E parsed before, but to a float that math-verify rounds to 6 places: 4.5e-10 and 5.5e-10 both 0
    ("4.5E-10", r"5.5 \times 10^{-10}", 0),
    ("4.5E-10", r"4.5 \times 10^{-10}", 1),
    # the LaTeX form itself, compared exactly now (both were read with a float mantissa)
    (r"1.5 \times 10^{-30}", r"1.6 \times 10^{-30}", 0),  # differ by 10^-31; math-verify's chopped difference: 1
    (r"6.02 \times 10^{23}", "602" + "0" * 21, 1),  # 602 x 10^21; math-verify's float: 0
    (r"4.5 \times 10^-3", "0.0045", 1),  # 10^-3 unbraced: math-verify could not parse the gold
    # a plain decimal answer keeps math-verify's decimal rule (6 places) against an exact gold
    ("4.5e-3", "0.0045", 1),
    ("4.5e-3", "0.0046", 0),
]


@pytest.mark.parametrize("gold, answer, right", SCIENTIFIC, ids=[f"{g} vs {a}" for g, a, _ in SCIENTIFIC])
def test_scientific_notation(mv: MathVerifier, gold: str, answer: str, right: int) -> None:
    r = mv.verify(rf"The answer is \boxed{{{answer}}}.", gold)
    assert r.score == right, r
    assert r.reason == (None if right else "wrong"), r


# Euler's number where it is written as one
EULER = [
    ("2e", "e+e", 1),  # 2e
    ("2e", "2", 0),
    ("2e", "20", 0),  # not 2 x 10^1: no exponent digits after the e
    ("e^2", r"e \cdot e", 1),
    (r"3e^{x}", r"3\exp(x)", 1),
    (r"\mathrm{e}", "e", 1),
    ("e", "e", 1),
    ("4.5e", r"\frac{9e}{2}", 1),  # 4.5 e = 9e / 2: the item's "4.5e stays Euler"
    ("4.5e", "4.5", 0),
    ("2e + 1", "1+2e", 1),  # spaced: Euler's e, never 2 x 10^1
    ("2e + 1", "20", 0),
]


@pytest.mark.parametrize("gold, answer, right", EULER, ids=[f"{g} vs {a}" for g, a, _ in EULER])
def test_euler_stays_euler(mv: MathVerifier, gold: str, answer: str, right: int) -> None:
    assert mv.verify(rf"\boxed{{{answer}}}", gold).score == right


# ``2e+1`` reads as 2 x 10^1 = 20 or as 2e + 1 = 6.44: Euler's e when Euler's e is written elsewhere on either
# side, else scientific notation (the decision in rlvr_verifiers._scientific's docstring)
AMBIGUOUS = [
    ("20", "2e+1", 1),  # no e elsewhere: 2 x 10^1
    ("2e+1", "20", 1),
    ("1+2e", "2e+1", 1),  # the gold writes Euler's e: 2e + 1
    ("2e+1", "1+2e", 1),
    ("2e+1", "2e + 1", 1),  # the answer's spaced 2e + 1 is Euler's e: the gold too
    ("20", "1+2e", 0),  # 1 + 2e = 6.44
    ("e^2 + 20", "e^2+2e+1", 0),  # Euler's e elsewhere: e^2 + 2e + 1 = 13.8, not e^2 + 20
    ("e^2 + 20", "e^2+20", 1),
    ("2e-1", "0.2", 1),  # 2 x 10^-1
    # unambiguous even beside Euler's e: a decimal mantissa, the mantissa 1
    ("e + 0.0045", "e + 4.5e-3", 1),
    (r"e + 10^{-5}", "e + 1e-5", 1),
]


@pytest.mark.parametrize("gold, answer, right", AMBIGUOUS, ids=[f"{g} vs {a}" for g, a, _ in AMBIGUOUS])
def test_ambiguous_token_read_in_context(mv: MathVerifier, gold: str, answer: str, right: int) -> None:
    assert mv.verify(rf"\boxed{{{answer}}}", gold).score == right


def test_unboxed_and_dollar_forms(mv: MathVerifier) -> None:
    # the last number of free text holds its exponent (it was 4.5, then 19: the exponent's digits)
    assert extract_answer("The mass is about 4.5e33 grams") == ("4.5e33", "last_number")
    assert mv.verify("The mass is about 4.5e33 grams", r"4.5 \times 10^{33}").score == 1.0
    assert mv.verify("so the charge is 1.6e-19 C", "1.6e-19").score == 1.0
    assert mv.verify("so the charge is 1.6e-19 C", "1.6e-18").score == 0.0
    # inside LaTeX $...$ on both sides, and a bare answer
    assert mv.verify(r"The answer is $4.5 \times 10^{33}$.", "$4.5e33$").score == 1.0
    assert mv.verify("4.5e33", r"\boxed{4.5 \times 10^{33}}").score == 1.0


def test_gold_check_reads_golds_as_the_verifier(mv: MathVerifier) -> None:
    from rlvr.reward.golds import math_gold_problem

    # 10^-3 unbraced: math-verify alone finds no expression, so the row was dropped as a bad gold
    assert math_gold_problem(mv, r"4.5 \times 10^-3") is None
    assert math_gold_problem(mv, "4.5e33") is None and math_gold_problem(mv, "2e+1") is None
    value = [x for x in mv.read("4.5e33") if not isinstance(x, str)][0]
    assert value.doit() == 45 * 10**32  # exact (an int): 4.5 x 10^33, not 4.5 * e * 33


def test_numeric_verifier_reads_the_exponent() -> None:
    nv = NumericVerifier()
    assert last_number("q = 1.6E-19 C") == "1.6E-19"  # was "19"
    assert last_number("q = 1.6e-19.") == "1.6e-19"
    assert last_number("about 2e apples") == "2"  # no exponent digits: the number 2
    assert last_number("x2e5y") is None  # glued to letters: no number at all, as before
    assert parse_gold_number("4.5e33") == 4.5e33  # was None: a bad gold
    assert parse_gold_number("1e+05 kg") == 100000.0  # a number and a label (the unit rule)
    assert nv.verify("The mass is 4.5e33", "4.5e33").score == 1.0
    assert nv.verify("The mass is 4.5e33", "4.5e34").score == 0.0
    assert nv.verify("The charge is 1.6e-19", "1.6e-19").score == 1.0


# the rewrite itself: the exact LaTeX each form becomes (M without trailing zeros)
REWRITES = [
    ("4.5e33", r"(45 \cdot 10^{32})"),
    ("4.5E33", r"(45 \cdot 10^{32})"),
    ("45e32", r"(45 \cdot 10^{32})"),
    ("-4.5e-3", r"-(45 \cdot 10^{-4})"),  # the minus stays outside
    ("1e+05", "10^{5}"),  # M = 1
    ("2.0e5", r"(2 \cdot 10^{5})"),  # 20 x 10^4 = 2 x 10^5
    ("12.50e-1", r"(125 \cdot 10^{-2})"),  # 1.25
    (".5e3", r"(5 \cdot 10^{2})"),  # 500
    ("100e0", "10^{2}"),
    ("0.0e5", "0"),
    ("3e0", "3"),  # X = 0
    (r"4.5 \times 10^{33}", r"(45 \cdot 10^{32})"),
    (r"4.5\cdot10^{-3}", r"(45 \cdot 10^{-4})"),
    (r"4.5 * 10^{33}", r"(45 \cdot 10^{32})"),
    ("4.5 \u00d7 10^{33}", r"(45 \cdot 10^{32})"),
    (r"4.5 \times 10^-3", r"(45 \cdot 10^{-4})"),
    (r"4.5 \times 10^33", r"(45 \cdot 10^{32})"),
    (r"2\times4.5\times10^{3}", r"2\times(45 \cdot 10^{2})"),
    (r"4.5e3 \times 10^{2}", r"(45 \cdot 10^{2}) \times 10^{2}"),  # one pass: the e-form only
    # left as written
    (r"x/4.5 \times 10^{3}", r"x/4.5 \times 10^{3}"),  # (x/4.5) 10^3 in LaTeX
    (r"x^2e5", r"x^2e5"),  # x^2 e 5 in LaTeX
    (r"^2e5", r"^2e5"), (r"_2e5", r"_2e5"),  # the same at the start of the text
    (r"/4.5 \times 10^{3}", r"/4.5 \times 10^{3}"),
    ("2e5 ^ ", r"(2 \cdot 10^{5}) ^ "),  # a mark after the token does not count (the scan back stops at 0)
    (r"x / 4.5 \times 10^{3}", r"x / 4.5 \times 10^{3}"), (r"x \div 4.5 \times 10^{3}", r"x \div 4.5 \times 10^{3}"),
    ("1e2.5", "1e2.5"),  # a decimal exponent is not scientific notation
    ("2e", "2e"), ("e^2", "e^2"), (r"3e^{x}", r"3e^{x}"), (r"\mathrm{e}", r"\mathrm{e}"), ("e", "e"),
    ("4.5e", "4.5e"), ("2e + 1", "2e + 1"), ("2 e+1", "2 e+1"), ("e5", "e5"),
    ("4.5 x 10^{33}", "4.5 x 10^{33}"),  # x may be a variable
]


@pytest.mark.parametrize("text, latex", REWRITES, ids=[t for t, _ in REWRITES])
def test_read_scientific(text: str, latex: str) -> None:
    from rlvr_verifiers._scientific import read_scientific

    assert read_scientific(text) == latex


def test_ambiguous_and_euler_context() -> None:
    from rlvr_verifiers._scientific import ambiguous, mentions_euler, read_scientific

    assert read_scientific("2e+1") == r"(2 \cdot 10^{1})" and read_scientific("2e+1", euler=True) == "2e+1"
    assert read_scientific("3e-2", euler=True) == "3e-2"
    # never ambiguous, so rewritten beside Euler's e too
    for text, latex in [("4.5e-3", r"(45 \cdot 10^{-4})"), ("1e-5", "10^{-5}"), ("2e-05", r"(2 \cdot 10^{-5})"),
                        ("2E+1", r"(2 \cdot 10^{1})"), ("2e10", r"(2 \cdot 10^{10})")]:
        assert read_scientific(text, euler=True) == latex, text
    assert ambiguous("2", "e", "+", "1") and ambiguous("10", "e", "-", "5")
    assert not ambiguous("4.5", "e", "-", "3")  # a decimal mantissa
    assert not ambiguous("1", "e", "-", "5")  # the mantissa 1
    assert not ambiguous("2", "e", "-", "05")  # a leading-zero exponent
    assert not ambiguous("2", "E", "+", "1")  # capital E
    assert not ambiguous("2", "e", "", "10")  # no sign
    # "2e5e" is 2 x 10^5 times e; "_2e5" (a subscript, not rewritten) is e between 2 and 5
    for text in ("2e", "e^{x}", r"\mathrm{e}", r"\exp(1)", "e", "1 + 2e", "x^2e5", "_2e5", "2e5e"):
        assert mentions_euler(text), text
    for text in ("2e+1", "4.5e33", r"\le 2", r"\ne 3", r"5 \text{ degrees}", "20"):
        assert not mentions_euler(text), text
