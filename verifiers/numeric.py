"""Numeric answers: the number after ``#### `` (GSM8K style), else the last number in the text.

Also the number-reading rules shared with :mod:`rlvr_verifiers.math`:

- A comma is a thousands separator only between digit groups of exactly three after a first group of one to
  three digits that does not start with 0: ``1,000`` and ``12,345.5`` are numbers (case V8), ``1,0`` and
  ``0,100`` are two numbers (case V6).
- A minus sign belongs to the number only when it does not follow a word character, a closing bracket or a
  dot (``5-3`` holds 5 and 3, ``x = -3`` holds -3); the Unicode minus ``−`` counts as ``-``.
- ``a/b`` is one number (a fraction); ``$`` (currency) and ``%`` around a number are ignored.
- Scientific notation is one number: ``4.5e33``, ``1.6E-19``, ``1e+05`` (the exponent written with no space,
  not followed by a letter or digit); ``numeric`` reads ``2e+1`` as 20 (Euler's e is the ``math`` verifier's
  business: :mod:`rlvr_verifiers._scientific`). Before, ``1.6e-19`` held the numbers 1.6 and 19.
- **Unit rule** (``units="number"``, the default of ``numeric`` and ``math``): a gold that is one number
  followed by a label (:func:`split_label`: ``9 (apples)``, ``5 cents``, ``12 km/h``, ``18 \\text{ dollars}``)
  is that number; the label is not compared and units are not converted (``180 minutes`` is not ``3 hours``).
  Every label form counts (issue 23): one-letter units (``42 (g)``), words math-verify reads as products of
  symbols (``42 (times)``), ratios (``12 (m/s)``); a label of one- or two-letter words only is made of
  :data:`UNIT_SYMBOLS`, so ``2 xy``, ``2(x)`` and ``3 (x)`` keep their meaning.
  ``units="refuse"``: such a gold is a bad gold at load time (``rlvr.reward.golds``), with this setting as the
  fix.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from rlvr.types import VerifyResult

NUMBER_RE = re.compile(
    r"(?<![\w.])(?:(?<![\w.)])-)?"  # a sign only after a non-word, non-')' character
    r"(?:(?:[1-9]\d{0,2}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"  # thousands groups (V8) or digits (V6)
    r"(?:[eE][+-]?\d+(?![\w]|\.\d))?"  # an exponent: 4.5e33, 1.6E-19, 1e+05 (issue 38, item 19)
    r"(?:/\d+(?:\.\d+)?)?"  # a/b
)
"""One number token in free text (see the module docstring for the rules)."""

_MARKER_RE = re.compile(r"####")
UNITS = ("number", "refuse")
"""Values of the ``units`` argument of ``numeric`` and ``math`` (see the module docstring)."""
_LABEL_WORDS = r"[A-Za-z][A-Za-z'.]*(?:(?:\s+|\s*[/-]\s*)[A-Za-z][A-Za-z'.]*)*(?:\^?[23]|[\u00b2\u00b3])?"
_LABEL_RE = re.compile(
    r"(?P<number>-?\$?\s*(?:" + NUMBER_RE.pattern + r"|\\d?frac\s*\{-?\d+\}\s*\{\d+\}))\$?"
    r"(?:\s*\((?P<paren>\s*" + _LABEL_WORDS + r"\s*)\)|\s*\\(?:text|textrm|mbox|mathrm)\s*\{(?P<tex>\s*"
    + _LABEL_WORDS + r"\s*)\}|\s+(?P<bare>" + _LABEL_WORDS + r"))\s*\.?"
)
_NOT_LABELS = frozenset("or and to times plus minus over divided percent percentage per cent".split())
UNIT_SYMBOLS = frozenset(
    "g m s h l L K N J W V "  # one letter: SI / common symbols (``t``, ``A``, ``C``, ``F``, ``T`` read as variables)
    "cm mm km dm nm um kg mg mL ml cL cl dL dl kL hr ft in yd mi lb oz kW MW Hz mA mV kV kJ kN ha ac pt qt gal "
    "GB MB KB kB TB Gb Mb kb yr wk mo pm am sq cu fl AU au ly".split()
)
"""Unit symbols of one or two letters: a label whose words are all this short must be made of them (``42 (g)``,
``5 (cm)``, ``12 (m/s)``), so that ``2 xy`` and ``2(ab)`` stay products (case-sensitive: ``42 (L)`` litres)."""
_VERBS = frozenset("is are was were be been has have had will can should would needs need".split())
_AFTER_MARKER_RE = re.compile(r"[\s$*:]*")  # allowed between '####' and its number


def normalize_text(text: str) -> str:
    """Unicode minus to ``-``, ``\\$`` and ``{,}`` (LaTeX currency and thousands separator) to plain forms."""
    return text.replace("\u2212", "-").replace("\\$", "$").replace("{,}", ",")


def number_token(text: str) -> str:
    """A number token as plain text: thousands separators dropped (``"1,000.5"`` -> ``"1000.5"``)."""
    return text.replace(",", "")


def last_number(text: str) -> str | None:
    """The last number token of ``text`` with its thousands separators dropped, or None if there is none."""
    found = NUMBER_RE.findall(normalize_text(text))
    return number_token(found[-1]) if found else None


def marked_number(text: str) -> tuple[bool, str | None]:
    """The number after the last ``####`` marker.

    Returns ``(marker_found, number)``; ``number`` is None when the marker is not followed (past spaces, ``$``,
    ``*``, ``:``) by a number. The whole rest of the text is searched, so text after the answer does not hide
    it (case V5: no fixed tail window).
    """
    text = normalize_text(text)
    marks = list(_MARKER_RE.finditer(text))
    if not marks:
        return False, None
    pos = marks[-1].end()
    pos = _AFTER_MARKER_RE.match(text, pos).end()
    m = NUMBER_RE.match(text, pos)
    return True, (number_token(m.group(0)) if m else None)


def split_label(text: str, known: str | None = None, numeric: bool = False) -> tuple[str, str] | None:
    """``(number, label)`` when ``text`` is one number followed by a label, else None.

    The number: a number token (``9``, ``-2.5``, ``1,000``, ``3/4``, ``$5``) or ``\\frac{a}{b}``; the label:
    words of letters (``apples``, ``km/h``, ``square feet``, ``cm^2``), bare, in parentheses or in
    ``\\text{}`` / ``\\mbox{}`` / ``\\mathrm{}``, that is
    - not a phrase with a verb or of more than four words (``42 is the answer``: None), nor a percent word
      (``28 percent`` keeps the percent rule, case V4);
    - not a joining word followed by more (``2 times x``, ``5 per cent``: None; ``2 times`` alone is a label);
    - when every word has one or two letters, made of :data:`UNIT_SYMBOLS` (``42 (g)``, ``5 (cm)``, ``12 (m/s)``;
      ``2 xy``, ``2(ab)``, ``3 (x)``: None), and, with only one-letter words, in parentheses after a space
      (``42 (g)``; ``2(m)``: None) or in ``\\text{}``, or bare only as a ratio (``12 m/s``; ``6 m``: None, it
      may be an algebra answer).
    ``known``: a label (the gold's) accepted as it is, whatever its form (an answer ``42 L`` to the gold
    ``42 (L)`` is 42). ``numeric``: the text can only be a number (a ``numeric`` gold, never algebra), so a
    bare one-letter unit is a label too (``42 g``, ``42 m^2``). ``"9 (apples)"`` -> ``("9", "apples")``; ``"5 m"``, ``"3x"``, ``"2 \\sqrt{2}"`` -> None.
    """
    text = text.strip()
    m = _LABEL_RE.fullmatch(text)
    if m is None:
        return None
    label = (m.group("paren") or m.group("tex") or m.group("bare") or "").strip().rstrip(".").strip()
    number = m.group("number").replace("$", "").strip()
    if known is not None and _label_key(label) == _label_key(known):
        return number, label
    words = re.findall(r"[A-Za-z]+", label)
    if not words or len(words) > 4:
        return None
    if _VERBS.intersection(w.lower() for w in words):  # ``42 is the answer``: a sentence, not a label
        return None
    if any(w.lower() in ("percent", "percentage") for w in words):
        return None
    if words[0].lower() in _NOT_LABELS and len(words) > 1:  # ``2 times x``, ``5 per cent``; ``2 times`` a label
        return None
    paren, bare = m.group("paren") is not None, m.group("bare") is not None
    if all(len(w) <= 2 for w in words):  # short words: unit symbols only (``2 xy`` is a product)
        if not all(w in UNIT_SYMBOLS for w in words):
            return None
        if all(len(w) == 1 for w in words):  # ``42 (g)``, ``42 \text{ g}``, ``12 m/s``; not ``2(m)``, ``6 m``
            if paren and not re.search(r"\s", text[m.end("number") : m.start("paren")]):
                return None
            if bare and "/" not in label and not numeric:
                return None
    return number, label


def _label_key(label: str) -> str:
    return re.sub(r"[\s.]+", "", label).lower()


def to_float(token: str) -> float | None:
    """Value of a number token (``"-3"``, ``"1000.5"``, ``"3/4"``); None for a zero denominator or junk."""
    try:
        if "/" in token:
            return float(Fraction(token))  # exact for decimals in either part
        return float(token)
    except (ValueError, ZeroDivisionError):
        return None


def _gold_text(gold: str) -> str:
    text = normalize_text(str(gold)).replace("\\%", "%").strip()  # LaTeX 28\% (case V4)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return text.strip().strip("$").strip().rstrip(".%").strip()


def gold_label(gold: str) -> str | None:
    """The label after a numeric gold's number (``"9 (apples)"`` -> ``"apples"``, ``"42 g"`` -> ``"g"``), or None
    when it has none."""
    found = split_label(_gold_text(gold), numeric=True)
    return found[1] if found else None


def parse_gold_number(gold: str, units: str = "number") -> float | None:
    """The gold as a float when the whole gold is one number (``"1,000"``, ``"$5"``, ``"18.0"``, ``"-2"``,
    ``"3/4"``, ``"#### 42"``, ``"28%"``), or, with ``units="number"``, one number followed by a label
    (``"9 (apples)"`` -> 9.0, ``"42 g"`` -> 42.0: :func:`split_label` with ``numeric``); None otherwise."""
    text = _gold_text(gold)
    m = NUMBER_RE.fullmatch(text)
    if m is None and units == "number":
        found = split_label(text, numeric=True)
        m = NUMBER_RE.fullmatch(found[0].strip("$ ")) if found else None
    return to_float(number_token(m.group(0))) if m else None


class NumericVerifier:
    """Compares the response's number with a numeric gold.

    The response's number is the one after the last ``#### `` marker if the response has one (a marker with no
    number after it is ``no_answer``), else the last number in the text. Correct when
    ``|pred - gold| <= tolerance * max(1, |gold|)`` (relative tolerance, with an absolute floor of ``tolerance``
    near 0).

    Scores 1 or 0; reasons ``no_answer`` (no number found), ``wrong``, ``bad_gold`` (the gold is not one
    number). Never raises on model output.

    Args:
        tolerance: relative tolerance (default 1e-6).
        units: ``"number"`` (default): a gold of one number and a label (``9 (apples)``) is that number (the
            unit rule of the module docstring); ``"refuse"``: such a gold is ``bad_gold`` (and refused at load).

    Errors: ``ValueError`` at construction for a negative tolerance or an unknown ``units``.
    """

    def __init__(self, tolerance: float = 1e-6, units: str = "number") -> None:
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        if units not in UNITS:
            raise ValueError(f"units must be one of {', '.join(map(repr, UNITS))}, got {units!r}")
        self.tolerance = float(tolerance)
        self.units = units

    def extract(self, response: str) -> str | None:
        """The answer token of a response (``"1000"``, ``"-3"``, ``"3/4"``) or None."""
        found, token = marked_number(response)
        return token if found else last_number(response)

    def verify(self, response: str, gold: str, **row: object) -> VerifyResult:
        """Score one response against ``gold``; ``row`` (the data row's other fields) is ignored."""
        want = parse_gold_number(gold, self.units)
        if want is None or not math.isfinite(want):
            return VerifyResult(score=0.0, parsed=None, reason="bad_gold")
        token = self.extract(str(response))
        if token is None:
            return VerifyResult(score=0.0, parsed=None, reason="no_answer")
        got = to_float(token)
        if got is None:
            return VerifyResult(score=0.0, parsed=token, reason="wrong")
        if abs(got - want) <= self.tolerance * max(1.0, abs(want)):
            return VerifyResult(score=1.0, parsed=token)
        return VerifyResult(score=0.0, parsed=token, reason="wrong")
