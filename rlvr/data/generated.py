"""The generated arithmetic task: "What is 7 plus 5?" with the exact integer as gold.

Rows are a pure function of (``GeneratedTaskConfig``, seed). They are drawn with ``random.Random(seed).random()``
only, the one stream Python guarantees to stay the same across versions (``randrange``/``choice`` may change),
so a recipe makes the same rows on every machine.

Row ``i`` takes three draws ``u1, u2, u3`` in [0, 1) from the stream, in order:
    op = ops[floor(u1 * len(ops))],   a = lo + floor(u2 * n),   b = lo + floor(u3 * n),
with ``lo = 0`` for one digit (else ``10 ** (digits - 1)``), ``n = 10 ** digits - lo`` (1 digit: 0-9, 2: 10-99).
For ``minus`` the larger operand comes first, so no gold is negative.
"""

from __future__ import annotations

from typing import Any, Literal

from rlvr.config import GeneratedTaskConfig

OPS: dict[str, Any] = {
    "plus": lambda a, b: a + b,
    "minus": lambda a, b: a - b,
    "times": lambda a, b: a * b,
}
"""Operation word -> integer function; the words appear in the question as is."""


def question_row(op: str, a: int, b: int) -> dict[str, Any]:
    """One row: ``{"question": "What is A op B?", "answer": str(exact integer), "a", "b", "op"}``; for ``minus``
    the larger operand comes first, so no gold is negative."""
    if op == "minus" and b > a:
        a, b = b, a
    return {"question": f"What is {a} {op} {b}?", "answer": str(OPS[op](a, b)), "a": a, "b": b, "op": op}


def _check(cfg: GeneratedTaskConfig) -> None:
    bad = [op for op in cfg.ops if op not in OPS]
    if not cfg.ops or bad:
        raise ValueError(
            f"data.generated.ops={list(cfg.ops)!r}: unknown or empty; choose from {list(OPS)} (e.g. [plus, minus])"
        )
    if cfg.digits < 1:
        raise ValueError(f"data.generated.digits={cfg.digits}: must be >= 1 (1: operands 0-9, 2: 10-99)")
    if cfg.size < 1:
        raise ValueError(f"data.generated.size={cfg.size}: must be >= 1")
    if not 0 <= cfg.holdout < cfg.size:
        raise ValueError(
            f"data.generated.holdout={cfg.holdout} must be in [0, data.generated.size={cfg.size}) so that "
            "training keeps at least one row; lower holdout or raise size"
        )


def generated_rows(cfg: GeneratedTaskConfig, seed: int) -> list[dict[str, Any]]:
    """All ``cfg.size`` rows of the arithmetic task for ``seed`` (training rows first, holdout last).

    Each row: ``{"question": "What is 7 plus 5?", "answer": "12", "a": 7, "b": 5, "op": "plus"}``; ``answer``
    is the exact integer as a string. Draws: see the module docstring.

    Errors: ``ValueError`` naming the ``data.generated`` key for unknown ops, digits < 1, size < 1, or
    holdout outside [0, size).
    """
    _check(cfg)
    import random

    rng = random.Random(seed)
    lo = 0 if cfg.digits == 1 else 10 ** (cfg.digits - 1)
    n = 10**cfg.digits - lo
    rows = []
    for _ in range(cfg.size):
        op = cfg.ops[int(rng.random() * len(cfg.ops))]
        a = lo + int(rng.random() * n)
        b = lo + int(rng.random() * n)
        rows.append(question_row(op, a, b))
    return rows


def generated_split(
    cfg: GeneratedTaskConfig, seed: int, part: Literal["train", "holdout"] = "train"
) -> list[dict[str, Any]]:
    """The training rows (the first ``size - holdout``) or the holdout rows (the last ``holdout``).

    ``cfg.holdout_by``: ``row`` splits by position, so with few distinct questions (one digit, one op: 100) and a
    large ``size`` a holdout question also appears among the training rows. ``question`` splits by question: the
    holdout rows are the last ``holdout`` rows with repeated questions dropped (the first kept), and the training
    rows are the first ``size - holdout`` rows less every row asking a held-out question, in order.

    Errors: as :func:`generated_rows`; ``ValueError`` for an unknown ``part``, and for ``question`` when no
    training row is left (every training question is also held out: lower ``holdout`` or raise ``size``).
    """
    rows = generated_rows(cfg, seed)
    cut = cfg.size - cfg.holdout
    if part not in ("train", "holdout"):
        raise ValueError(f"part={part!r}: choose 'train' or 'holdout'")
    if cfg.holdout_by == "row":
        return rows[:cut] if part == "train" else rows[cut:]
    if cfg.holdout_by != "question":
        raise ValueError(f"data.generated.holdout_by={cfg.holdout_by!r}: choose row or question")
    held: dict[str, dict[str, Any]] = {}
    for r in rows[cut:]:
        held.setdefault(r["question"], r)
    if part == "holdout":
        return list(held.values())
    train = [r for r in rows[:cut] if r["question"] not in held]
    if not train:
        raise ValueError(
            f"data.generated.holdout_by=question: all {cut} training rows ask held-out questions "
            f"({len(held)} held out); lower data.generated.holdout or raise data.generated.size"
        )
    return train
