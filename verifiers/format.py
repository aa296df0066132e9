"""Format shaping: score 1 when a response has the required structure, else 0 with the missing parts named.

Meant as a small extra term next to a correctness verifier (a recipe gives it a weight such as 0.1), never
alone: it does not look at the gold. Requirements (constructor flags, at least one):

- ``think``: a ``<think>...</think>`` block with non-blank content, followed by non-blank text (the answer);
- ``boxed``: a complete ``\\boxed{...}`` (or ``\\fbox{...}``) with non-blank content, after ``</think>`` when
  ``think`` is also required (a box inside the reasoning is not the answer);
- ``answer_tag``: an ``<answer>...</answer>`` with non-blank content, after ``</think>`` when ``think`` is
  also required.

Empty parts never count (case V13: an empty answer earns nothing): ``<think></think>``, ``\\boxed{}`` and
``<answer> </answer>`` are "missing". Reason for a 0: ``missing: <parts>`` (e.g. ``missing: think, boxed``).
``parsed`` lists the parts found (``think,boxed``), or None.
"""

from __future__ import annotations

import re
from typing import Any

from rlvr.types import VerifyResult
from rlvr_verifiers.math import find_boxes

_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class FormatVerifier:
    """Score 1 when every required part is present (see the module docstring), else 0.

    Args:
        think: require a non-empty ``<think>...</think>`` block before a non-empty answer.
        boxed: require a non-empty ``\\boxed{...}``.
        answer_tag: require a non-empty ``<answer>...</answer>``.

    Errors: ``ValueError`` at construction when no part is required. ``verify`` never raises.
    """

    def __init__(self, think: bool = False, boxed: bool = False, answer_tag: bool = False) -> None:
        if not (think or boxed or answer_tag):
            raise ValueError("the format verifier needs at least one of think, boxed, answer_tag set to true")
        self.think, self.boxed, self.answer_tag = bool(think), bool(boxed), bool(answer_tag)

    def check_gold(self, gold: str) -> str | None:
        """Always None: the format verifier ignores the gold."""
        return None

    def verify(self, response: str, gold: str, **row: Any) -> VerifyResult:
        """Score the structure of ``response``; ``gold`` and ``row`` are ignored."""
        try:
            text = str(response)
            found, missing = [], []
            tail = text
            if self.think:
                m = _THINK_RE.search(text)
                ok = m is not None and bool(m.group(1).strip()) and bool(text[m.end() :].strip())
                (found if ok else missing).append("think")
                tail = text[m.end() :] if m is not None else ""
            if self.boxed:
                ok = any(content.strip() for _, _, content in find_boxes(tail))
                (found if ok else missing).append("boxed")
            if self.answer_tag:
                ok = any(content.strip() for content in _ANSWER_TAG_RE.findall(tail))
                (found if ok else missing).append("answer_tag")
            parsed = ",".join(found) or None
            if missing:
                return VerifyResult(score=0.0, parsed=parsed, reason="missing: " + ", ".join(missing))
            return VerifyResult(score=1.0, parsed=parsed)
        except Exception as e:  # noqa: BLE001 - untrusted input must not raise (DESIGN: Seams)
            return VerifyResult(score=0.0, parsed=None, reason=f"error: {type(e).__name__}: {str(e)[:200]}")
