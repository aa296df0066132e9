"""HumanEval through the ``code`` verifier: the 164 canonical solutions pass, the 164 broken ones fail, and the
verifier works inside the ScoringPool's worker processes.

The counts are HumanEval's own ground truth (its canonical solutions pass its tests; ``return None`` bodies
fail all of them, 159 on an assert and 5 on a TypeError inside the test, measured); timings are printed
(``-s``) and bounded loosely (about 20 s for both passes on two cores).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from rlvr.config import VerifierSpec
from rlvr.reward.pool import ScoringPool

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("humaneval_rates", REPO / "benchmarks" / "humaneval_rates.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # ~45 s: all 164 problems; the code verifier's unit tests run in CI
def test_humaneval_canonical_pass_and_broken_fail():
    bench = _bench()
    start = time.monotonic()
    mode, (canonical, broken) = bench.rates(threads=2, timeout_s=10.0)
    total_s = time.monotonic() - start
    print(f"\nisolation: {mode}")
    for r in (canonical, broken):
        print(f"{r.name}: {r.passed}/{r.total} in {r.wall_s:.1f} s, slowest run {r.max_run_s:.2f} s")
    print(f"both passes: {total_s:.1f} s")
    assert (canonical.total, canonical.passed, canonical.misses) == (164, 164, [])
    assert (broken.total, broken.passed, broken.misses) == (164, 0, [])
    assert canonical.max_run_s < 10.0 and broken.max_run_s < 10.0


def test_code_verifier_in_the_scoring_pool():
    rows = _bench().load_rows()[:4]
    responses = [rows[0]["canonical_solution"], "    return None\n", f"```python\n{rows[2]['prompt']}"
                 f"{rows[2]['canonical_solution']}```", "```python\nwhile True:\n    pass\n```"]  # fmt: skip
    with ScoringPool([VerifierSpec(name="code", args={"timeout_s": 2.0})], num_workers=2, timeout_s=30) as pool:
        scored = pool.score(responses, [""] * 4, rows)
    got = [(s.reward, s.results["code"].reason) for s in scored]
    assert got == [(1.0, None), (0.0, "failed: AssertionError"), (1.0, None), (0.0, "timeout")]
