"""Sampled-evaluation metrics shared by validation during training and ``rlvr eval`` (:mod:`rlvr.evaluate`).

A problem has n samples; sample j is *correct* when the primary (first) verifier gives it full marks (score >= 1)
and has a *parsed* answer (the verifier's extraction, None when it found none). Per problem, for 1 <= k <= n:

- ``pass@k``: the unbiased estimator of Chen et al. 2021, eq. 1 (:func:`rlvr.metrics.passk.pass_at_k`): the
  probability that at least one of k samples drawn without replacement from the n is correct.
- ``maj@k``: the expected correctness of a majority vote over k samples drawn uniformly without replacement from
  the n (:func:`maj_at_k`; exact, no sampling). Votes: every correct sample votes for one answer, the gold (all
  correct answers equal the gold, so ``12`` and ``12.0`` do not split the vote); a wrong sample votes for its
  parsed text (exact string match); a wrong sample with no parsed answer abstains. The vote is correct when the
  gold's count is the largest; a tie between t answers that include the gold counts 1/t (a uniformly random tie
  break), nobody voting counts 0. Averaging over all k-subsets makes it an unbiased estimate of maj@k for k
  fresh samples (a U-statistic), as pass@k is for pass@k; at k = n it is the vote over all n samples.
- ``mean@k``: the expected fraction of correct samples among k drawn without replacement, which is c / n for
  every k (a k-subset's mean has the n-sample mean as its expectation); equal to pass@1 and maj@1.

Reported metrics are means over problems (normaliser: the number of problems P).

Validation during training logs (namespaced ``val/``): ``val/pass@k`` for k = 1, powers of 2 below n, and n;
``val/maj@n``; ``val/mean@n`` (= pass@1); ``val/reward_mean`` (mean weighted reward over all P x n samples);
``val/length_mean`` (tokens per sample) and ``val/truncated_frac`` (fraction of samples cut by the token limit).
Each validation also appends its per-problem outcomes to ``RUN/validation.jsonl`` (:func:`validation_record`), from
which the same metrics with intervals over problems can be recomputed (``benchmarks/passk_preservation.py`` does).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter, defaultdict
from fractions import Fraction
from functools import lru_cache
from math import comb
from pathlib import Path
from typing import Any, Sequence

from rlvr.config import Recipe, default_ks
from rlvr.metrics import names as mn
from rlvr.metrics.passk import pass_at_k
from rlvr.types import Prompt, SamplingConfig

_GOLD = object()
"""The vote of every correct sample (see the module docstring)."""


def validation_prompts(recipe: Recipe, tokenizer: Any) -> list[Prompt]:
    """Held-out prompts for ``recipe.validation`` (templated like the training prompts; golds checked under
    ``data.bad_gold`` as the training rows are: :func:`rlvr.reward.golds.check_golds`).

    Errors: those of :func:`rlvr.data.load_rows`, :func:`~rlvr.reward.golds.check_golds` and
    :func:`~rlvr.data.build_prompts`."""
    from rlvr.data import build_prompts, load_rows
    from rlvr.reward.golds import check_golds

    va = recipe.validation
    data = dataclasses.replace(
        recipe.data, source=va.source or recipe.data.source, split=va.split, limit=va.limit, shuffle=False
    )
    rows = load_rows(data, recipe.run.seed)
    rows, _ = check_golds(rows, recipe.reward.verifiers, recipe.data.bad_gold, recipe.timeouts.gold_check_s)
    from rlvr.tools.formats import recipe_tool_listing

    prompts, _ = build_prompts(rows, tokenizer, data, tools=recipe_tool_listing(recipe.tools, recipe.data, tokenizer))
    return prompts


def _votes(parsed: Sequence[str | None], correct: Sequence[bool]) -> list[object | None]:
    """Each sample's vote: ``_GOLD`` when correct, its parsed text when wrong, None (abstain) when wrong, unparsed."""
    if len(parsed) != len(correct):
        raise ValueError(f"parsed ({len(parsed)}) and correct ({len(correct)}) must be one per sample")
    return [_GOLD if c else p for p, c in zip(parsed, correct)]


def majority_correct(parsed: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """One majority vote over all the samples given: is the most voted answer the gold?

    Votes as in the module docstring (correct samples vote together for the gold); a tie goes to the answer
    whose first vote comes first; no votes: False. This is the vote a reader would take over one list of
    samples; the metric ``maj@k`` (:func:`maj_at_k`) breaks ties at random instead (its expectation equals this
    rule's, averaged over the order of the samples). Errors: ``ValueError`` for lists of different lengths.
    """
    votes = _votes(parsed, correct)
    counts = Counter(v for v in votes if v is not None)
    if not counts:
        return False
    top = max(counts.values())
    winner = next(v for v in votes if v is not None and counts[v] == top)
    return winner is _GOLD


def maj_at_k(parsed: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """maj@k of one problem: the expected correctness of the majority vote over k of its n samples, averaged over
    all C(n, k) subsets drawn without replacement; a tie of t answers including the gold counts 1/t (module
    docstring). Exact: counts subsets by a dynamic programme over answer classes, O(k^3 x answers) at worst.

    Hand-worked (n = 4; answers 7 (correct), 5, 5, none): maj@1 = 1/4, maj@2 = 1/3, maj@3 = 1/4, maj@4 = 0.
    Errors: ``ValueError`` unless 1 <= k <= n and the lists have one entry per sample.
    """
    votes = _votes(parsed, correct)
    n = len(votes)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n; got k={k}, n={n}")
    m_gold = sum(1 for v in votes if v is _GOLD)
    wrong = Counter(v for v in votes if v is not None and v is not _GOLD)
    m_abstain = sum(1 for v in votes if v is None)
    return _expected_majority(m_gold, tuple(sorted(wrong.values())), m_abstain, k)


@lru_cache(maxsize=4096)
def _expected_majority(m_gold: int, wrong: tuple[int, ...], m_abstain: int, k: int) -> float:
    """Sum over k-subsets of the vote's credit, divided by C(n, k) (n = m_gold + sum(wrong) + m_abstain).

    For each x >= 1 gold votes in the subset: choose x of the m_gold; a DP over the wrong answers (class sizes
    ``wrong``) counts the ways to draw s wrong votes with every class at most x, t classes exactly at x (ties);
    the abstainers fill the remaining k - x - s. Credit of such a subset: 1 / (1 + t).
    """
    n = m_gold + sum(wrong) + m_abstain
    total = Fraction(0)
    for x in range(1, min(m_gold, k) + 1):
        ways: dict[tuple[int, int], int] = {(0, 0): 1}  # (s wrong votes drawn, t classes tied at x) -> subsets
        for m in wrong:
            nxt: dict[tuple[int, int], int] = defaultdict(int)
            for (s, t), w in ways.items():
                for y in range(min(m, x, k - x - s) + 1):
                    nxt[(s + y, t + (y == x))] += w * comb(m, y)
            ways = nxt
        for (s, t), w in ways.items():
            rest = k - x - s
            if 0 <= rest <= m_abstain:
                total += Fraction(comb(m_gold, x) * w * comb(m_abstain, rest), 1 + t)
    return float(total / comb(n, k))


def problem_metrics(
    correct: Sequence[Sequence[bool]], parsed: Sequence[Sequence[str | None]], ks: Sequence[int]
) -> dict[str, list[float]]:
    """Per-problem ``pass@k``, ``maj@k`` and ``mean@k`` (module docstring) for each k in ``ks``.

    ``correct[p][j]``, ``parsed[p][j]``: sample j of problem p (P problems, n_p samples each; every k <= n_p).
    Returns ``{"pass@k": [P], "maj@k": [P], "mean@k": [P]}`` for each k, keys ordered pass, maj, mean by k.
    Errors: ``ValueError`` for no problems, mismatched lists, a problem without samples or a k > n_p.
    """
    if not correct or len(correct) != len(parsed):
        raise ValueError(f"problem_metrics needs P >= 1 problems in both lists, got {len(correct)} and {len(parsed)}")
    out: dict[str, list[float]] = {}
    for name in ("pass", "maj", "mean"):
        for k in ks:
            out[f"{name}@{k}"] = []
    for cor, par in zip(correct, parsed):
        n, c = len(cor), sum(1 for x in cor if x)
        if n == 0 or any(k > n for k in ks):
            raise ValueError(f"a problem has {n} samples: every k in {list(ks)} must be in 1..{n}")
        for k in ks:
            out[f"pass@{k}"].append(pass_at_k(n, c, k))
            out[f"maj@{k}"].append(maj_at_k(par, cor, k))
            out[f"mean@{k}"].append(c / n)
    return out


def mean_over_problems(per_problem: dict[str, list[float]]) -> dict[str, float]:
    """Each metric's mean over problems (normaliser: the number of problems P)."""
    return {key: sum(vals) / len(vals) for key, vals in per_problem.items()}


def problem_outcomes(scored: Sequence[Any], n: int, primary: str) -> tuple[list[list[bool]], list[list[str | None]]]:
    """``(correct, parsed)``, each [P][n]: sample j of problem p is ``scored[p * n + j]`` (prompt-major, P = B / n),
    correct when the ``primary`` verifier gives it full marks (score >= 1), parsed its extracted answer (None: none).
    The input of :func:`problem_metrics`; a trailing partial group (B not a multiple of n) becomes a shorter problem."""
    groups = [scored[i : i + n] for i in range(0, len(scored), n)]
    return ([[s.results[primary].score >= 1.0 for s in g] for g in groups],
            [[s.results[primary].parsed for s in g] for g in groups])  # fmt: skip


def validation_metrics(scored: list, completions: list, n: int, primary: str) -> dict[str, float]:
    """``val/*`` metrics (module docstring) of P problems x n samples, prompt-major (``scored[p * n + j]``).

    ``scored``: [P x n] :class:`rlvr.reward.pool.Scored`; ``completions``: [P x n] :class:`~rlvr.types.Completion`;
    ``primary``: the verifier key whose full marks make a sample correct. Errors: ``ValueError`` when the
    lists are empty or their length is not a multiple of n.
    """
    b = len(scored)
    if b == 0 or b % n or len(completions) != b:
        raise ValueError(f"validation_metrics needs P x n = {b} scores and as many completions (n = {n})")
    ks = default_ks(n)
    per = problem_metrics(*problem_outcomes(scored, n, primary), ks)
    means = mean_over_problems(per)
    out = {mn.val_pass(k): means[f"pass@{k}"] for k in ks}
    out[mn.val_maj(n)] = means[f"maj@{n}"]
    out[mn.val_mean(n)] = means[f"mean@{n}"]
    out[mn.VAL_REWARD_MEAN] = sum(s.reward for s in scored) / b
    out[mn.VAL_LENGTH_MEAN] = sum(c.sampled_tokens for c in completions) / b
    out[mn.VAL_TRUNCATED_FRAC] = sum(c.truncated for c in completions) / b
    return out


def validation_record(step: int, prompts: list[Prompt], scored: list, n: int, primary: str) -> dict[str, Any]:
    """One line of ``RUN/validation.jsonl``: what each held-out problem's n samples scored at ``step``, enough to
    recompute every ``val/*`` pass@k and maj@k and their intervals over problems afterwards (as ``rlvr eval`` does:
    :func:`problem_metrics`, :func:`rlvr.metrics.intervals.bootstrap_ci`).

    ``{"step": step, "n": n, "problems": [{"index", "gold", "correct": [n] bools, "parsed": [n] str|None}]}``,
    problems in the order of ``prompts`` (``scored`` prompt-major, [P x n]). Errors: ``ValueError`` when
    ``len(scored) != len(prompts) * n``.
    """
    if len(scored) != len(prompts) * n:
        raise ValueError(f"validation_record needs {len(prompts)} x {n} scores, got {len(scored)}")
    correct, parsed = problem_outcomes(scored, n, primary)
    problems = [{"index": p.index, "gold": p.gold, "correct": c, "parsed": a} for p, c, a in zip(prompts, correct, parsed)]
    return {"step": int(step), "n": int(n), "problems": problems}


def run_validation(
    generate: Any, prompts: list[Prompt], recipe: Recipe, primary: str, *, step: int = 0, record: Path | None = None
) -> dict[str, float]:
    """Sample ``validation.samples`` completions per held-out prompt with the engines' current weights; score them.

    ``record``: a file (``RUN/validation.jsonl``); when given, :func:`validation_record` at ``step`` is appended to it
    as one JSON line."""
    va = recipe.validation
    sampling = SamplingConfig(n=va.samples, max_new_tokens=recipe.rollout.max_new_tokens, temperature=va.temperature)
    t0 = time.perf_counter()
    completions, scored, _ = generate(prompts, sampling)
    out = validation_metrics(scored, completions, va.samples, primary)
    out[mn.TIMING_VALIDATION_S] = time.perf_counter() - t0
    if record is not None:
        with open(record, "a", encoding="utf-8") as f:
            f.write(json.dumps(validation_record(step, prompts, scored, va.samples, primary)) + "\n")
    return out
