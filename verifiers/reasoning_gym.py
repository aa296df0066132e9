"""reasoning-gym's own scorers as a verifier (issue 42): ``reasoning_gym`` in a recipe's ``reward.verifiers``, with
rows from ``data.source: reasoning_gym:<task>`` (:func:`rlvr.data.datasets.load_rows`), which carry each entry's
``metadata`` (its task, ``source_dataset``, and what its scorer needs).

The answer is the text of the response's last ``<answer>...</answer>`` (reasoning-gym's convention, its default
system prompt asks for it; :func:`reasoning_gym.utils.extract_answer`); the score is the task's
``score_answer(answer, entry)`` (``reasoning_gym.get_score_answer_fn``): 1 for a right answer, 0 for a wrong one,
and in between where the task gives partial credit (clamped into [0, 1]: reasoning-gym 0.1.25's ``spell_backward``
sums ``1/n`` per matching letter and scores a right word with trailing text 1.0000000000000002, where it meant 0.8).
Reasons for a 0: ``no_answer`` (no ``<answer>`` tag), ``wrong``,
``bad_row: <what>`` (a row without reasoning-gym's metadata: not from a ``reasoning_gym:`` source).

The data source checks each row at load: the task's own answer must score 1 under its scorer (else the row's gold
is bad, dropped or refused under ``data.bad_gold``).
"""

from __future__ import annotations

import re
from typing import Any

from rlvr.types import VerifyResult


def _entry(gold: str, row: dict[str, Any]) -> dict[str, Any]:
    meta = row.get("metadata")
    if not isinstance(meta, dict) or "source_dataset" not in meta:
        raise ValueError("the row has no reasoning-gym metadata (use data.source: reasoning_gym:<task>)")
    return {"question": row.get("question", ""), "answer": gold, "metadata": meta}


FALLBACKS = ("none", "last_number", "last_line")
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def fallback_answer(response: str, fallback: str) -> str | None:
    """The answer of a response without an ``<answer>`` tag: ``last_number`` the last number in it (``-12``,
    ``3.5``), ``last_line`` its last non-empty line (stripped), ``none`` nothing."""
    if fallback == "last_number":
        found = _NUMBER_RE.findall(response)
        return found[-1] if found else None
    if fallback == "last_line":
        lines = [ln.strip() for ln in response.splitlines() if ln.strip()]
        return lines[-1] if lines else None
    return None


class ReasoningGymVerifier:
    """The task's own scorer (the module docstring). ``fallback`` (``args: {fallback: ...}``): what a response
    without an ``<answer>`` tag answers: ``none`` (the default, reasoning-gym's convention: ``no_answer``),
    ``last_number`` or ``last_line`` (:func:`fallback_answer`), for models that do not write the tag yet, as
    ``math``'s ``fallback``. Errors: ``ValueError`` for another ``fallback``."""

    preload_modules = ("reasoning_gym",)

    def __init__(self, fallback: str = "none") -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"reasoning_gym verifier: fallback={fallback!r}; one of {', '.join(FALLBACKS)}")
        self.fallback = fallback

    def verify(self, response: str, gold: str, **row: Any) -> VerifyResult:
        import reasoning_gym
        from reasoning_gym.utils import extract_answer

        try:
            entry = _entry(gold, row)
        except ValueError as e:
            return VerifyResult(score=0.0, parsed=None, reason=f"bad_row: {e}")
        answer = extract_answer(response)
        if answer is None:
            answer = fallback_answer(response, self.fallback)
        if answer is None:
            return VerifyResult(score=0.0, parsed=None, reason="no_answer")
        raw = float(reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])(answer, entry))
        score = min(1.0, max(0.0, raw))  # float sums of partial credit can land a hair outside [0, 1]
        return VerifyResult(score=score, parsed=answer, reason=None if score > 0 else "wrong")
