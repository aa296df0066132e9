"""Load-time gold checks (case V15): rows whose gold the recipe's verifier cannot use are found before training.

A gold the verifier cannot parse (a prose sentence, ``Anya needs to climb one floor``, for a math data set)
scores every completion 0, or, with a lenient parser, may score 1 for nonsense: either way its group teaches
nothing or the wrong thing, silently. :func:`check_golds` parses every row's gold with the gold parser of the
recipe's first (primary) verifier, reports the unusable ones (count and up to :data:`EXAMPLES` examples, logged),
and drops them (``data.bad_gold: drop``) or stops the run (``data.bad_gold: error``). A row with no gold at all
(its answer field absent, null or empty: :func:`rlvr.data.datasets.gold_problem`) is unusable under the same
policy, whatever the verifier. Each gold's check has a deadline (``timeouts.gold_check_s``): a ``check_gold``
that does not return stops the load with an error naming the verifier, the row and the gold, instead of hanging.

Gold parsers (:func:`gold_checker`), in order:

1. the verifier's own ``check_gold(gold) -> str | None`` (None: usable; a string: the reason it is not); for a
   function verifier, a ``check_gold`` attribute of the function;
2. ``math`` (:class:`~rlvr_verifiers.math.MathVerifier`): :func:`math_gold_problem`;
3. ``numeric`` (:class:`~rlvr_verifiers.numeric.NumericVerifier`): :func:`numeric_gold_problem`;
4. anything else: not checked (logged once).

Golds that load but that the verifier would read wrong (issue 9, item 12) are named with the setting that fixes
them: a whole worked solution (GSM8K's reasoning ending in ``#### 18``: ``answer_format: gsm8k``, in a recipe
``data.answer_format``, in ``rlvr verify`` ``--answer-format``) and, under ``units: refuse``, a number followed
by a label (``9 (apples)``: the verifier's ``units: number`` compares its number).
"""

from __future__ import annotations

import logging
import math
import queue
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rlvr.config import RecipeError, TimeoutsConfig, VerifierSpec
from rlvr.reward.base import FunctionVerifier, build_verifier

log = logging.getLogger(__name__)

EXAMPLES = 5
"""Bad golds shown in the log and in the error message."""
DEADLINE_S = TimeoutsConfig().gold_check_s
"""Default deadline of one gold's check, seconds: the recipe default of ``timeouts.gold_check_s``."""
_COMMAND_RE = re.compile(r"\\(?:begin|end)\s*\{[^{}]*\}|\\[A-Za-z]+")
_WORD_RE = re.compile(r"(?<![A-Za-z])[A-Za-z]{2,}(?![A-Za-z])")
_GSM8K_MARK_RE = re.compile(r"####\s*(\S[^\n]*)")
_SENTENCE_END_RE = re.compile(r"[.!?](?:\s|$)")
SOLUTION_FIX_GSM8K = (
    "set answer_format: gsm8k (recipe: data.answer_format=gsm8k; rlvr verify: --answer-format gsm8k) "
    "so that the gold is the number after '####'"
)
"""The fix named for a GSM8K-style worked solution given as the gold."""
SOLUTION_FIX = (
    "set data.answer to the field that holds the final answer (rlvr verify: --gold-field), or box the final "
    "answer in the gold (\\boxed{...})"
)
"""The fix named for any other worked solution given as the gold."""
UNITS_FIX = "set the verifier's args units: number (compares its number, the label ignored), or drop the label"
_PROSE_WORDS = frozenset(
    "is are was were be been the to of needs need has have had will can should would for it this that there we "
    "so he she they his her their with in on at by".split()
)


@dataclass(frozen=True, kw_only=True)
class BadGold:
    """One unusable gold: ``index`` is the row's position in the rows given (counting from 0), ``id`` the row's
    id field (:func:`rlvr.data.datasets.row_id`; None: it has none), ``gold`` None when the row has no gold."""

    index: int
    gold: str | None
    reason: str
    id: Any = None

    def label(self) -> str:
        """``row 3 (id 'q-7'): '42' (why)``: the row, its id if any, the gold and the reason."""
        gold = "no gold" if self.gold is None else repr(self.gold[:80])
        return f"{row_label(self.index, self.id)}: {gold} ({self.reason})"


def row_label(index: int, row_id: Any = None) -> str:
    """``row 3`` or ``row 3 (id 'q-7')``: a row of the data as errors name it (counting from 0)."""
    return f"row {index}" + (f" (id {row_id!r})" if row_id is not None else "")


class GoldCheckTimeout(RecipeError):
    """A verifier's gold check did not return within its deadline (``timeouts.gold_check_s``)."""


@dataclass(frozen=True, kw_only=True)
class GoldReport:
    """Outcome of :func:`check_golds`.

    ``verifier``: the checked verifier's name; ``checked``: False when it has no gold parser (nothing was
    checked); ``total``: rows given; ``kept``: rows returned; ``bad``: every unusable gold, in row order;
    ``mode``: ``drop`` or ``error``.
    """

    verifier: str
    checked: bool
    total: int
    kept: int
    bad: tuple[BadGold, ...]
    mode: str

    def summary(self) -> str:
        """One line: how many golds are unusable and the first :data:`EXAMPLES` with their reasons."""
        if not self.bad:
            if not self.checked:
                return f"golds not checked: verifier {self.verifier!r} has no check_gold"
            return f"all {self.total} golds usable by verifier {self.verifier!r}"
        shown = "; ".join(b.label() for b in self.bad[:EXAMPLES])
        more = f"; and {len(self.bad) - EXAMPLES} more" if len(self.bad) > EXAMPLES else ""
        unchecked = "" if self.checked else f" (verifier {self.verifier!r} has no check_gold: the others unchecked)"
        return (
            f"{len(self.bad)} of {self.total} rows have no gold verifier {self.verifier!r} can use{unchecked}: "
            f"{shown}{more}"
        )


def prose_problem(answer: str) -> str | None:
    """A reason when ``answer`` reads as a sentence rather than an answer, else None.

    Prose: outside LaTeX command names, four or more words of two or more letters, or three or more with a
    function word among them (``is``, ``the``, ``to``, ``needs``...). ``\\text{Evelyn}``, ``5.4 \\text{ cents}``
    and ``Monday, Wednesday, Friday`` are answers; ``The answer is 5`` and ``Anya needs to climb one floor``
    are prose.
    """
    words = [w.lower() for w in _WORD_RE.findall(_COMMAND_RE.sub(" ", answer))]
    if len(words) >= 4 or (len(words) >= 3 and _PROSE_WORDS.intersection(words)):
        return f"reads as prose ({len(words)} words), not an answer"
    return None


def solution_problem(gold: str, has_box: bool) -> str | None:
    """A reason, with its fix, when ``gold`` is a whole worked solution rather than one final answer.

    A gold with no box is a solution when it holds a GSM8K ``####`` marker (fix: ``answer_format: gsm8k``),
    or when it reads as prose (:func:`prose_problem`) over several lines or sentences (fix: point
    ``data.answer`` at the final answer, or box it). A gold with a box is read by its box: not a solution.
    """
    if has_box:
        return None
    text = str(gold)
    mark = list(_GSM8K_MARK_RE.finditer(text))
    if mark:
        final = mark[-1].group(1).strip()
        return f"a whole worked solution, not one final answer (its answer {final[:30]!r} follows '####'): " + (
            SOLUTION_FIX_GSM8K
        )
    sentences = len(_SENTENCE_END_RE.findall(text.strip() + " "))
    if prose_problem(text) is not None and ("\n" in text.strip() or sentences >= 2):
        return f"a whole worked solution ({sentences} sentences), not one final answer: {SOLUTION_FIX}"
    return None


def math_gold_problem(verifier: Any, gold: str) -> str | None:
    """Why the ``math`` verifier cannot use ``gold`` (None: usable).

    The gold must not be a whole worked solution (:func:`solution_problem`); its answer
    (:meth:`MathVerifier.gold_answer`: its last box, cleaned; a trailing label dropped under ``units:
    number``) must be non-empty, must not be a number with a label under ``units: refuse``, must not be prose
    (:func:`prose_problem`), and the verifier's reading of it (:meth:`MathVerifier.read`: ``math_verify.parse``
    after scientific notation is rewritten, math-verify's own timeout off) must give an expression (a result
    with more than the raw string).
    """
    from rlvr_verifiers._scientific import mentions_euler
    from rlvr_verifiers.math import find_boxes
    from rlvr_verifiers.numeric import split_label

    solution = solution_problem(gold, bool(find_boxes(str(gold))))
    if solution is not None:
        return solution
    answer = verifier.gold_answer(gold)
    if not answer:
        return "empty answer"
    labelled = split_label(answer)
    if labelled is not None and verifier.units != "number":
        return f"a number followed by a label ({labelled[1]!r}) under units: refuse: {UNITS_FIX}"
    prose = prose_problem(answer)
    if prose is not None:
        return prose
    parsed = verifier.read(answer, mentions_euler(answer))  # as the verifier reads it (scientific notation)
    if not any(not isinstance(p, str) for p in parsed):
        return "math_verify.parse finds no expression in it"
    return None


def numeric_gold_problem(gold: str, units: str = "number") -> str | None:
    """Why the ``numeric`` verifier (with its ``units`` rule) cannot use ``gold`` (None: it is one finite
    number, or one number and a label under ``units: number``). A number with a label under ``units: refuse``
    names ``units: number`` as the fix; a GSM8K solution is read by its ``####`` number, so it is usable."""
    from rlvr_verifiers.numeric import gold_label, parse_gold_number

    value = parse_gold_number(gold, units)
    if value is None:
        label = gold_label(gold)
        if label is not None:
            return f"a number followed by a label ({label!r}) under units: refuse: {UNITS_FIX}"
        return "not one number"
    return None if math.isfinite(value) else "not a finite number"


def gold_checker(spec: VerifierSpec) -> Callable[[str], str | None] | None:
    """The gold parser of the verifier ``spec`` names (see the module docstring), or None when it has none.

    Builds the verifier in this process. Errors: those of :func:`rlvr.reward.base.build_verifier`.
    """
    verifier = build_verifier(spec)
    own = getattr(verifier, "check_gold", None)
    if own is None and isinstance(verifier, FunctionVerifier):
        own = getattr(verifier.fn, "check_gold", None)
    if callable(own):
        return own
    from rlvr_verifiers.math import MathVerifier
    from rlvr_verifiers.numeric import NumericVerifier

    if isinstance(verifier, MathVerifier):
        return lambda gold: math_gold_problem(verifier, gold)
    if isinstance(verifier, NumericVerifier):
        units = verifier.units
        return lambda gold: numeric_gold_problem(gold, units)
    return None


def check_golds(
    rows: Sequence[dict[str, Any]], specs: Sequence[VerifierSpec], mode: str = "drop",
    deadline_s: float = DEADLINE_S, deadline_key: str | None = "timeouts.gold_check_s",
) -> tuple[list[dict[str, Any]], GoldReport]:
    """Check every row's ``gold`` with the first verifier of ``specs``; drop or refuse the unusable ones.

    ``rows``: as :func:`rlvr.data.load_rows` returns them (each with a ``gold``; None with a ``gold_problem`` when
    the row has none: unusable whatever the verifier). Each distinct gold is parsed once, in a daemon thread with
    ``deadline_s`` seconds per gold (a hung ``check_gold`` cannot be killed; it is left behind and the load
    stops). A ``check_gold`` that raises counts as a reason (``error: <ExcType>: msg``).
    Returns ``(kept_rows, report)``: the rows whose gold is usable, in order (all rows with a gold when the
    verifier has no gold parser), and a :class:`GoldReport` (logged: a warning with the count and the first
    :data:`EXAMPLES` rows when some gold is bad).

    Errors: ``ValueError`` for a ``mode`` other than ``drop`` / ``error`` or no specs;
    :class:`~rlvr.config.RecipeError` when ``mode`` is ``error`` and some gold is bad, or when no row is left;
    :class:`GoldCheckTimeout` (a RecipeError) naming the verifier, the row, the gold and the setting
    ``deadline_key`` (None: there is none to name) when one gold's check takes longer than ``deadline_s``.
    """
    from rlvr.data.datasets import row_id

    if mode not in ("drop", "error"):
        raise ValueError(f"data.bad_gold must be 'drop' or 'error', got {mode!r}")
    if not specs:
        raise ValueError("check_golds needs at least one verifier spec")
    name = specs[0].name
    checker = gold_checker(specs[0])
    if checker is None:
        log.info("verifier %r defines no check_gold: the %d golds are not checked at load time", name, len(rows))
    golds = [row["gold"] for row in rows if row.get("gold") is not None]
    what = f"verifier {name!r}: check_gold" + (f" ({deadline_key})" if deadline_key else "")
    verdicts = _verdicts(checker, golds, deadline_s, what) if checker is not None else {}
    hung = next((g for g, v in verdicts.items() if isinstance(v, _Hung)), None)
    if hung is not None:
        i = next(i for i, row in enumerate(rows) if row.get("gold") is not None and str(row["gold"]) == hung)
        key, slow = (f" ({deadline_key})", f", or raise {deadline_key} if it is only slow") if deadline_key else ("", "")
        raise GoldCheckTimeout(
            f"verifier {name!r}: check_gold did not return within {deadline_s:g} s{key} for "
            f"{row_label(i, row_id(rows[i].get('row') or {}))}, gold {hung[:80]!r}. A check_gold must return None "
            f"or a reason promptly: fix the verifier's check_gold (or that row){slow}"
        )
    kept, bad = [], []
    for i, row in enumerate(rows):
        gold = row.get("gold")
        why = row.get("gold_problem", "no gold") if gold is None else verdicts.get(str(gold))
        if why is None:
            kept.append(row)
        else:
            bad.append(BadGold(index=i, gold=None if gold is None else str(gold), reason=str(why),
                               id=row_id(row.get("row") or {})))
    report = GoldReport(verifier=name, checked=checker is not None, total=len(rows), kept=len(kept), bad=tuple(bad),
                        mode=mode)  # fmt: skip
    if not bad:
        if checker is not None:
            log.info("%s", report.summary())
        return kept, report
    fix = "fix data.answer / data.answer_format (or the verifier's args), or the data"
    if mode == "error":
        raise RecipeError(f"{report.summary()}. data.bad_gold=error: {fix}, or set data.bad_gold=drop")
    if not kept:
        raise RecipeError(f"{report.summary()}. No row is left: {fix}")
    log.warning("%s. Dropped them (data.bad_gold=drop).", report.summary())
    return kept, report


@dataclass(frozen=True)
class _Hung:
    """The verdict of a gold whose check did not return within its deadline."""


SLOW_GOLD_S = 5.0
"""Seconds one gold's check may take before the wait for it is logged (it goes on up to its deadline)."""


def _verdicts(checker: Callable[[str], str | None], golds: Sequence[str], deadline_s: float,
              what: str = "check_gold") -> dict[str, Any]:
    """``{gold: None (usable) | reason | _Hung()}`` for each distinct gold, checked in order in one daemon thread;
    the caller waits ``deadline_s`` seconds for each (a wait past :data:`SLOW_GOLD_S` is logged, naming ``what``).
    At the first gold over its deadline the rest are left unchecked (absent) and the thread is abandoned (it cannot
    be stopped; as a daemon it does not keep the process alive)."""
    distinct = list(dict.fromkeys(str(g) for g in golds))
    results: queue.Queue = queue.Queue()

    def work() -> None:
        for gold in distinct:
            try:
                verdict = checker(gold)
            except Exception as e:  # noqa: BLE001 - a plugin's bug names the row instead of stopping the load
                verdict = f"error: {type(e).__name__}: {str(e)[:200]}"
            results.put((gold, verdict))

    threading.Thread(target=work, name="rlvr-check-gold", daemon=True).start()
    verdicts: dict[str, Any] = {}
    for gold in distinct:
        try:
            done, verdict = results.get(timeout=min(SLOW_GOLD_S, deadline_s))
        except queue.Empty:
            log.warning("%s has not returned for the gold %r after %g s: waiting up to %g s", what, gold[:80],
                        SLOW_GOLD_S, deadline_s)  # fmt: skip
            try:
                done, verdict = results.get(timeout=max(deadline_s - SLOW_GOLD_S, 0.0))
            except queue.Empty:
                verdicts[gold] = _Hung()
                break
        verdicts[done] = verdict
    return verdicts
