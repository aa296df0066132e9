"""Validation during training: the current policy on held-out problems, n samples each.

Metrics (namespaced ``val/``): ``val/pass@k`` (the unbiased estimator of Chen et al. 2021, eq. 1, over each problem's
n samples, averaged over problems), ``val/maj@n`` (majority vote over the n parsed answers: a problem counts when the
most frequent parsed answer is a correct one; ties go to the answer seen first; samples with no parsed answer do not
vote), ``val/mean@n`` (mean correctness of all samples = pass@1), ``val/reward_mean``, ``val/length_mean`` (tokens)
and ``val/truncated_frac``. A sample is correct when the primary (first) verifier gives it full marks.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import Any, Sequence

from rlvr.config import Recipe, default_ks
from rlvr.metrics.passk import pass_at_k
from rlvr.types import Prompt, SamplingConfig


def validation_prompts(recipe: Recipe, tokenizer: Any) -> list[Prompt]:
    """Held-out prompts for ``recipe.validation`` (templated like the training prompts)."""
    from rlvr.data import build_prompts, load_rows

    va = recipe.validation
    data = dataclasses.replace(
        recipe.data, source=va.source or recipe.data.source, split=va.split, limit=va.limit, shuffle=False
    )
    rows = load_rows(data, recipe.run.seed)
    prompts, _ = build_prompts(rows, tokenizer, data)
    return prompts


def majority_correct(parsed: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """maj@n of one problem: is the most frequent parsed answer (first seen wins ties) a correct one?"""
    votes = Counter(p for p in parsed if p is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(p for p in parsed if p is not None and votes[p] == top)
    return any(c for p, c in zip(parsed, correct) if p == winner)


def validation_metrics(scored: list, completions: list, n: int, primary: str) -> dict[str, float]:
    """``val/*`` metrics of P problems x n samples (prompt-major)."""
    correct = [s.results[primary].score >= 1.0 for s in scored]
    parsed = [s.results[primary].parsed for s in scored]
    b = len(scored)
    groups = range(0, b, n)
    out: dict[str, float] = {
        f"val/pass@{k}": sum(pass_at_k(n, sum(correct[i : i + n]), k) for i in groups) / len(groups)
        for k in default_ks(n)
    }
    out[f"val/maj@{n}"] = sum(majority_correct(parsed[i : i + n], correct[i : i + n]) for i in groups) / len(groups)
    out[f"val/mean@{n}"] = sum(correct) / b
    out["val/reward_mean"] = sum(s.reward for s in scored) / b
    out["val/length_mean"] = sum(len(c.token_ids) for c in completions) / b
    out["val/truncated_frac"] = sum(c.truncated for c in completions) / b
    return out


def run_validation(roles: Any, prompts: list[Prompt], recipe: Recipe, primary: str) -> dict[str, float]:
    """Sample ``validation.samples`` completions per held-out prompt with the engines' current weights; score them."""
    va = recipe.validation
    sampling = SamplingConfig(n=va.samples, max_new_tokens=recipe.rollout.max_new_tokens, temperature=va.temperature)
    t0 = time.perf_counter()
    completions, scored, _ = roles.generate_and_score(prompts, sampling)
    out = validation_metrics(scored, completions, va.samples, primary)
    out["timing/validation_s"] = time.perf_counter() - t0
    return out
