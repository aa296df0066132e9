"""A worked example of a user verifier (see docs/verifiers.md): short text answers such as ``golden retriever``.

A recipe names it in any of three ways::

    reward:
      verifiers:
        - name: verifiers/example_custom.py:TextAnswerVerifier   # a file and an attribute
          args: {case_sensitive: false}
        - name: rlvr_verifiers.example_custom:TextAnswerVerifier # an importable module
        - name: text-answer                                      # an entry point (docs/verifiers.md)

It shows the parts of the contract:

- ``verify(response, gold, **row) -> VerifyResult``: the completion text, the gold, and the data row's other
  fields as keywords (``**row`` must be accepted even when unused);
- never raise on model output: a bad answer is ``VerifyResult(0.0, parsed, reason)``, with a reason for every 0;
- an empty answer must not score (case V13): containment (``answer in gold``) would reward ``""``, which is
  inside every gold, so this verifier compares the whole normalised answer with the gold instead;
- ``check_gold(gold) -> str | None``: called once per row when the data loads (``rlvr.reward.golds``); None
  means usable, a string is the reason the row is dropped or the run stopped (``data.bad_gold``).

:func:`yes_no` is the same idea as a plain function (a function verifier takes no ``args`` and may return a bool
or a float; ``rlvr.reward.base`` wraps it). A function may carry a ``check_gold`` attribute too.
"""

from __future__ import annotations

import re
from typing import Any

from rlvr.types import VerifyResult

_MARKER_RE = re.compile(r"\b(?:final\s+answer|answer)\s*(?:is|:)\s*", re.IGNORECASE)
_ARTICLE_RE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)


def normalise(text: str, case_sensitive: bool = False) -> str:
    """Text without surrounding spaces, quotes, markdown ``**``, a final period, a leading article, with inner
    runs of spaces made one, lower-cased unless ``case_sensitive``."""
    s = text.replace("**", "").strip().strip("\"'`").strip()
    s = re.sub(r"[.!]+$", "", s).strip()
    s = _ARTICLE_RE.sub("", re.sub(r"\s+", " ", s))
    return s if case_sensitive else s.lower()


class TextAnswerVerifier:
    """Score 1 when the answer after the last ``Answer:`` / ``answer is`` (else the last non-blank line) equals
    the gold after :func:`normalise`; else 0 with reason ``no_answer`` (empty: case V13), ``wrong`` or
    ``bad_gold``.

    Args:
        case_sensitive: compare case as well (default: ignore case).
    """

    def __init__(self, case_sensitive: bool = False) -> None:
        self.case_sensitive = bool(case_sensitive)

    def check_gold(self, gold: str) -> str | None:
        """None for a gold with some text, else why the row cannot be scored."""
        return None if normalise(str(gold)) else "empty gold text"

    def verify(self, response: str, gold: str, **row: Any) -> VerifyResult:
        """Score one response against the text ``gold``; ``row`` is unused."""
        want = normalise(str(gold), self.case_sensitive)
        if not want:
            return VerifyResult(score=0.0, parsed=None, reason="bad_gold")
        text = str(response)
        marks = list(_MARKER_RE.finditer(text))
        if marks:
            answer = text[marks[-1].end() :].split("\n", 1)[0]
        else:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            answer = lines[-1] if lines else ""
        got = normalise(answer, self.case_sensitive)
        if not got:
            return VerifyResult(score=0.0, parsed=None, reason="no_answer")
        return VerifyResult(score=1.0 if got == want else 0.0, parsed=got, reason=None if got == want else "wrong")


def yes_no(response: str, gold: str, **row: Any) -> bool:
    """A function verifier: True when the last word ``yes`` or ``no`` of the response is the gold's."""
    words = re.findall(r"\b(yes|no)\b", str(response).lower())
    return bool(words) and words[-1] == str(gold).strip().lower()


def _yes_no_gold(gold: str) -> str | None:
    return None if str(gold).strip().lower() in ("yes", "no") else f"gold {str(gold)[:60]!r} is not yes or no"


yes_no.check_gold = _yes_no_gold  # type: ignore[attr-defined]
