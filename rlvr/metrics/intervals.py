"""Confidence intervals of per-problem means by the percentile bootstrap over problems.

Evaluation metrics (pass@k, maj@k, mean@k) are means over P problems of a per-problem value. Problems are the
independent units (the n samples of one problem are not independent of each other), so the interval resamples
problems: draw P problems with replacement, take the mean of each metric, repeat ``resamples`` times, and
report the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of those means: the percentile interval of
Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13.3. All metrics share the same resampled
problem sets (a paired bootstrap), so the draws are reproducible from ``seed`` alone.

Only the spread across problems is captured: the interval is for "this model on problems like these", given
each problem's n samples. One problem, or problems that all have the same value, give a zero-width interval.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 1000
"""Resamples of the problems used by ``rlvr eval`` (1000: the quantiles move by about 0.005 between seeds for
a metric with per-problem values in [0, 1] and P = 200; raise it for tighter interval ends)."""
BOOTSTRAP_SEED = 0
"""Seed of the bootstrap's generator (``numpy.random.default_rng``) in ``rlvr eval``."""
CONFIDENCE = 0.95
"""Coverage of the reported intervals."""
_CHUNK = 64


def bootstrap_ci(
    values: Sequence[float] | Sequence[Sequence[float]] | np.ndarray,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile-bootstrap interval of the mean over problems, for each column of ``values``.

    ``values``: [P] or [P, M], P = problems, M = metrics (e.g. pass@1 .. pass@n); row p holds problem p's
    per-problem values. Each resample draws P row indices uniformly with replacement (the same rows for every
    column); its statistic is the column mean (normaliser P). The ends are ``numpy.quantile`` (its default
    linear interpolation between order statistics) at ``(1 - level) / 2`` and ``(1 + level) / 2`` of the
    ``resamples`` means (Efron & Tibshirani 1993, ch. 13.3). Deterministic for a given ``seed``.

    Returns ``(low, high)``: arrays of shape [M] (shape [] for a 1-D input), low <= high.
    Errors: ``ValueError`` when there are no problems, ``values`` has more than 2 dimensions or holds a
    non-finite value, ``resamples < 1`` or ``level`` is not in (0, 1).
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.shape[0] == 0:
        raise ValueError(f"bootstrap_ci needs values of shape [P] or [P, M] with P >= 1, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("bootstrap_ci: values hold NaN or inf; per-problem values must be finite")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"bootstrap_ci needs resamples >= 1 and 0 < level < 1, got {resamples} and {level}")
    squeeze = arr.ndim == 1
    table = arr[:, None] if squeeze else arr  # [P, M]
    p = table.shape[0]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, p, size=(resamples, p))  # [R, P] problem indices, R = resamples
    # [R, M] resample means, normaliser P; in chunks of rows so that the gathered [r, P, M] block stays small
    means = np.concatenate([table[idx[i : i + _CHUNK]].mean(axis=1) for i in range(0, resamples, _CHUNK)])
    low = np.quantile(means, (1 - level) / 2, axis=0)
    high = np.quantile(means, (1 + level) / 2, axis=0)
    if squeeze:
        return low[0], high[0]
    return low, high
