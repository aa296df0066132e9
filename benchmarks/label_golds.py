"""False negatives of the ``math`` and ``numeric`` verifiers on golds written as a number and a label, per form.

Issue 23 ("the verifier: a class still read wrong"): a gold such as ``42 (g)`` or ``42 (times)`` was read by
math-verify as the product ``42*g`` / ``42*t*i*m*e*s``, so a right answer (``\\boxed{42}``) scored 0 with reason
``wrong`` and no warning. This script generates golds of each label form (:data:`LABELS`) after each number
form (:data:`NUMBERS`), pairs each with right responses (:func:`responses`: boxed or stated, with and without
the unit; expected score 1) and a wrong one (the number plus one; expected 0), and prints per form the false
negatives (FN: a right response scored 0) and false positives (FP: the wrong response scored 1), for
``math`` and ``numeric`` with their defaults (``units: number``).

Then the mathematical golds of :data:`MATH_GOLDS` (``2(x)``, ``(a+b)``, ``f(x)``, the interval ``(1, 2)``...),
each with the responses that must score 1 and those that must score 0: a label rule that reads ``2(x)`` as
"2, labelled x" shows here as an FP. Beside it, the same golds without the label rule (``units: refuse``):
an error there is math-verify's own reading (it drops some unit-like letters: ``6 m`` -> 6), not the rule's.
The numeric column skips the ``\\frac`` gold (``numeric`` reads no LaTeX; such a gold is refused at load).

"Before" is main's code: run the script with main's package on the path (``cd /tmp && /work/main/.venv/bin/python
/path/to/benchmarks/label_golds.py`` imports the installed ``rlvr_verifiers``); "after" with the worktree first on
``PYTHONPATH``. Run: ``.venv/bin/python benchmarks/label_golds.py`` (about 20 s on one core). ``--show N`` prints
up to N failing cases per form.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

NUMBERS: list[tuple[str, str, str, str]] = [
    # (name, as written in the gold, right boxed answer, right stated answer)
    ("integer", "42", "42", "42"),
    ("decimal", "3.5", "3.5", "3.5"),
    ("fraction a/b", "3/4", "\\frac{3}{4}", "3/4"),
    ("\\frac", "\\frac{3}{4}", "\\frac{3}{4}", "3/4"),
    ("negative", "-7", "-7", "-7"),
    ("leading $", "$42", "42", "$42"),
    ("thousands", "1,200", "1200", "1,200"),
]
"""Number forms: name, the gold's number, the boxed right answer, the stated right answer."""

WRONG = {"42": "43", "3.5": "4.5", "3/4": "\\frac{5}{4}", "\\frac{3}{4}": "\\frac{5}{4}", "-7": "-6",
         "$42": "43", "1,200": "1201"}
"""A wrong boxed answer for each gold number (expected score 0)."""

LABELS: dict[str, list[str]] = {
    "single-letter unit (g)": ["g", "m", "s", "h", "L"],
    "multi-letter unit (cm)": ["cm", "kg", "km", "mL"],
    "symbol-product word (times)": ["times", "items", "minutes", "meters"],
    "plural noun (apples)": ["apples", "cookies", "students"],
    "two-word label (square meters)": ["square meters", "cubic feet"],
    "compound unit (m/s)": ["m/s", "km/h", "m^2", "cm^2"],
}
"""Label forms, each with the labels generated (written in parentheses after the number)."""

STYLES = {
    "paren": "{n} ({u})",
    "text": "{n} \\text{{ {u}}}",
    "bare": "{n} {u}",
}
"""How the label follows the number in the gold. ``bare`` one-letter units (``42 g``) stay ambiguous by design
(``6 m`` may be an algebra answer): counted, and expected to stay FN."""


def responses(boxed: str, stated: str, unit: str) -> list[str]:
    """Right responses to a gold: boxed and stated, with and without the unit."""
    return [
        f"\\boxed{{{boxed}}}",
        f"The answer is {stated}",
        f"\\boxed{{{boxed} \\text{{ {unit}}}}}",
        f"The answer is {stated} {unit}.",
        f"So the result is {stated} ({unit}).",
    ]


MATH_GOLDS: list[tuple[str, list[str], list[str]]] = [
    # (gold, responses that must score 1, responses that must score 0)
    ("2(x)", ["\\boxed{2x}", "\\boxed{2 x}"], ["\\boxed{2}", "The answer is 2"]),
    ("3 (x)", ["\\boxed{3x}"], ["\\boxed{3}"]),
    ("2(xy)", ["\\boxed{2xy}"], ["\\boxed{2}"]),
    ("2 xy", ["\\boxed{2xy}"], ["\\boxed{2}"]),
    ("4 ab", ["\\boxed{4ab}"], ["\\boxed{4}"]),
    ("2(a/b)", ["\\boxed{\\frac{2a}{b}}"], ["\\boxed{2}"]),
    ("(a+b)", ["\\boxed{a+b}"], ["\\boxed{a}", "\\boxed{b}"]),
    ("f(x)", ["\\boxed{f(x)}"], ["\\boxed{f}", "\\boxed{x}"]),
    ("(1, 2)", ["\\boxed{(1, 2)}"], ["\\boxed{1}", "\\boxed{[1, 2]}"]),
    ("2\\mathrm{e}", ["\\boxed{2e}"], ["\\boxed{2}"]),
    ("5 (n+1)", ["\\boxed{5n+5}"], ["\\boxed{5}"]),
    ("6 m", ["\\boxed{6m}"], ["\\boxed{6}"]),
]
"""Mathematical golds whose meaning a label rule must keep: a right response and a wrong one each."""


def main() -> None:
    """Print the per-form table; returns nothing."""
    import rlvr_verifiers
    from rlvr_verifiers.math import MathVerifier
    from rlvr_verifiers.numeric import NumericVerifier

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--show", type=int, default=0, help="print up to N failing cases per form")
    args = parser.parse_args()
    mv, nv = MathVerifier(), NumericVerifier()
    print(f"rlvr_verifiers from {rlvr_verifiers.__file__}")
    rows: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    shown: dict[tuple[str, str], list[str]] = defaultdict(list)
    for form, units in LABELS.items():
        for style, pattern in STYLES.items():
            key = (form, style)
            for _, number, boxed, stated in NUMBERS:
                for unit in units:
                    gold = pattern.format(n=number, u=unit)
                    for resp in responses(boxed, stated, unit):
                        r = mv.verify(resp, gold)
                        rows[key]["right"] += 1
                        if r.score != 1.0:
                            rows[key]["math FN"] += 1
                            if len(shown[key]) < args.show:
                                shown[key].append(f"math gold {gold!r} response {resp!r}: {r.reason}")
                    bad = mv.verify(f"\\boxed{{{WRONG[number]}}}", gold)
                    rows[key]["wrong"] += 1
                    rows[key]["math FP"] += bad.score == 1.0
                    if number.startswith("\\"):  # numeric reads no LaTeX: such a gold is refused at load
                        continue
                    nr = nv.verify(f"#### {stated}", gold)
                    rows[key]["numeric"] += 1
                    if nr.score != 1.0:
                        rows[key]["numeric FN"] += 1
                        if len(shown[key]) < args.show:
                            shown[key].append(f"numeric gold {gold!r}: {nr.reason}")
    header = f"{'label form':32s} {'style':6s} {'math FN':>12s} {'math FP':>9s} {'numeric FN':>12s}"
    print(header)
    print("-" * len(header))
    total = defaultdict(int)
    for (form, style), c in rows.items():
        for k, v in c.items():
            total[k] += v
        print(
            f"{form:32s} {style:6s} {c['math FN']:5d} of {c['right']:4d} {c['math FP']:3d} of {c['wrong']:3d}"
            f" {c['numeric FN']:4d} of {c['numeric']:3d}"
        )
        for line in shown[(form, style)]:
            print("    " + line)
    print(
        f"{'all':32s} {'':6s} {total['math FN']:5d} of {total['right']:4d} {total['math FP']:3d} of "
        f"{total['wrong']:3d} {total['numeric FN']:4d} of {total['numeric']:3d}"
    )
    print("\nmathematical golds (meaning kept): FN = a right response scored 0, FP = a wrong one scored 1")
    print("  (without the label rule: the same verifier with units: refuse, i.e. math-verify's own reading)")
    plain = MathVerifier(units="refuse")
    totals = [0, 0, 0, 0]
    for gold, good, bad in MATH_GOLDS:
        counts = []
        for v in (mv, plain):
            g_fn = [r for r in good if v.verify(r, gold).score != 1.0]
            g_fp = [r for r in bad if v.verify(r, gold).score == 1.0]
            counts += [len(g_fn), len(g_fp)]
            if v is mv:
                cases = g_fn + g_fp
        totals = [t + c for t, c in zip(totals, counts)]
        print(
            f"  {gold:14s} FN {counts[0]} of {len(good)}  FP {counts[1]} of {len(bad)}   without the rule: FN "
            f"{counts[2]}  FP {counts[3]}  {cases or ''}"
        )
    print(f"  all            FN {totals[0]}  FP {totals[1]}        without the rule: FN {totals[2]}  FP {totals[3]}")


if __name__ == "__main__":
    main()
