"""The math and numeric verifiers against real data, through a ScoringPool with 2 workers.

The cases come from ``benchmarks/verifier_agreement.py`` (which prints the same figures with every miss and its
reason). The expected counts are the ones measured with math-verify 0.9.0 (exact, nothing subtracted):

- math-verify's own equivalence tables: 250/268 agree with ``expected``; the 18 misses are exactly the rows of
  ``MATHVERIFY_KNOWN`` (policy: decimal comma 3, lenient spans 2; options we do not expose 4; extraction 5;
  malformed golds 2; a prose gold 1; a label that pins a math-verify bug 1). A new miss or a fixed one fails.
- MATH-500: 500/500 reference solutions verify against their answers.
- GSM8K test: 1319/1319 reference answers verify against their gold with ``numeric`` and with ``math``.
- AIME24/AIME25/AMC23: 100 answers, 511 right forms all score 1 and 200 wrong ones (``N+1``) all score 0.

The full sets run here (about 30 s on two cores); no subsampling was needed.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from rlvr.config import VerifierSpec
from rlvr.reward import Scored, ScoringPool, reward_metrics
from rlvr.reward.pool import nearest_rank
from rlvr.types import VerifyResult

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def _load_benchmark():
    path = REPO / "benchmarks" / "verifier_agreement.py"
    spec = importlib.util.spec_from_file_location("rlvr_bench_verifier_agreement", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()


@pytest.fixture(scope="module")
def math_pool():
    for name in ("mathverify_cases", "math500", "gsm8k", "aime24", "aime25", "amc23"):
        if not (REPO / "data" / name).is_dir():
            pytest.skip(f"data/{name} is missing")
    with ScoringPool([VerifierSpec(name="math")], num_workers=2, timeout_s=20.0) as pool:
        yield pool
        stats = pool.stats()
    assert stats["timeouts"] == 0 and stats["crashes"] == 0 and stats["errors"] == 0


def test_mathverify_equivalence_cases(math_pool: ScoringPool) -> None:
    cases, _ = bench.mathverify_cases()
    assert len(cases) == 268
    scored = bench.score_cases(math_pool, cases)
    missed = bench.misses(cases, scored, "math")
    assert len(cases) - len(missed) == 250
    assert sorted(int(c.key.rsplit("/", 1)[1]) for c, _ in missed) == sorted(bench.MATHVERIFY_KNOWN)
    # three of the rows the last fixes made right: `1 000`, a relation in prose, `(11,7)or(7,11)` as 2 values
    by_key = dict(zip((c.key for c in cases), scored))
    for i in (2, 88, 199):
        assert by_key[f"mathverify/{i}"].reward == 1.0, i


def test_math500_solutions_verify_against_answers(math_pool: ScoringPool) -> None:
    cases = bench.math500_cases()
    assert len(cases) == 500
    scored = bench.score_cases(math_pool, cases)
    assert bench.misses(cases, scored, "math") == []
    m = reward_metrics(scored)
    assert m["reward/mean"] == 1.0
    assert m["reward/latency_p50_s"] <= m["reward/latency_p99_s"] <= m["reward/latency_max_s"]


def test_gsm8k_reference_answers_numeric_and_math() -> None:
    if not (REPO / "data" / "gsm8k").is_dir():
        pytest.skip("data/gsm8k is missing")
    cases = bench.gsm8k_cases()
    assert len(cases) == 1319
    specs = [VerifierSpec(name="numeric"), VerifierSpec(name="math")]
    with ScoringPool(specs, num_workers=2, timeout_s=20.0) as pool:
        scored = bench.score_cases(pool, cases)
        assert pool.stats()["timeouts"] == 0
    assert bench.misses(cases, scored, "numeric") == []
    assert bench.misses(cases, scored, "math") == []
    assert [s.reward for s in scored] == [2.0] * 1319  # numeric + math, weight 1 each


def test_competition_answers_in_other_forms(math_pool: ScoringPool) -> None:
    cases = bench.competition_cases()
    right = [c for c in cases if c.expected == 1]
    wrong = [c for c in cases if c.expected == 0]
    # 100 answers x 4 forms, + 40 AMC23 `N.0`, + 2 x 2 thousands forms (AMC23 3159, 1625), + 7 AIME24 `0NN`
    assert (len(right), len(wrong)) == (400 + 40 + 4 + 7, 200)
    assert len(right) + len(wrong) == 651
    scored = bench.score_cases(math_pool, cases)
    assert bench.misses(cases, scored, "math") == []
    assert {s.results["math"].reason for c, s in zip(cases, scored) if c.expected == 0} == {"wrong"}


def _scored(latency_s: float) -> Scored:
    return Scored(reward=1.0, results={"v": VerifyResult(score=1.0)}, latency_s=latency_s)


def test_latency_percentiles_nearest_rank() -> None:
    # nearest rank: the ceil(q/100 * n)-th smallest. n = 10 latencies 0.1 .. 1.0 s (shuffled):
    # p50 -> rank 5 -> 0.5; p99 -> ceil(9.9) = rank 10 -> 1.0; p0 -> the smallest.
    values = [0.7, 0.1, 1.0, 0.3, 0.9, 0.5, 0.2, 0.8, 0.4, 0.6]
    m = reward_metrics([_scored(v) for v in values])
    assert m["reward/latency_p50_s"] == 0.5 and m["reward/latency_p99_s"] == 1.0
    assert nearest_rank(values, 0) == 0.1
    # n = 200, latencies 1 .. 200 ms: p99 -> rank 198 -> 0.198 s (the two slowest are above it); p50 -> 0.100
    ms = [(i + 1) / 1000 for i in range(200)]
    m = reward_metrics([_scored(v) for v in reversed(ms)])
    assert m["reward/latency_p99_s"] == 0.198 and m["reward/latency_p50_s"] == 0.1
    # one sample: every percentile is it
    m = reward_metrics([_scored(2.5)])
    assert m["reward/latency_p50_s"] == m["reward/latency_p99_s"] == 2.5
    with pytest.raises(ValueError):
        nearest_rank([], 50)
    with pytest.raises(ValueError):
        nearest_rank([1.0], 101)
    assert math.isclose(m["reward/latency_mean_s"], 2.5)
