"""Throughput of the ``math`` verifier on MATH-500-length responses: ScoringPool with 1 and 2 workers, beside
serial in-process math-verify.

Responses are MATH-500's reference solutions (mean ~540 characters, each ending in ``\\boxed{}``), golds its
``answer`` field. Figures are samples per second over one pass of ``--n`` rows (wall-clock time of
``pool.score`` over the whole batch, normaliser: the sample count); the pool's start-up (forkserver, imports,
building the verifier) is timed apart and not included. "math-verify serial" is ``parse(gold)``,
``parse(solution)``, ``verify`` with math-verify's default extraction configs and its own timeouts, in this
process, one sample after another: the cost of a check without our extraction, process boundary or pool.
Each configuration runs in a fresh process state for the verifier (new pool workers; math-verify's first pass
here), so caches start cold in all three.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/verify_throughput.py`` (about 20 s on two cores).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]


def load(n: int) -> tuple[list[str], list[str]]:
    """The first ``n`` MATH-500 rows as (solutions, answers)."""
    rows = [json.loads(line) for line in (REPO / "data" / "math500" / "test.jsonl").read_text().splitlines()]
    rows = rows[:n]
    return [r["solution"] for r in rows], [r["answer"] for r in rows]


def serial_math_verify(solutions: Sequence[str], answers: Sequence[str]) -> tuple[float, int]:
    """(seconds, right count) for plain math-verify, serially in this process."""
    from math_verify import parse, verify

    start = time.monotonic()
    right = sum(bool(verify(parse(a), parse(s))) for s, a in zip(solutions, answers))
    return time.monotonic() - start, right


def pooled(solutions: Sequence[str], answers: Sequence[str], workers: int) -> tuple[float, float, int, dict]:
    """(start-up seconds, scoring seconds, right count, latency metrics) for the ``math`` verifier in a pool."""
    from rlvr.config import VerifierSpec
    from rlvr.reward import ScoringPool, reward_metrics

    start = time.monotonic()
    with ScoringPool([VerifierSpec(name="math")], num_workers=workers, timeout_s=20.0) as pool:
        ready = time.monotonic()
        scored = pool.score(list(solutions), list(answers), [{}] * len(solutions))
        done = time.monotonic()
    return ready - start, done - ready, int(sum(s.reward for s in scored)), reward_metrics(scored)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="MATH-500 rows")
    args = parser.parse_args(argv)
    solutions, answers = load(args.n)
    n = len(solutions)
    print(f"{n} MATH-500 reference solutions, mean {sum(map(len, solutions)) / n:.0f} characters")
    serial_s, serial_right = serial_math_verify(solutions, answers)
    print(f"math-verify serial, in-process: {n / serial_s:7.1f} samples/s ({serial_s:.2f} s, {serial_right}/{n} right)")
    rates = {}
    for workers in (1, 2):
        startup, took, right, m = pooled(solutions, answers, workers)
        rates[workers] = n / took
        print(f"pool, {workers} worker{'s' if workers > 1 else ' '}:            {rates[workers]:7.1f} samples/s "
              f"({took:.2f} s, {right}/{n} right; start-up {startup:.2f} s; latency p50 "
              f"{m['reward/latency_p50_s'] * 1e3:.1f} ms, p99 {m['reward/latency_p99_s'] * 1e3:.1f} ms)")
    serial_rate = n / serial_s
    print(f"ratios: 2 workers / 1 worker = {rates[2] / rates[1]:.2f}; 1 worker / serial math-verify = "
          f"{rates[1] / serial_rate:.2f}; 2 workers / serial math-verify = {rates[2] / serial_rate:.2f}")


if __name__ == "__main__":
    main()
