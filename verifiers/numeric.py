"""Numeric answers: the number after ``#### `` (GSM8K style), else the last number in the text.

Also the number-reading rules shared with :mod:`rlvr_verifiers.math`:

- A comma is a thousands separator only between digit groups of exactly three after a first group of one to
  three digits that does not start with 0: ``1,000`` and ``12,345.5`` are numbers (case V8), ``1,0`` and
  ``0,100`` are two numbers (case V6).
- A minus sign belongs to the number only when it does not follow a word character, a closing bracket or a
  dot (``5-3`` holds 5 and 3, ``x = -3`` holds -3); the Unicode minus ``−`` counts as ``-``.
- ``a/b`` is one number (a fraction); ``$`` (currency) and ``%`` around a number are ignored.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from rlvr.types import VerifyResult

NUMBER_RE = re.compile(
    r"(?<![\w.])(?:(?<![\w.)])-)?"  # a sign only after a non-word, non-')' character
    r"(?:(?:[1-9]\d{0,2}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"  # thousands groups (V8) or digits (V6)
    r"(?:/\d+(?:\.\d+)?)?"  # a/b
)
"""One number token in free text (see the module docstring for the rules)."""

_MARKER_RE = re.compile(r"####")
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


def to_float(token: str) -> float | None:
    """Value of a number token (``"-3"``, ``"1000.5"``, ``"3/4"``); None for a zero denominator or junk."""
    try:
        if "/" in token:
            return float(Fraction(token))  # exact for decimals in either part
        return float(token)
    except (ValueError, ZeroDivisionError):
        return None


def parse_gold_number(gold: str) -> float | None:
    """The gold as a float when the whole gold is one number (``"1,000"``, ``"$5"``, ``"18.0"``, ``"-2"``,
    ``"3/4"``, ``"#### 42"``, ``"28%"``); None otherwise."""
    text = normalize_text(str(gold)).replace("\\%", "%").strip()  # LaTeX 28\% (case V4)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    text = text.strip().strip("$").strip().rstrip(".%").strip()
    m = NUMBER_RE.fullmatch(text)
    return to_float(number_token(m.group(0))) if m else None


class NumericVerifier:
    """Compares the response's number with a numeric gold.

    The response's number is the one after the last ``#### `` marker if the response has one (a marker with no
    number after it is ``no_answer``), else the last number in the text. Correct when
    ``|pred - gold| <= tolerance * max(1, |gold|)`` (relative tolerance, with an absolute floor of ``tolerance``
    near 0).

    Scores 1 or 0; reasons ``no_answer`` (no number found), ``wrong``, ``bad_gold`` (the gold is not one
    number). Never raises on model output. Errors: ``ValueError`` at construction for a negative tolerance.
    """

    def __init__(self, tolerance: float = 1e-6) -> None:
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        self.tolerance = float(tolerance)

    def extract(self, response: str) -> str | None:
        """The answer token of a response (``"1000"``, ``"-3"``, ``"3/4"``) or None."""
        found, token = marked_number(response)
        return token if found else last_number(response)

    def verify(self, response: str, gold: str, **row: object) -> VerifyResult:
        """Score one response against ``gold``; ``row`` (the data row's other fields) is ignored."""
        want = parse_gold_number(gold)
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
