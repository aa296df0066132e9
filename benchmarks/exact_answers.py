"""False positives and negatives of the ``math`` and ``numeric`` verifiers before and after issue 9 items 11-12.

"Before" is the pre-change comparison, run in the same process pool: ``math`` with ``exact: false`` (plain
``math_verify.verify``, float tolerance for every number) and ``units: refuse`` (no label rule), and
``numeric`` with ``units: refuse``; "after" is each verifier with its defaults. Every case has an expected
verdict (1 equivalent, 0 not); a false positive (FP) scores 1 where 0 is right, a false negative (FN) scores 0
where 1 is right. Each sample runs in the scoring pool's workers with a hard limit (``--timeout``), so a
comparison that hangs scores 0 ``timeout`` (counted, as an FN or a right 0).

Case sets:

1. ``data``: the equivalence cases of ``benchmarks/verifier_agreement.py`` (math-verify's tables, MATH-500
   solutions, GSM8K answers, AIME/AMC forms: 2738 cases, ``math``).
2. ``generated``: seeded random exact answers (reciprocals of powers and factorials, near-square roots,
   sums of reciprocals, ``e^{-n}``, ``\\pi`` plus a tiny term, big powers and binomials) against a perturbed copy
   (expected 0) and against an equal rewrite (expected 1), :func:`generated_cases`; plus the power towers and
   huge factorials of :data:`HUGE` (expected verdicts by hand).
3. ``labels``: GSM8K test golds written with a trailing label (``18 (dollars)``, ``18 eggs``...) against
   ``\\boxed{N}`` (1) and ``\\boxed{N+1}`` (0), for ``math`` and ``numeric``.
4. ``solutions``: 200 GSM8K test rows with the full worked solution as the gold (``answer_format`` forgotten)
   and the right answer boxed: before, all score 0 silently; after, the load-time check refuses every one
   with the fix (``answer_format: gsm8k``), and with the fix all 200 score 1.

Then the load-time gold check's verdict on every data set in ``data/``.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/exact_answers.py`` (about 5 minutes on two cores; `--skip-data` about 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"

HUGE: list[tuple[str, str, int]] = [
    ("2^{2^{2^{100}}}", "2^{2^{2^{100}}}+1", 0),
    ("2^{2^{2^{100}}}", "2^{2^{2^{100}}}", 1),
    ("2^{2^{100}}", "3", 0),
    ("1000000!", "1000000!+1", 0),
    ("1000000!", "1000000!", 1),
    ("10^{10^{10}}", "10^{10^{10}}+1", 0),
    ("\\frac{1}{3000!}", "\\frac{1}{3001!}", 0),
    ("3000!", "3000 \\cdot 2999!", 1),
]
"""(gold, answer, expected): exact values too large to compute (the first six) and large ones that are not
(the last two: 3000! has 9131 digits, under the 10,000-digit bound)."""


def _agreement():
    path = REPO / "benchmarks" / "verifier_agreement.py"
    spec = importlib.util.spec_from_file_location("rlvr_bench_verifier_agreement", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def generated_cases(n_per_family: int = 20, seed: int = 0) -> list[tuple[str, str, str, int]]:
    """``(family, gold, answer, expected)``: for each family, ``n_per_family`` random exact golds, each with a
    perturbed copy (expected 0) and an equal rewrite (expected 1). All values are exact; the perturbed ones
    differ from the gold below float precision (relative difference under 1e-15) or, for the big integers,
    by 1."""
    rng = random.Random(seed)
    out: list[tuple[str, str, str, int]] = []

    def add(family: str, gold: str, wrong: str, same: str) -> None:
        out.append((family, gold, wrong, 0))
        out.append((family, gold, same, 1))

    for _ in range(n_per_family):
        a, n = rng.randint(2, 9), rng.randint(25, 60)
        add("reciprocal_power", f"\\frac{{1}}{{{a}^{{{n}}}}}", f"\\frac{{1}}{{{a}^{{{n}}}+1}}", f"{a}^{{-{n}}}")
        n = rng.randint(18, 40)
        add("reciprocal_factorial", f"\\frac{{1}}{{{n}!}}", f"\\frac{{1}}{{{n + 1}!}}",
            f"\\frac{{1}}{{{n} \\cdot {n - 1}!}}")
        k = rng.randint(16, 30)
        add("near_square_root", f"10^{{{k}}}", f"\\sqrt{{10^{{{2 * k}}}+1}}", f"\\sqrt{{10^{{{2 * k}}}}}")
        b, c = rng.randint(10**9, 10**10), rng.randint(10**9, 10**10)
        add("sum_of_reciprocals", f"\\frac{{1}}{{{b}}}+\\frac{{1}}{{{c}}}", f"\\frac{{1}}{{{b}}}+\\frac{{1}}{{{c + 1}}}",
            f"\\frac{{{b + c}}}{{{b * c}}}")
        n = rng.randint(40, 120)
        add("exp_small", f"e^{{-{n}}}", f"e^{{-{n + 1}}}", f"\\frac{{1}}{{e^{{{n}}}}}")
        k = rng.randint(20, 60)
        m = rng.randint(2, 9)
        add("pi_plus_tiny", f"{m}\\pi", f"{m}\\pi+10^{{-{k}}}", f"\\frac{{{2 * m}\\pi}}{{2}}")
        a, n = rng.randint(2, 9), rng.randint(60, 200)
        add("big_power", f"{a}^{{{n}}}", f"{a}^{{{n}}}+1", str(a**n))
        n = rng.randint(60, 200)
        k = rng.randint(10, n // 2)
        from math import comb

        add("binomial", f"\\binom{{{n}}}{{{k}}}", str(comb(n, k) + 1), str(comb(n, k)))
    return out


def label_cases(limit: int = 200) -> list[tuple[str, str, int]]:
    """``(gold, response, expected)``: the first ``limit`` GSM8K test golds with a label after the number."""
    rows = [json.loads(x) for x in (DATA / "gsm8k" / "test.jsonl").read_text().splitlines() if x.strip()]
    labels = ["(dollars)", "dollars", "eggs", "(apples)", "km/h", "\\text{ hours}", "square feet", "(marbles)"]
    out = []
    for i, r in enumerate(rows[:limit]):
        n = int(r["answer"].rsplit("####", 1)[1].strip().replace(",", ""))
        gold = f"{n} {labels[i % len(labels)]}"
        out += [(gold, f"So the answer is \\boxed{{{n}}}.", 1), (gold, f"So the answer is \\boxed{{{n + 1}}}.", 0)]
    return out


def _counts(scores: Sequence[float], expected: Sequence[int]) -> tuple[int, int]:
    fp = sum(1 for s, e in zip(scores, expected) if s >= 1 and e == 0)
    fn = sum(1 for s, e in zip(scores, expected) if s < 1 and e == 1)
    return fp, fn


def _score(specs, responses, golds, workers: int, timeout: float) -> dict[str, list]:
    """VerifyResults of each spec for the (response, gold) pairs, keyed ``before``/``after`` in order (one pool
    per spec: a sample that hangs under one must not time the other out with it)."""
    from rlvr.reward import ScoringPool

    out = {}
    for label, spec in zip(("before", "after"), specs):
        with ScoringPool([spec], num_workers=workers, timeout_s=timeout) as pool:
            scored = pool.score(list(responses), list(golds), [{}] * len(golds))
            key = pool.keys[0]
        out[label] = [s.results[key] for s in scored]
    return out


BEFORE_MATH = {"exact": False, "units": "refuse"}
BEFORE_NUMERIC = {"units": "refuse"}


def _line(title: str, n_pos: int, n_neg: int, before: tuple[int, int], after: tuple[int, int], extra: str = "") -> str:
    return (f"{title:38} cases {n_pos + n_neg:5} (equal {n_pos}, not {n_neg})  before FP {before[0]:4} FN "
            f"{before[1]:4}  after FP {after[0]:4} FN {after[1]:4}{extra}")


def compare(title: str, verifier: str, before_args: dict, responses, golds, expected, workers: int,
            timeout: float) -> tuple[tuple[int, int], tuple[int, int]]:
    """Print and return (before (FP, FN), after (FP, FN)) of ``verifier`` on the cases."""
    from rlvr.config import VerifierSpec

    specs = [VerifierSpec(name=verifier, args=before_args), VerifierSpec(name=verifier)]
    start = time.monotonic()
    res = _score(specs, responses, golds, workers, timeout)
    before_key, after_key = list(res)
    before = _counts([r.score for r in res[before_key]], expected)
    after = _counts([r.score for r in res[after_key]], expected)
    timeouts = [sum(r.reason == "timeout" for r in res[k]) for k in (before_key, after_key)]
    n_pos = sum(expected)
    extra = f"  (timeouts {timeouts[0]} -> {timeouts[1]}; {time.monotonic() - start:.0f} s)"
    print(_line(f"{title} [{verifier}]", n_pos, len(expected) - n_pos, before, after, extra), flush=True)
    return before, after


def load_verdicts() -> list[tuple[str, str, str]]:
    """(data set, verifier, verdict) of the load-time gold check on every data set in ``data/``."""
    from rlvr.config import DataConfig, VerifierSpec
    from rlvr.data import load_rows
    import logging

    from rlvr.reward.golds import check_golds

    logging.getLogger("rlvr.reward.golds").setLevel(logging.ERROR)  # the verdicts are printed below
    sets = [
        ("gsm8k/train (answer_format gsm8k)", DataConfig(source=str(DATA / "gsm8k/train.jsonl"), answer_format="gsm8k"),
         ["math", "numeric", "gsm8k"]),
        ("gsm8k/test (answer_format gsm8k)", DataConfig(source=str(DATA / "gsm8k/test.jsonl"), answer_format="gsm8k"),
         ["math", "numeric", "gsm8k"]),
        ("gsm8k/test (raw: whole solutions)", DataConfig(source=str(DATA / "gsm8k/test.jsonl")),
         ["math", "numeric", "gsm8k"]),
        ("svamp/test", DataConfig(source=str(DATA / "svamp/test.jsonl"), question="{Body} {Question}", answer="Answer"),
         ["math", "numeric"]),
        ("math500/test", DataConfig(source=str(DATA / "math500/test.jsonl"), question="problem"), ["math"]),
        ("aime24/test", DataConfig(source=str(DATA / "aime24/test.jsonl"), question="problem"), ["math", "numeric"]),
        ("aime25/test", DataConfig(source=str(DATA / "aime25/test.jsonl"), question="problem"), ["math", "numeric"]),
        ("amc23/test", DataConfig(source=str(DATA / "amc23/test.jsonl"), question="problem"), ["math", "numeric"]),
        ("mathverify_cases (gold field)", DataConfig(source=str(DATA / "mathverify_cases/cases.jsonl"),
                                                     question="pred", answer="gold"), ["math"]),
        ("humaneval", DataConfig(source=str(DATA / "humaneval/HumanEval.jsonl"), question="prompt", answer="test"),
         ["code"]),
    ]
    out = []
    for label, cfg, verifiers in sets:
        rows = load_rows(cfg, 0)
        for name in verifiers:
            try:
                _, report = check_golds(rows, [VerifierSpec(name=name)])
                verdict = report.summary()
            except Exception as e:  # noqa: BLE001 - a refused set is a verdict too
                verdict = f"refused: {type(e).__name__}: {e}"
            out.append((label, name, verdict))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=5.0, help="per-sample limit, seconds (training default)")
    parser.add_argument("--per-family", type=int, default=20, help="generated golds per family")
    parser.add_argument("--skip-data", action="store_true", help="skip the 2738 data cases (the slow part)")
    args = parser.parse_args(argv)
    from rlvr.config import VerifierSpec

    totals = {"before": [0, 0], "after": [0, 0]}

    def tally(b: tuple[int, int], a: tuple[int, int]) -> None:
        for key, v in (("before", b), ("after", a)):
            totals[key][0] += v[0]
            totals[key][1] += v[1]

    print("false positives (FP) / false negatives (FN), before -> after items 11-12")
    if not args.skip_data:
        bench = _agreement()
        cases = bench.mathverify_cases()[0] + bench.math500_cases() + bench.gsm8k_cases() + bench.competition_cases()
        tally(*compare("data: equivalence cases", "math", BEFORE_MATH, [c.response for c in cases],
                       [c.gold for c in cases], [c.expected for c in cases], args.workers, 20.0))
    gen = generated_cases(args.per_family)
    families = sorted({f for f, *_ in gen})
    res = _score([VerifierSpec(name="math", args=BEFORE_MATH), VerifierSpec(name="math")],
                 [f"\\boxed{{{a}}}" for _, _, a, _ in gen], [g for _, g, _, _ in gen], args.workers, args.timeout)
    bk, ak = list(res)
    for fam in families:
        idx = [i for i, c in enumerate(gen) if c[0] == fam]
        exp = [gen[i][3] for i in idx]
        b = _counts([res[bk][i].score for i in idx], exp)
        a = _counts([res[ak][i].score for i in idx], exp)
        print(_line(f"generated: {fam} [math]", sum(exp), len(exp) - sum(exp), b, a))
    exp = [c[3] for c in gen]
    b, a = _counts([r.score for r in res[bk]], exp), _counts([r.score for r in res[ak]], exp)
    print(_line("generated: all families [math]", sum(exp), len(exp) - sum(exp), b, a))
    tally(b, a)
    tally(*compare("generated: towers and factorials", "math", BEFORE_MATH, [f"\\boxed{{{a}}}" for _, a, _ in HUGE],
                   [g for g, _, _ in HUGE], [e for _, _, e in HUGE], args.workers, args.timeout))
    labelled = label_cases()
    for name, before_args in (("math", BEFORE_MATH), ("numeric", BEFORE_NUMERIC)):
        tally(*compare("labels: GSM8K golds with a label", name, before_args, [r for _, r, _ in labelled],
                       [g for g, _, _ in labelled], [e for *_, e in labelled], args.workers, args.timeout))
    rows = [json.loads(x) for x in (DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[:200]]
    responses = [f"So the answer is \\boxed{{{r['answer'].rsplit('####', 1)[1].strip()}}}." for r in rows]
    golds = [r["answer"] for r in rows]
    res = _score([VerifierSpec(name="math", args=BEFORE_MATH)], responses, golds, args.workers, args.timeout)
    before_fn = sum(r.score < 1 for r in next(iter(res.values())))
    from rlvr.data.datasets import gsm8k_gold
    from rlvr.reward.golds import gold_checker

    checker = gold_checker(VerifierSpec(name="math"))
    refused = [why for why in map(checker, golds) if why is not None]

    res = _score([VerifierSpec(name="math")], responses, [gsm8k_gold(g) for g in golds], args.workers, args.timeout)
    fixed_fn = sum(r.score < 1 for r in next(iter(res.values())))
    print(f"{'solutions: GSM8K solution as gold [math]':38} cases   200 (equal 200, not 0)  before FN {before_fn} "
          f"(scored 0 silently); after: {len(refused)} refused at load ({refused[0][:70]}...); "
          f"with answer_format gsm8k FN {fixed_fn}")
    tally((0, before_fn), (0, fixed_fn))
    print(f"TOTAL (every set above): before FP {totals['before'][0]} FN {totals['before'][1]}; "
          f"after FP {totals['after'][0]} FN {totals['after'][1]}")
    print("\nload-time gold check (rlvr.reward.golds.check_golds, data.bad_gold: drop) on every data set in data/:")
    for label, name, verdict in load_verdicts():
        print(f"  {label} [{name}]: {verdict[:400]}")


if __name__ == "__main__":
    main()
