"""Where each role's time goes: busy and idle seconds per step, the overlap of generation and training, and the
timeline file ``rlvr plot`` draws (``RUN/timeline.jsonl``).

Input: the :class:`rlvr.runtime.executors.Span` of every role call (start and end taken inside the role's
process, wall-clock seconds). A role's busy time in a window is the length of the union of its spans clipped to
the window (calls of one role do not overlap: each role runs one call at a time, so the union only matters for
groups); idle = window - busy. Groups (:func:`role_group`): ``engines`` (``engine0`` ...), ``trainer``
(``trainer0`` ...), ``reward``, ``judge`` (the model-backed verifier, :mod:`rlvr.reward.judge`), ``teacher`` (on-policy
distillation, :mod:`rlvr.rollout.teacher`), ``critic``; ``sync`` is the weight transfer itself (the trainer's
``send_weights`` and the engines' ``receive_weights``, as one union). A group of several processes (engines,
trainer ranks) reports the mean over its processes.

``roles/overlap_frac``: the length of (union of the engines' ``generate`` spans) intersected with (union of the
trainer ranks' and critic's compute spans: ``train_step``, ``compute_logprobs``, ``compute_values``) over the
window: 0 for the on-policy loop (they take turns), up to min(rollout, train) / step with asynchronous rollout.

This module imports nothing heavy (no torch): the plot command reads the file it writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlvr.metrics import names as mn

GROUPS = ("engines", "reward", "judge", "teacher", "trainer", "critic", "sync")
"""The role groups reported, in the order of the timeline plot's rows."""
SYNC_METHODS = ("send_weights", "receive_weights")
TRAIN_METHODS = ("train_step", "compute_logprobs", "compute_values")


def role_group(role: str) -> str:
    """``engine3`` -> ``engines``, ``trainer1`` -> ``trainer``; ``reward``, ``judge``, ``critic`` as they are."""
    for prefix, group in (("engine", "engines"), ("trainer", "trainer")):
        if role.startswith(prefix) and role[len(prefix):].isdigit():
            return group
    return role


def group_order(role: str) -> tuple[int, str]:
    """Sort key of a role or group name: the order of :data:`GROUPS` (unknown groups last), then the name."""
    g = role_group(role)
    return (GROUPS.index(g) if g in GROUPS else len(GROUPS), role)


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged, sorted, non-overlapping intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _clip(intervals: Iterable[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    return [(max(a, t0), min(b, t1)) for a, b in intervals if b > t0 and a < t1]


def _intersection(x: Sequence[tuple[float, float]], y: Sequence[tuple[float, float]]) -> float:
    """Total length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, b - a)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def role_usage(spans: Iterable[Any], t0: float, t1: float) -> dict[str, float]:
    """The ``roles/*`` metrics of the window [t0, t1] (wall-clock seconds) from role-call spans (objects with
    ``role``, ``method``, ``start``, ``end``). Groups without a span in the window (no critic, say) are left out,
    except ``engines`` and ``trainer``, always reported. Errors: ``ValueError`` when t1 < t0."""
    if t1 < t0:
        raise ValueError(f"window ends ({t1}) before it starts ({t0})")
    window = t1 - t0
    by_role: dict[str, list[tuple[float, float]]] = {}
    sync: list[tuple[float, float]] = []
    gen: list[tuple[float, float]] = []
    train: list[tuple[float, float]] = []
    for s in spans:
        iv = (float(s.start), float(s.end))
        by_role.setdefault(s.role, []).append(iv)
        if s.method in SYNC_METHODS:
            sync.append(iv)
        if s.method == "generate" and role_group(s.role) == "engines":
            gen.append(iv)
        if s.method in TRAIN_METHODS:
            train.append(iv)
    busy: dict[str, list[float]] = {"engines": [], "trainer": []}
    for role, ivs in by_role.items():
        busy.setdefault(role_group(role), []).append(_length(_union(_clip(ivs, t0, t1))))
    if sync:
        busy["sync"] = [_length(_union(_clip(sync, t0, t1)))]
    out: dict[str, float] = {}
    for group in sorted(busy, key=group_order):
        vals = busy[group]
        b = sum(vals) / len(vals) if vals else 0.0
        out[mn.role_busy(group)] = b
        out[mn.role_idle(group)] = max(0.0, window - b)
    both = _intersection(_union(_clip(gen, t0, t1)), _union(_clip(train, t0, t1)))
    out[mn.ROLES_OVERLAP_FRAC] = both / window if window > 0 else 0.0
    return out


def staleness_metrics(completions: Sequence[Any], trainer_version: int, max_staleness: int) -> dict[str, float]:
    """``async/*`` of a trained batch of B completions: each sample's lag ``trainer_version - v`` by its oldest
    token's version ``v`` (``Completion.policy_version``; the trainer updates weights of version
    ``trainer_version``, the step number minus one), its mean and max and the histogram ``async/staleness/<n>``
    (fractions of the B samples); the same per sampled token (``async/token_staleness_mean``,
    ``async/token_staleness/<n>``: fractions of the batch's sampled tokens, ``Completion.versions``); and
    ``async/spanning_frac``, the share of the B samples whose tokens come from more than one version. Histograms
    for n = 0..max_staleness."""
    lags = [trainer_version - int(c.policy_version) for c in completions]
    tokens = [trainer_version - int(v) for c in completions for v in c.versions()]
    n, nt = max(1, len(lags)), max(1, len(tokens))
    out = {mn.ASYNC_STALENESS_MEAN: sum(lags) / n, mn.ASYNC_STALENESS_MAX: float(max(lags, default=0)),
           mn.ASYNC_TOKEN_STALENESS_MEAN: sum(tokens) / nt,
           mn.ASYNC_SPANNING_FRAC: sum(len(set(c.versions())) > 1 for c in completions) / n}  # fmt: skip
    for k in range(max_staleness + 1):
        out[mn.staleness(k)] = sum(1 for x in lags if x == k) / n
        out[mn.token_staleness(k)] = sum(1 for x in tokens if x == k) / nt
    return out


TIMELINE_FILE = "timeline.jsonl"
"""``RUN/timeline.jsonl``: one row per step, ``{"step", "start", "end", "spans": [[role, method, start, end], ...]}``
with times in seconds since the run's first step began (:func:`append_step`)."""


def append_step(run_dir: str | Path, step: int, t0: float, t1: float, spans: Iterable[Any], origin: float) -> None:
    """Add the step's window [t0, t1] and the spans that overlap it (clipped) to ``RUN/timeline.jsonl``; times are
    written relative to ``origin`` (wall-clock seconds), rounded to milliseconds."""
    rows = [[s.role, s.method, round(a - origin, 3), round(b - origin, 3)]
            for s in spans for a, b in _clip([(s.start, s.end)], t0, t1)]  # fmt: skip
    rec = {"step": step, "start": round(t0 - origin, 3), "end": round(t1 - origin, 3), "spans": rows}
    with open(Path(run_dir) / TIMELINE_FILE, "a") as f:
        f.write(json.dumps(rec) + "\n")


def read_timeline(path: str | Path) -> list[dict]:
    """The rows of a ``timeline.jsonl`` (see :data:`TIMELINE_FILE`). Errors: ``OSError``, ``json.JSONDecodeError``."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
