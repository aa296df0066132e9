"""Math answers checked with math-verify (Hugging Face), after our own answer extraction.

Extraction (:func:`extract_answer`) reads the whole response, with no fixed tail window (case V5):

1. The last complete ``\\boxed{...}`` or ``\\fbox{...}``, found by brace-balanced scanning (cases V9, V10,
   V11); a box cut off by the token limit is not an answer. Boxes that end the response joined only by
   "or", "and", commas or spacing (``\\boxed{3} or \\boxed{7}``) are read together as one list of candidates.
2. With no box: the configured ``answer_pattern`` (a regex; its first group, or the whole match, of the last
   match), then, with ``fallback="last_number"``, an answer marker (``#### 42``, ``Answer: 42``,
   ``the final answer is $x$``), a response that ends with a math span (``... $\\frac{1}{2}$.``), a response
   that is one expression with no prose (``\\frac{10}{9}``), and at last the last number in the text (the
   small models we train rarely box), or the whole last math span when that number lies inside it
   (``Thus $x \\geq 5$ is the solution.`` -> ``x \\geq 5``; ``... is $(7, 6)$. <|im_start|>`` -> ``(7, 6)``).
   ``fallback="none"`` stops after the pattern.

The extracted text is cleaned of wrappers (``$``, ``\\(``, ``\\text{}``, ``\\textbf{}``, markdown ``**``;
cases V2, V3) and of thousands separators outside brackets (``1,000`` -> ``1000``, case V8; ``1,0`` and
``(0,1)`` stay lists, cases V6, V7); an answer that is only space-separated digit groups (``1 000``) is one
number. It is then parsed with ``math_verify.parse`` and compared with
``math_verify.verify(gold, pred)`` in that order (the check is not symmetric: case V1), both with their own
``signal.alarm`` timeouts off (``parsing_timeout=None``, ``timeout_seconds=None``): the scoring pool enforces a
hard wall-clock limit in a separate process instead.

Hedging (case V12): an answer that lists more distinct candidates (separated by commas, semicolons, "or",
"and") than the gold holds values (``\\boxed{3, 5, 7}`` for the gold ``7``, or three boxes joined by "or")
scores 0 with reason ``hedged``, unless every candidate equals a one-value gold (``\\boxed{15\\frac{39}{40}}
or \\boxed{\\frac{639}{40}}``, two forms of one number, as a MATH-500 reference solution writes it). A gold
enclosed in one bracket counts the values inside it (the gold ``(0,1)`` holds 2); "or"/"and" between brackets
separates values with or without spaces (the gold ``(11,7)or(7,11)`` holds 2).

Exact answers (issue 9, item 11): when both sides are exact (integers, fractions, powers, factorials,
exact constants such as ``\\pi`` or ``\\sqrt{2}``; no decimal, no percent), equality is decided exactly
(:mod:`rlvr_verifiers._exact`), not by math-verify's float test that calls ``\\frac{1}{10^{20}}`` and
``\\frac{1}{10^{20}+1}`` equal; decimals keep math-verify's rounding to 6 places. A power tower or huge
factorial (exact value over ``_exact.MAX_DIGITS`` = 10,000 digits, estimated before computing) is never
evaluated: it equals only an answer that parses to the identical expression. ``exact=False`` restores
math-verify's own comparison.

Scientific notation (issue 38, item 19): before math-verify parses either side (:meth:`MathVerifier.read`),
numbers written ``4.5e33``, ``4.5E33``, ``1e+05``, ``4.5 \\times 10^{33}`` are rewritten to their exact values
(:mod:`rlvr_verifiers._scientific`), so math-verify no longer reads ``4.5e33`` as 4.5 * e * 33; Euler's e
stays itself where it is one (``2e``, ``e^2``, ``4.5e``); ``2e+1`` is 2e + 1 when Euler's e appears elsewhere
in the gold or the answer, else 20.

Unit rule (item 12, ``units="number"``, the default): a gold or answer that is one number followed by a label
(``9 (apples)``, ``5 cents``, ``12 km/h``: :func:`rlvr_verifiers.numeric.split_label`) is compared by its
number; units are not converted. ``units="refuse"``: such a gold is refused at load (``rlvr.reward.golds``).

Reasons: ``no_answer`` (nothing extracted, or an empty answer: case V13), ``hedged``, ``wrong``, ``bad_gold``
(the gold is empty), ``error: <ExcType>: msg`` (math-verify or sympy failed on this input).
"""

from __future__ import annotations

import logging
import re
from rlvr.types import VerifyResult
from rlvr_verifiers._scientific import mentions_euler, read_scientific
from rlvr_verifiers.numeric import NUMBER_RE, UNITS, number_token, split_label

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_JOINER_RE = re.compile(
    r"\s+|\$|,|;|\\[,;:! ]|\\q?quad|\\\(|\\\)|\\\[|\\\]"
    r"|\\(?:text|textrm|mathrm|mbox)\s*\{\s*(?:or|and)\s*\}|\b(?:or|and)\b",
    re.IGNORECASE,
)
_ANCHOR_RE = re.compile(
    r"####|\b(?:final\s+answer|answer)\s*(?:is\b|[:=\uff1a])(?:\s*(?:is\b|[:=]))?", re.IGNORECASE
)
_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|\$([^$]+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_WRAPPER_CMD_RE = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox|boxed|fbox)\s*\{")
_THOUSANDS_RE = re.compile(r"(?<![\d.,])[1-9]\d{0,2}(?:,\d{3})+(?!\d|,\d)")
_SIZING_RE = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])\s*")
_NOT_A_LONE_NUMBER_RE = re.compile(r"[A-Za-z\\^_{(]|\s*[-+*/^=,;\\_{(\u00d7\u00f7]")
_HEAD_NUMBER_RE = re.compile(r"\$?\s*(" + NUMBER_RE.pattern + ")")
_OPEN, _CLOSE = "([{", ")]}"
_LATEX_THOUSANDS_RE = re.compile(r"(?<=\d),\\!\s*(?=\d{3})|(?<=\d)\\,(?=\d{3}(?!\d))")
_AND_OR_RE = re.compile(
    r"\\(?:text|textrm|mathrm|mbox)\s*\{\s*(?:or|and)\s*\}|\s+(?:or|and)\s+|(?<=[)\]])\s*(?:or|and)\s*(?=[(\[])",
    re.IGNORECASE,
)
_SPACED_THOUSANDS_RE = re.compile(r"-?[1-9]\d{0,2}(?: \d{3})+(?:\.\d+)?")
_PROSE_WORD_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")


def _normalize(text: str) -> str:
    """Unicode minus to ``-``; drop ``\\$`` (currency); LaTeX thousands separators ``{,}``, ``,\\!`` to ``,``
    and ``\\,`` between digit groups to nothing (``10,\\!000`` -> ``10,000``, ``10\\,000`` -> ``10000``)."""
    text = text.replace("\u2212", "-").replace("\\$", "").replace("{,}", ",")
    return _LATEX_THOUSANDS_RE.sub(lambda m: "," if m.group(0).startswith(",") else "", text)


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of its matching ``}``, skipping escaped characters (``\\{``, ``\\\\``)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def find_boxes(text: str) -> list[tuple[int, int, str]]:
    """Complete outermost ``\\boxed{...}`` / ``\\fbox{...}`` in order: ``(start, end, content)`` each.

    A box whose braces never close (cut off by the token limit) is skipped; boxes nested in a complete box are
    part of its content.
    """
    pairs = _brace_pairs(text)
    boxes = []
    pos = 0
    while (m := _BOX_RE.search(text, pos)) is not None:
        close = pairs.get(m.end() - 1)
        if close is None:
            pos = m.end()
            continue
        boxes.append((m.start(), close + 1, text[m.end() : close]))
        pos = close + 1
    return boxes


def _last_box_run(text: str) -> str | None:
    """Content of the last complete box, or of the run of boxes it ends (joined by or/and/commas) as a list."""
    boxes = find_boxes(text)
    if not boxes:
        return None
    run = [boxes[-1]]
    for prev in reversed(boxes[:-1]):
        between = text[prev[1] : run[0][0]]
        if _JOINER_RE.sub("", between).strip():
            break
        run.insert(0, prev)
    return ", ".join(clean_answer(b[2]) for b in run) if len(run) > 1 else run[0][2]


def _depth_close(text: str, start: int) -> int | None:
    """Index of the bracket closing the one at ``start`` (any of ``([{`` / ``)]}``), or None."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in _OPEN:
            depth += 1
        elif text[i] in _CLOSE:
            depth -= 1
            if depth == 0:
                return i
    return None


def _answer_head(s: str, again: bool = True) -> str:
    """The answer at the start of the text after an answer marker: a number, a math span, a bracket, or else
    the sentence; in a sentence, what follows its last "is" (``The largest $n$ is 34.`` -> ``34``)."""
    s = s.lstrip(" \t}*:=")
    m = _HEAD_NUMBER_RE.match(s)
    if m and not _NOT_A_LONE_NUMBER_RE.match(s, m.end()):
        return m.group(1)
    m = _SPAN_RE.match(s)
    if m:
        return next(g for g in m.groups() if g is not None)
    if s[:1] in "([" or s.startswith("\\{"):
        close = _depth_close(s, 0 if s[0] in "([" else 1)  # for "\{" the brace is at index 1
        if close is not None:
            return s[: close + 1]
    sentence = re.split(r"\.(?=\s|$)", s, maxsplit=1)[0]
    parts = re.split(r"\s(?:is|are|was|equals)\s", sentence)
    return _answer_head(parts[-1], again=False) if again and len(parts) > 1 else sentence


def _after_marker(text: str) -> str | None:
    """The answer after the last answer marker (``####``, ``answer:``, ``the final answer is``), if any."""
    marks = list(_ANCHOR_RE.finditer(text.replace("**", "")))
    if not marks:
        return None
    rest = text.replace("**", "")[marks[-1].end() :]
    lines = rest.split("\n")
    line = lines[0] if lines[0].strip(" \t}*:=") else next((ln for ln in lines[1:] if ln.strip()), "")
    return _answer_head(line)


def _trailing_span(text: str) -> str | None:
    """Content of the last math span when nothing but punctuation follows it (``... is $\\frac{1}{2}$.``)."""
    spans = list(_SPAN_RE.finditer(text))
    if not spans or text[spans[-1].end() :].strip(" \t\n.!"):
        return None
    return next(g for g in spans[-1].groups() if g is not None)


def extract_answer(
    response: str, fallback: str = "last_number", answer_pattern: str | None = None
) -> tuple[str | None, str]:
    """The answer text of a response and where it came from.

    Returns ``(answer, source)``: ``answer`` cleaned (see :func:`clean_answer`), None when nothing was found;
    ``source`` one of ``box``, ``pattern``, ``marker``, ``span``, ``bare`` (the whole response is one
    expression, no prose), ``last_span`` (the last math span, when it holds the last number of the text),
    ``last_number``, ``none``.
    """
    text = _normalize(response)
    boxed = _last_box_run(text)
    if boxed is not None:
        return clean_answer(boxed), "box"
    if answer_pattern is not None:
        found = list(re.finditer(answer_pattern, text))
        if found:
            m = found[-1]
            return clean_answer(m.group(1) if m.groups() else m.group(0)), "pattern"
    if fallback == "none":
        return None, "none"
    marked = _after_marker(text)
    if marked is not None and marked.strip():
        return clean_answer(marked), "marker"
    span = _trailing_span(text)
    if span is not None and span.strip():
        return clean_answer(span), "span"
    bare = text.strip()
    if bare and "\n" not in bare and not _PROSE_WORD_RE.search(bare):  # the response is just an expression
        return clean_answer(bare), "bare"
    numbers = list(NUMBER_RE.finditer(text))
    if not numbers:
        return None, "none"
    spans = list(_SPAN_RE.finditer(text))
    if spans and spans[-1].start() <= numbers[-1].start() < spans[-1].end():
        # the last number sits in the last math span: the span is the answer (``Thus $x \geq 5$ is ...``)
        span = next(g for g in spans[-1].groups() if g is not None)
        if span.strip():
            return clean_answer(span), "last_span"
    return number_token(numbers[-1].group(0)), "last_number"


def _strip_wrappers(s: str) -> str:
    """One pass of removing a wrapper around the whole of ``s`` (math delimiters, ``\\text{}``, ``**``)."""
    s = s.strip()
    s = re.sub(r"^\\displaystyle\s*", "", s)
    s = re.sub(r"(?<!\\)[.\u3002]$", "", s).strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**")):
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            return s[len(left) : len(s) - len(right)]
    m = _WRAPPER_CMD_RE.match(s)
    if m and _brace_pairs(s).get(m.end() - 1) == len(s) - 1:
        return s[m.end() : -1]
    return s


def _drop_thousands(s: str) -> str:
    """Remove thousands separators from numbers outside brackets (``1,000`` -> ``1000``; ``(1,000)`` kept)."""
    out, last, depth, scanned = [], 0, 0, 0
    for m in _THOUSANDS_RE.finditer(s):  # bracket depth counted incrementally: linear in len(s)
        segment = s[scanned : m.start()]
        depth += sum(segment.count(c) for c in _OPEN) - sum(segment.count(c) for c in _CLOSE)
        scanned = m.start()
        if depth == 0:
            out.append(s[last : m.start()] + m.group(0).replace(",", ""))
            last = m.end()
    return "".join(out) + s[last:]


def clean_answer(answer: str) -> str:
    """An extracted answer without wrappers, ``$`` signs and thousands separators (cases V2, V3, V8)."""
    s = answer
    while True:
        stripped = _strip_wrappers(s)
        if stripped == s:
            break
        s = stripped
    s = s.replace("$", "").replace("\n", " ").strip()
    if _SPACED_THOUSANDS_RE.fullmatch(s):  # a whole answer of space-separated digit groups: ``1 000`` -> 1000
        s = s.replace(" ", "")
    return _drop_thousands(s)


def split_items(answer: str, inside_bracket: bool = False) -> list[str]:
    """The values an answer lists: its top-level parts separated by commas, semicolons, "or" or "and"
    (``3, 5, 7`` -> 3 parts; ``(0,1)`` -> 1 part). With ``inside_bracket``, an answer that one bracket encloses
    whole is split inside it (``(0,1)`` -> ``["0", "1"]``)."""
    s = _SIZING_RE.sub("", _AND_OR_RE.sub(",", answer)).replace("\\{", "{").replace("\\}", "}").strip()
    if inside_bracket and s[:1] in _OPEN and _depth_close(s, 0) == len(s) - 1:
        s = s[1:-1]
    parts, depth, cur = [], 0, []
    for c in s:
        depth += (c in _OPEN) - (c in _CLOSE)
        if c in ",;" and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    unique = {re.sub(r"\s+", "", p): p.strip() for p in parts if p.strip()}  # a value listed twice is one
    return list(unique.values()) or [s]


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its own timeout is off; the scoring pool enforces one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


class MathVerifier:
    """Math answer checking on math-verify: score 1 for an answer equivalent to the gold, else 0.

    Args:
        fallback: ``"last_number"`` (default): with no box, read an answer marker, a final math span, or the
            last number; ``"none"``: no box (and no ``answer_pattern`` match) is ``no_answer``.
        answer_pattern: a regular expression tried before the fallback when there is no box; the answer is its
            first group (or the whole match) of the last match in the response.
        exact: ``True`` (default): exact answers are compared exactly (module docstring); ``False``:
            math-verify's own comparison (float tolerance for every number).
        units: ``"number"`` (default): a number followed by a label is compared by its number (the unit
            rule); ``"refuse"``: a gold with a label is refused at load and the label is left to math-verify.

    Errors: ``ValueError`` at construction for an unknown ``fallback`` or ``units``, or an invalid
    ``answer_pattern``.
    ``verify`` never raises: math-verify or sympy failures become reason ``error: <ExcType>: msg``.
    """

    preload_modules = ("math_verify", "rlvr_verifiers.math", "rlvr_verifiers._exact",
                       "rlvr_verifiers._scientific")
    """Imported once by the scoring pool's fork server (see ``rlvr.reward.pool.ScoringPool``)."""

    def __init__(
        self,
        fallback: str = "last_number",
        answer_pattern: str | None = None,
        exact: bool = True,
        units: str = "number",
    ) -> None:
        if fallback not in ("last_number", "none"):
            raise ValueError(f"fallback must be 'last_number' or 'none', got {fallback!r}")
        if units not in UNITS:
            raise ValueError(f"units must be one of {', '.join(map(repr, UNITS))}, got {units!r}")
        if answer_pattern is not None:
            try:
                re.compile(answer_pattern)
            except re.error as e:
                raise ValueError(f"answer_pattern {answer_pattern!r} is not a valid regex: {e}") from None
        import math_verify

        for name in ("math_verify.parser", "math_verify.grader"):
            log = logging.getLogger(name)
            if not any(isinstance(f, _DropTimeoutDisabledWarning) for f in log.filters):
                log.addFilter(_DropTimeoutDisabledWarning())
        self.fallback = fallback
        self.answer_pattern = answer_pattern
        self.exact = bool(exact)
        self.units = units
        self._mv = math_verify
        self._latex = [math_verify.LatexExtractionConfig()]

    def gold_answer(self, gold: str) -> str:
        """The gold's answer text: its last box (or run of boxes) if it has any, cleaned like an answer; with
        ``units="number"``, a number followed by a label is the number (``9 (apples)`` -> ``9``)."""
        return self._gold(gold)[0]

    def _gold(self, gold: str) -> tuple[str, str | None]:
        """``(answer, label)``: :meth:`gold_answer` and the label it dropped (None when none was)."""
        text = _normalize(str(gold))
        boxed = _last_box_run(text)
        answer = clean_answer(boxed if boxed is not None else text)
        found = split_label(answer) if self.units == "number" else None
        return (found[0], found[1]) if found else (answer, None)

    def _unlabel(self, answer: str, known: str | None = None) -> str:
        """The number of ``answer`` when it is one number followed by a label (the unit rule; ``known``, the
        gold's label, is accepted in any form), else ``answer``."""
        if self.units != "number":
            return answer
        found = split_label(answer, known)
        return found[0] if found else answer

    def read(self, answer: str, euler: bool = False) -> list:
        """``math_verify.parse`` of a cleaned answer (its own timeout off), scientific notation first rewritten
        to exact values (:func:`rlvr_verifiers._scientific.read_scientific`; ``euler``: Euler's e is written
        elsewhere in the comparison, so ``2e+1`` is 2e + 1). The one reading of gold and answer alike."""
        return self._mv.parse(f"${read_scientific(answer, euler)}$", extraction_config=self._latex,
                              parsing_timeout=None)

    def equivalent(self, gold_answer: str, answer: str) -> bool:
        """math-verify's verdict on two cleaned answers, gold first (case V1), with exact answers compared
        exactly (``exact``, module docstring); text equality (ignoring spaces and case) when math-verify
        extracts nothing from either."""
        euler = mentions_euler(gold_answer) or mentions_euler(answer)  # ambiguous ``2e+1`` read in context
        g, p = self.read(gold_answer, euler), self.read(answer, euler)
        if g and p and self.exact:
            from rlvr_verifiers import _exact

            if any(_exact.has_huge(x) for x in (*g, *p)):  # never evaluated: compared as written
                return any(x == y for x in g for y in p if not isinstance(x, str) and not isinstance(y, str))
            with _exact.exact_numbers():
                return bool(self._mv.verify(g, p, timeout_seconds=None))
        if g and p:
            return bool(self._mv.verify(g, p, timeout_seconds=None))
        if not g and not p:
            return re.sub(r"\s+", "", gold_answer).lower() == re.sub(r"\s+", "", answer).lower()
        return False

    def verify(self, response: str, gold: str, **row: object) -> VerifyResult:
        """Score one response against ``gold``; ``row`` (the data row's other fields) is ignored."""
        try:
            gold_ans, label = self._gold(gold)
            if not gold_ans:
                return VerifyResult(score=0.0, parsed=None, reason="bad_gold")
            answer, _ = extract_answer(str(response), self.fallback, self.answer_pattern)
            answer = self._unlabel(answer, label) if answer else answer
            if not answer:
                return VerifyResult(score=0.0, parsed=answer, reason="no_answer")
            candidates = split_items(answer)
            n_gold = max(len(split_items(gold_ans)), len(split_items(gold_ans, inside_bracket=True)))
            if len(candidates) > n_gold:  # more values than the gold holds: right only if every one is
                if n_gold == 1 and all(self.equivalent(gold_ans, c) for c in candidates):
                    return VerifyResult(score=1.0, parsed=answer)
                return VerifyResult(score=0.0, parsed=answer, reason="hedged")
            if self.equivalent(gold_ans, answer):
                return VerifyResult(score=1.0, parsed=answer)
            return VerifyResult(score=0.0, parsed=answer, reason="wrong")
        except Exception as e:  # noqa: BLE001 - untrusted input must not raise (DESIGN: Seams)
            return VerifyResult(score=0.0, parsed=None, reason=f"error: {type(e).__name__}: {str(e)[:200]}")
