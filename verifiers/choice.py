"""Multiple choice: the response's final letter (A, B, C, ...) against a gold letter.

Valid letters: the first ``choices`` capital letters (default 5: A-E), or as many as the row's ``choices`` or
``options`` list holds when it has one. The gold is one valid letter, possibly written ``(B)``, ``B)``,
``B.`` or ``b``.

Extraction (the whole response is read; the last match wins):

1. the last complete ``\\boxed{...}`` (``\\boxed{B}``, ``\\boxed{\\text{(B)}}``);
2. else the last answer marker: ``answer is``, ``answer:``, ``correct option is``, ``correct choice is``
   (any case; markdown ``**`` ignored), read up to the end of its sentence or a ``because`` / ``since``;
3. else a last line that is a lone letter: ``B``, ``(B)``, ``**B.**``.

The letters of the final answer are its capital letters that stand alone (``(B)``, ``B``, ``B.``; not the
``T`` of ``The``). Letters past the valid range are ignored when a valid one is present (the ``I`` of
``Answer: I think B`` with A-E). Hedging: an answer naming more than one distinct valid letter
(``\\boxed{A, C}``, ``the answer is A or B``) scores 0 with reason ``hedged``.

Reasons for a 0: ``no_answer`` (nothing found, an empty box, an empty response: case V13), ``hedged``,
``invalid_choice: <X>`` (a letter past the valid range), ``wrong``, ``bad_gold`` (the gold is not one valid
letter).
"""

from __future__ import annotations

import re
import string
from typing import Any

from rlvr.types import VerifyResult
from rlvr_verifiers.math import find_boxes

_MARKER_RE = re.compile(
    r"\b(?:answer\s*(?:is|:|=)|correct\s+(?:option|choice|letter)\s+is|(?:option|choice)\s*:)", re.IGNORECASE
)
_SENTENCE_END_RE = re.compile(r"[.;!?](?:\s|$)|\n|\b(?:because|since|as|which|so)\b", re.IGNORECASE)
# a capital letter standing alone: not inside a word, and not the first letter of a capitalised word
_LETTER_RE = re.compile(r"(?<![A-Za-z\\])([A-Z])(?![A-Za-z])")
_LONE_LINE_RE = re.compile(r"[\s*_(\[{$]*(?:\\text\{)?\(?([A-Z])\)?\}?[\s*_.)\]}$:]*")
_GOLD_RE = re.compile(r"\(?([A-Za-z])\)?[.:]?")
_WRAPPER_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")


def _answer_text(text: str) -> str | None:
    """The final answer's text (box, marker sentence or lone-letter line), or None."""
    boxes = find_boxes(text)
    if boxes:
        return boxes[-1][2]
    marks = list(_MARKER_RE.finditer(text))
    if marks:
        rest = text[marks[-1].end() :]
        return _SENTENCE_END_RE.split(rest, maxsplit=1)[0] if rest.strip() else None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines:
        m = _LONE_LINE_RE.fullmatch(lines[-1])
        if m:
            return m.group(1)
    return None


def answer_letters(response: str) -> list[str]:
    """The distinct standalone capital letters of the response's final answer, in order (empty: none)."""
    text = _answer_text(str(response).replace("**", ""))
    if text is None:
        return []
    text = _WRAPPER_RE.sub(r"\1", text)
    return list(dict.fromkeys(_LETTER_RE.findall(text)))


class ChoiceVerifier:
    """Score 1 when the response's one final letter equals the gold letter, else 0 (module docstring).

    Args:
        choices: number of options, 1-26 (A.. the choices-th letter); a row's ``choices`` or ``options``
            list overrides it.

    Errors: ``ValueError`` at construction for ``choices`` outside 1-26. ``verify`` never raises.
    """

    def __init__(self, choices: int = 5) -> None:
        if not 1 <= int(choices) <= 26:
            raise ValueError(f"choices must be between 1 and 26, got {choices!r}")
        self.choices = int(choices)

    def valid_letters(self, row: dict[str, Any] | None = None) -> str:
        """The valid letters for a row (``"ABCDE"`` by default)."""
        options = (row or {}).get("choices", (row or {}).get("options"))
        n = len(options) if isinstance(options, (list, tuple, dict)) and 1 <= len(options) <= 26 else self.choices
        return string.ascii_uppercase[:n]

    def gold_letter(self, gold: str, row: dict[str, Any] | None = None) -> str | None:
        """The gold as one valid capital letter, or None."""
        m = _GOLD_RE.fullmatch(str(gold).strip())
        letter = m.group(1).upper() if m else None
        return letter if letter is not None and letter in self.valid_letters(row) else None

    def check_gold(self, gold: str) -> str | None:
        """None when the gold is one letter among the first ``choices``, else the reason."""
        if self.gold_letter(gold) is None:
            return f"gold {str(gold)[:60]!r} is not one of the letters {self.valid_letters()}"
        return None

    def verify(self, response: str, gold: str, **row: Any) -> VerifyResult:
        """Score one response against the gold letter; ``row`` may hold ``choices`` / ``options``."""
        try:
            want = self.gold_letter(gold, row)
            if want is None:
                return VerifyResult(score=0.0, parsed=None, reason="bad_gold")
            valid = self.valid_letters(row)
            letters = answer_letters(str(response))
            in_range = [c for c in letters if c in valid]
            if not letters:
                return VerifyResult(score=0.0, parsed=None, reason="no_answer")
            if len(in_range) > 1:
                return VerifyResult(score=0.0, parsed=", ".join(in_range), reason="hedged")
            if not in_range:
                return VerifyResult(score=0.0, parsed=letters[-1], reason=f"invalid_choice: {letters[-1]}")
            got = in_range[0]
            if got != want:
                return VerifyResult(score=0.0, parsed=got, reason="wrong")
            return VerifyResult(score=1.0, parsed=got)
        except Exception as e:  # noqa: BLE001 - untrusted input must not raise (DESIGN: Seams)
            return VerifyResult(score=0.0, parsed=None, reason=f"error: {type(e).__name__}: {str(e)[:200]}")
