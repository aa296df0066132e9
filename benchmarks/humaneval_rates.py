"""Pass rates of the ``code`` verifier on HumanEval's own solutions (expected 164/164) and on broken ones
(expected 0/164).

- ``canonical``: each task's ``canonical_solution`` (a body continuing the prompt) as the response.
- ``broken``: each task's body replaced by ``    return None``.

Runs ``threads`` sandboxes at once (a thread pool; each run is its own subprocess). Prints the isolation mode,
both rates, every miss with its reason, and the wall-clock time of the whole pass and of the slowest single run.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/humaneval_rates.py [--threads 2]`` (about 20 s on two
cores). ``tests/integration/test_humaneval.py`` imports this file and asserts the counts.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr_verifiers.code import CodeVerifier

DATA = Path(__file__).resolve().parents[1] / "data" / "humaneval" / "HumanEval.jsonl"
BROKEN_BODY = "    return None\n"


@dataclass
class Rate:
    """One pass over the tasks: ``passed`` of ``total``; ``misses`` lists ``(task_id, reason)`` of the tasks
    whose score differs from ``expected``; ``wall_s`` the whole pass, ``max_run_s`` the slowest verify call."""

    name: str
    expected: float
    total: int = 0
    passed: int = 0
    misses: list[tuple[str, str | None]] = field(default_factory=list)
    wall_s: float = 0.0
    max_run_s: float = 0.0


def load_rows(path: Path = DATA) -> list[dict[str, Any]]:
    """HumanEval's 164 rows: task_id, prompt, entry_point, canonical_solution, test."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def measure(
    name: str, responses: list[str], rows: list[dict[str, Any]], expected: float, verifier: CodeVerifier,
    threads: int,
) -> Rate:  # fmt: skip
    """Score ``responses[i]`` against ``rows[i]`` with ``threads`` runs at once."""

    def one(i: int):
        start = time.monotonic()
        result = verifier.verify(responses[i], "", **rows[i])
        return result, time.monotonic() - start

    rate = Rate(name=name, expected=expected, total=len(rows))
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        outcomes = list(pool.map(one, range(len(rows))))
    rate.wall_s = time.monotonic() - start
    for row, (result, elapsed) in zip(rows, outcomes):
        rate.passed += int(result.score == 1.0)
        rate.max_run_s = max(rate.max_run_s, elapsed)
        if result.score != expected:
            rate.misses.append((row["task_id"], result.reason))
    return rate


def rates(threads: int = 2, timeout_s: float = 10.0) -> tuple[str, list[Rate]]:
    """The isolation mode's description and the two passes (``canonical``, ``broken``)."""
    rows = load_rows()
    verifier = CodeVerifier(timeout_s=timeout_s)
    mode = verifier.isolation.describe()
    canonical = measure("canonical", [r["canonical_solution"] for r in rows], rows, 1.0, verifier, threads)
    broken = measure("broken", [BROKEN_BODY] * len(rows), rows, 0.0, verifier, threads)
    return mode, [canonical, broken]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="sandboxes running at once")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="wall-clock limit per run")
    args = parser.parse_args()
    mode, results = rates(args.threads, args.timeout_s)
    print(f"isolation: {mode}")
    for r in results:
        print(
            f"{r.name:10s} passed {r.passed}/{r.total} (expected {'all' if r.expected else 'none'}); "
            f"{len(r.misses)} misses; {r.wall_s:.1f} s wall ({r.wall_s / max(r.total, 1) * args.threads:.3f} s per "
            f"run), slowest run {r.max_run_s:.2f} s"
        )
        for task_id, reason in r.misses:
            print(f"  miss {task_id}: {reason}")


if __name__ == "__main__":
    main()
