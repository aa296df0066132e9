"""The real math verifier (math-verify) through the scoring pool, on MATH-500 reference solutions.

Each reference ``solution`` ends in a ``\\boxed{}`` answer that the data set's ``answer`` field restates (often
in another form: ``\\left( 3, \\frac{\\pi}{2} \\right)``, ``\\text{Evelyn}``, ``90^\\circ``), so a sound verifier
agrees with every one; paired with the next problem's answer, every one is wrong (the 20 answers below differ
pairwise in value, checked by eye). Row 451 writes its answer twice, ``\\boxed{15\\frac{39}{40}}, or
\\boxed{\\frac{639}{40}}``: two forms of one value, which the hedging rule must not zero.
Measured here: 21/21 agree (and 500/500 on the whole set, in-process).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.config import VerifierSpec
from rlvr.reward import RewardWorker, ScoringPool, reward_metrics

DATA = Path(__file__).resolve().parents[2] / "data" / "math500" / "test.jsonl"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    if not DATA.is_file():
        pytest.skip(f"{DATA} is missing (copy data/math500 from the shared data sets)")
    lines = DATA.read_text().splitlines()
    return [json.loads(lines[i]) for i in [*range(20), 451]]


def test_reference_solutions_agree_with_answers(rows: list[dict]) -> None:
    solutions = [r["solution"] for r in rows]
    answers = [r["answer"] for r in rows]
    with ScoringPool([VerifierSpec(name="math")], num_workers=2, timeout_s=10.0) as pool:
        right = pool.score(solutions, answers, [{"subject": r["subject"]} for r in rows])
        shifted = [answers[(i + 1) % 20] for i in range(20)]
        wrong = pool.score(solutions[:20], shifted, [{}] * 20)
        stats = pool.stats()
    agreement = sum(s.reward for s in right) / len(right)
    print(f"MATH-500 reference solutions verified against their answers: {agreement:.3f} ({len(right)} rows)")
    failed = [(r["unique_id"], s.results["math"]) for r, s in zip(rows, right) if s.reward != 1.0]
    assert failed == []
    assert [s.reward for s in wrong] == [0.0] * 20
    assert {s.results["math"].reason for s in wrong} <= {"wrong", "hedged"}
    assert stats["timeouts"] == 0 and stats["crashes"] == 0 and stats["errors"] == 0
    assert reward_metrics(right)["reward/mean"] == 1.0


def test_pool_inside_a_ray_actor(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    hang = tmp_path / "hang_verifier.py"
    hang.write_text(
        "import time\n"
        "def verify(response, gold, **row):\n"
        "    if response == 'hang':\n"
        "        time.sleep(3600)\n"
        "    return response == gold\n"
    )
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        actor = ray.remote(num_cpus=0.5)(RewardWorker).remote(
            [VerifierSpec(name="math"), VerifierSpec(name=f"{hang}:verify", weight=0.5)], 1, 2.0
        )
        out = ray.get(actor.score.remote([r"\boxed{4}", "hang", "5"], ["4", "4", "5"], [{}, {}, {}]), timeout=120)
        # reward = math + 0.5 * exact-match: "\boxed{4}" 1 + 0; "hang" timed out: 0; "5": 1 + 0.5
        assert [s.reward for s in out] == [1.0, 0.0, 1.5]
        assert out[1].results["math"].reason == "timeout"
        assert ray.get(actor.stats.remote())["timeouts"] == 1
        ray.get(actor.close.remote())
    finally:
        if started_here:
            ray.shutdown()


def test_power_towers_and_huge_factorials_within_the_sample_limit() -> None:
    # issue 9 item 11: exact values too large to compute are compared as written, never evaluated. Values by
    # hand: an expression and itself plus 1 differ; identical ones are equal. math-verify alone evaluates
    # 2^{2^{100}} against 3 and does not return (exact=False: that sample scores 0 "timeout").
    cases = [(r"2^{2^{2^{100}}}", r"2^{2^{2^{100}}}+1", 0.0), (r"2^{2^{100}}", "3", 0.0),
             ("1000000!", "1000000!+1", 0.0), ("1000000!", "1000000!", 1.0), (r"10^{10^{10}}", r"10^{10^{10}}", 1.0)]
    responses, golds = [rf"\boxed{{{a}}}" for _, a, _ in cases], [g for g, _, _ in cases]
    with ScoringPool([VerifierSpec(name="math")], num_workers=2, timeout_s=5.0) as pool:
        scored = pool.score(responses, golds, [{}] * len(cases))
        stats = pool.stats()
    assert [s.reward for s in scored] == [e for *_, e in cases]
    assert stats["timeouts"] == 0 and max(s.latency_s for s in scored) < 5.0
    with ScoringPool([VerifierSpec(name="math", args={"exact": False})], num_workers=1, timeout_s=3.0) as pool:
        hung = pool.score([responses[1]], [golds[1]], [{}])
    assert hung[0].results["math"].reason == "timeout"
