"""pass@k from n samples per problem, c of them correct (Chen et al. 2021, "Evaluating Large Language Models
Trained on Code", eq. 1 and its numerically stable form in sec. 2.1).

The unbiased estimator is ``1 - C(n - c, k) / C(n, k)``, computed as the product
``1 - prod_{i = n-c+1}^{n} (1 - k / i)``: no binomial coefficients, so n in the thousands is fine (case P1:
C(2000, 1000) overflows a float). Sampling k of the n with replacement (a bootstrap) is biased (P1: 0.6836
instead of 1.0 for n=4, c=1, k=4).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: the probability that at least one of k samples drawn WITHOUT replacement from the n
    generated ones is correct, given that c of the n are.

    Choice for k > n (the estimator is undefined there): ``c == 0`` returns 0.0, since no sample was correct
    and the shortcut "fewer than k wrong samples -> 1.0" must not fire (case P2: n=2, c=0, k=5 -> 0, never 1);
    ``c > 0`` raises ``ValueError`` (draw at least k samples, or report a smaller k).
    Cases P1: (4, 1, 4) -> 1.0; (4, 1, 2) -> 0.5; (16, 4, 8) -> 0.961538; (1000, 1, 500) -> 0.5.
    Errors: ``ValueError`` unless n >= 1, 0 <= c <= n, k >= 1 (and k <= n when c > 0).
    """
    if n < 1 or not 0 <= c <= n or k < 1:
        raise ValueError(f"pass@k needs n >= 1, 0 <= c <= n and k >= 1; got n={n}, c={c}, k={k}")
    if c == 0:
        return 0.0
    if k > n:
        raise ValueError(f"pass@{k} is undefined with only n={n} samples (c={c} correct): use k <= n")
    if n - c < k:  # every draw of k includes a correct sample
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def group_pass_at_k(correct: Sequence[Sequence[bool]], ks: Iterable[int]) -> dict[int, float]:
    """Mean over problems of :func:`pass_at_k` (normaliser: the number of problems).

    ``correct[p][g]``: whether sample g of problem p is correct (truthy values count as correct); groups may
    differ in size (n = len(correct[p])). Returns ``{k: mean_p pass_at_k(n_p, c_p, k)}`` for each k.
    Errors: ``ValueError`` when ``correct`` is empty or a group is, and as :func:`pass_at_k`.
    """
    groups = [(len(row), sum(1 for x in row if x)) for row in correct]
    if not groups:
        raise ValueError("group_pass_at_k needs at least one problem")
    if any(n == 0 for n, _ in groups):
        raise ValueError("every problem needs at least one sample")
    return {k: math.fsum(pass_at_k(n, c, k) for n, c in groups) / len(groups) for k in ks}
