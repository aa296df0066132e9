"""Agreement of the built-in verifiers with real data, scored through the ScoringPool (2 workers).

Four measurements, each a count of cases where the verifier's verdict (score 1 / 0) equals the expected one:

1. ``mathverify``: math-verify's own equivalence tables (``data/mathverify_cases/cases.jsonl``, 268 rows of
   ``gold``, ``pred``, ``expected``; 14 rows name it ``result``), ``pred`` given to our ``math`` verifier as
   the response. Beside it, math-verify itself called the way its tests call it (``compare_strings``: the
   row's ``match_types``, ``precision``, ``strict``, ``allow_set_relation_comp``), in this process.
   Every miss of ours is explained in :data:`MATHVERIFY_KNOWN` (kind, reason); one that is not is printed as
   ``UNEXPLAINED``.
2. ``math500``: each reference ``solution`` of MATH-500 against its ``answer`` with ``math`` (expected 1).
3. ``gsm8k``: each reference ``answer`` text of the GSM8K test set (reasoning, then ``#### N``) against its gold
   number with ``numeric`` and ``math`` (expected 1 for both).
4. ``competition``: each AIME24, AIME25 and AMC23 answer against itself in other forms (``\\boxed{N}``,
   ``The answer is N.``, a final ``$N$``, ``Final Answer: N``; ``N.0`` where the gold is an integer float
   (AMC23); ``1,625`` separators where N >= 1000; the zero-padded form where the gold is one (AIME24 ``025``))
   expected 1, and ``N+1`` in two forms expected 0.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/verifier_agreement.py`` (about a minute on two cores).
``tests/integration/test_verifier_real_data.py`` imports this file and asserts the counts it prints.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"

MATHVERIFY_KNOWN: dict[int, tuple[str, str]] = {
    5: ("policy: decimal comma", "`1000,99` is a list of two numbers for us (case V6), a decimal for math-verify"),
    6: ("policy: decimal comma", "gold `1,22` is a list for us (case V6)"),
    7: ("policy: decimal comma", "`2,74` is two numbers for us (case V6); the last number read is 74"),
    31: ("policy: lenient spans", "we read `$ \\n 9 \\n $` as 9; math-verify refuses inline math across lines"),
    32: ("policy: lenient spans", "we read `\\( \\n 9 \\n \\)` as 9; math-verify refuses it"),
    60: ("gold is a solution", "the gold is a whole unboxed solution text; our golds are answers (case V15)"),
    133: ("option not exposed", "precision=2 (we compare at math-verify's default float rounding, 6)"),
    139: ("option not exposed", "precision=2: 2.6667 against 8/3"),
    156: ("extraction", "after `Final Answer:` comes a sentence with no `is`: `Jane started growing Sphere 3 "
          "hours ago` is read whole, not as 3"),
    172: ("extraction", "an intermediate `\\boxed{255}` wins over a later `The final answer is $10,455$` "
          "(the last box is the answer)"),
    186: ("option not exposed", "allow_set_relation_comp=True (interval against inequality)"),
    190: ("malformed gold", "gold `\\\\boxed{35 cm} ++++++ \\\\boxed{4}` (doubled backslashes): we read 4"),
    217: ("malformed gold", "gold `\\\\boxed{W(n) = 1 ...` (doubled backslashes, unclosed); pred `W(x)=1orW(x)=-1`"),
    237: ("extraction", "two boxes separated by prose (`for part (a) and`): only the last box is read"),
    247: ("extraction", "two boxes separated by `\\) and \\( y_2 =`: only the last box is read"),
    250: ("extraction", "gold `\\boxed{1} papers and \\boxed{2} bins`: only its last box (2) is read, so "
          "`1,2` is hedged"),
    253: ("option not exposed", "strict=False (f(x) against f(y))"),
    263: ("label pins a math-verify bug", "`1 + 1/e` against the gold `1 - 1/e` is labelled 1: math-verify's "
          "default parse cuts both at `\\mathrm{e}` to `1 - \\frac{1}{` = 1; we (LaTeX config) say 0, rightly; "
          "upstream's tests/test_yujianll.py @056ad625 labels it 0"),
}
"""Row index (0-based line of cases.jsonl) -> (kind, reason) for each case where our ``math`` verifier
disagrees with ``expected``, measured with math-verify 0.9.0."""


@dataclass(frozen=True)
class Case:
    """One check: ``response`` scored against ``gold``; ``expected`` 1 (equivalent) or 0; ``key`` names the row
    (``<set>/<row>/<form>``)."""

    key: str
    response: str
    gold: str
    expected: int


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mathverify_cases() -> tuple[list[Case], list[dict]]:
    """Cases of math-verify's tables, and the rows themselves (for the in-process math-verify reference)."""
    rows = _rows(DATA / "mathverify_cases" / "cases.jsonl")
    cases = [Case(f"mathverify/{i}", r["pred"], r["gold"], int(r.get("expected", r.get("result")))) for i, r
             in enumerate(rows)]
    return cases, rows


def math500_cases(step: int = 1) -> list[Case]:
    """Every ``step``-th MATH-500 row: its reference solution against its answer (expected 1)."""
    rows = _rows(DATA / "math500" / "test.jsonl")
    return [Case(f"math500/{r['unique_id']}", r["solution"], r["answer"], 1) for r in rows[::step]]


def gsm8k_cases(step: int = 1) -> list[Case]:
    """Every ``step``-th GSM8K test row: the reference answer text against its gold number (expected 1)."""
    rows = _rows(DATA / "gsm8k" / "test.jsonl")
    out = []
    for i, r in enumerate(rows[::step]):
        gold = r["answer"].rsplit("####", 1)[1].strip()
        out.append(Case(f"gsm8k/{i * step}", r["answer"], gold, 1))
    return out


def _forms(value: int | float, gold: str) -> list[tuple[str, str]]:
    """(form name, response) pairs that state ``value`` as a final answer."""
    n = int(value) if float(value).is_integer() else value
    s = str(n)
    forms = [("boxed", f"So the result is \\boxed{{{s}}}."), ("answer_is", f"Adding these up, the answer is {s}."),
             ("final_span", f"Therefore the count is ${s}$."), ("final_answer", f"Final Answer: {s}")]
    if "." in gold and float(value).is_integer():  # the gold is an integer float (AMC23 "27.0")
        forms.append(("float", f"\\boxed{{{s}.0}}"))
    if abs(n) >= 1000:
        forms += [("thousands_boxed", f"\\boxed{{{n:,}}}"), ("thousands_answer_is", f"The answer is {n:,}.")]
    if gold != s and gold.lstrip("0") == s:
        forms.append(("zero_padded", f"\\boxed{{{gold}}}"))
    return forms


def competition_cases() -> list[Case]:
    """AIME24, AIME25 and AMC23 answers in other forms (expected 1) and ``N+1`` (expected 0); the gold is the
    data set's ``answer`` as text (``"025"``, ``"70"``, ``"27.0"``)."""
    out = []
    for name in ("aime24", "aime25", "amc23"):
        for i, r in enumerate(_rows(DATA / name / "test.jsonl")):
            gold = str(r["answer"])
            value = float(gold)
            for form, response in _forms(value, gold):
                out.append(Case(f"{name}/{i}/{form}", response, gold, 1))
            wrong = int(value) + 1 if value.is_integer() else value + 1
            out.append(Case(f"{name}/{i}/wrong_boxed", f"\\boxed{{{wrong}}}", gold, 0))
            out.append(Case(f"{name}/{i}/wrong_answer_is", f"The answer is {wrong}.", gold, 0))
    return out


def score_cases(pool, cases: Sequence[Case]) -> list:
    """``[len(cases)]`` Scored from ``pool`` (a :class:`rlvr.reward.ScoringPool`)."""
    return pool.score([c.response for c in cases], [c.gold for c in cases], [{}] * len(cases))


def misses(cases: Sequence[Case], scored: Sequence, key: str) -> list[tuple[Case, object]]:
    """(case, VerifyResult) for each case where verifier ``key`` scored other than ``expected``."""
    return [(c, s.results[key]) for c, s in zip(cases, scored) if int(s.results[key].score) != c.expected]


def mathverify_reference(rows: Sequence[dict]) -> int:
    """How many rows math-verify itself gets right when called as its tests call it (``compare_strings``)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    right = 0
    for r in rows:
        types = r["match_types"] or ["latex", "expr"]
        cfg = [LatexExtractionConfig(boxed_match_priority=0) if t == "latex" else ExprExtractionConfig()
               for t in types]
        if r["match_types"] is None:  # test_yujianll.py calls parse() with its defaults
            g, p = parse(r["gold"]), parse(r["pred"])
        else:
            g, p = parse(r["gold"], cfg), parse(r["pred"], cfg)
        got = verify(g, p, float_rounding=r.get("precision", 6), strict=r.get("strict", True),
                     allow_set_relation_comp=r.get("allow_set_relation_comp", False))
        right += int(got) == int(r.get("expected", r.get("result")))
    return right


def _report(title: str, cases: Sequence[Case], scored: Sequence, key: str, known: dict | None = None) -> int:
    missed = misses(cases, scored, key)
    agree = len(cases) - len(missed)
    print(f"{title} [{key}]: {agree}/{len(cases)} agree ({agree / len(cases):.1%})")
    by_kind: dict[str, list[str]] = {}
    for case, result in missed:
        if known is not None:
            index = int(case.key.rsplit("/", 1)[1])
            kind, why = known.get(index, ("UNEXPLAINED", ""))
        else:
            kind, why = "miss", ""
        by_kind.setdefault(kind, []).append(
            f"{case.key}: expected {case.expected}, got {result.score:g} ({result.reason}; read {result.parsed!r:.60})"
            + (f" -- {why}" if why else "")
        )
    for kind, lines in sorted(by_kind.items()):
        print(f"  {kind}: {len(lines)}")
        for line in lines:
            print(f"    {line}")
    return agree


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0, help="per-sample limit, seconds")
    args = parser.parse_args(argv)

    from rlvr.config import VerifierSpec
    from rlvr.reward import ScoringPool, reward_metrics

    mv_cases, mv_rows = mathverify_cases()
    runs = [("math-verify cases", mv_cases, ["math"], MATHVERIFY_KNOWN),
            ("MATH-500 solutions", math500_cases(), ["math"], None),
            ("GSM8K test answers", gsm8k_cases(), ["numeric", "math"], None),
            ("AIME24/AIME25/AMC23 forms", competition_cases(), ["math"], None)]
    for title, cases, keys, known in runs:
        specs = [VerifierSpec(name=k) for k in keys]
        start = time.monotonic()
        with ScoringPool(specs, num_workers=args.workers, timeout_s=args.timeout) as pool:
            scored = score_cases(pool, cases)
            stats = pool.stats()
        wall = time.monotonic() - start
        for key in keys:
            _report(title, cases, scored, key, known)
        m = reward_metrics(scored)
        print(f"  {len(cases)} samples in {wall:.1f} s; latency p50 {m['reward/latency_p50_s'] * 1e3:.1f} ms, "
              f"p99 {m['reward/latency_p99_s'] * 1e3:.1f} ms, max {m['reward/latency_max_s'] * 1e3:.1f} ms; "
              f"pool {stats}")
    start = time.monotonic()
    ref = mathverify_reference(mv_rows)
    print(f"math-verify itself (compare_strings, in-process) on its cases: {ref}/{len(mv_rows)} "
          f"({time.monotonic() - start:.1f} s)")


if __name__ == "__main__":
    main()
