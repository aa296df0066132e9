"""The trajectories' failure watch: a console warning when environments, the chat template or tools fail a large share
of a step's trajectories, and every failure's whole text in ``RUN/train.log`` (what verifiers have with
``reward.warn_error_frac``: :class:`rlvr.reward.pool.FailureWatch`).

Three kinds, each read from the trajectory (:class:`rlvr.types.Completion`):

- ``environment``: the trajectory ended on an infrastructure failure (``failure`` set, ``end_reason``
  ``env: <reason>``): an environment's reset or step that raised, hung, crashed or answered garbage. The text is the
  runner's whole text, a traceback after the reason where one was kept (:func:`rlvr.envs.runner.failure`).
- ``prefix_broken``: the chat template rendered the earlier turns differently once the conversation grew, so the
  trajectory ended at the break; the text is the reason the turn loop put in its ``turn_info``.
- ``tool <name>``: a call of that tool raised, timed out or crashed (the status the tool runner puts in the
  turn's ``info["tool_calls"]``, :class:`rlvr.tools.runner.ToolRunner`); the model is shown the error and the
  trajectory goes on. Malformed calls are the model's own (``tools/malformed_frac``) and not counted here.

The share of a kind is the step's trajectories with at least one such failure, over all the step's trajectories.
"""

from __future__ import annotations

import collections
import hashlib
import logging
from dataclasses import dataclass
from typing import Sequence

from rlvr.reward.pool import ShareWatch
from rlvr.types import Completion

log = logging.getLogger("rlvr")

ENVIRONMENT = "environment"
PREFIX_BROKEN = "prefix_broken"
TOOL_FAILED = ("error", "timeout", "crashed")
"""The statuses of a tool call (:data:`rlvr.tools.execute.OUTCOMES`) that count as the call failing."""
SEEN_CAP = 1000
"""Distinct failure texts remembered (by hash) so that a text already in ``train.log`` is named, not repeated;
past this many, texts are written in full again."""
_WHERE_SHOWN = 8
_PLURAL = {"error": ("error", "errors"), "timeout": ("timeout", "timeouts"), "crashed": ("crash", "crashes")}


@dataclass(frozen=True)
class TrajectoryFailure:
    """One failure in a trajectory: ``kind`` (:data:`ENVIRONMENT`, :data:`PREFIX_BROKEN` or ``tool <name>``),
    ``status`` (a tool call's ``error`` / ``timeout`` / ``crashed``; else the kind), ``reason`` (one line) and
    ``text`` (the whole text: an environment's traceback, a tool call and its answer)."""

    kind: str
    status: str
    reason: str
    text: str


def trajectory_failures(c: Completion) -> list[TrajectoryFailure]:
    """The failures of one trajectory (none for a single-turn sample), in order: its environment failure, its
    template break, its failed tool calls."""
    out: list[TrajectoryFailure] = []
    end = c.end_reason or ""
    if c.failure is not None or end.startswith("env:"):
        text = c.failure if c.failure is not None else end[len("env:"):].strip()
        first = text.split("\n", 1)[0].strip() or "unknown failure"
        out.append(TrajectoryFailure(ENVIRONMENT, ENVIRONMENT, first, text))
    infos = [i for i in (c.turn_info or []) if isinstance(i, dict)]
    if end == PREFIX_BROKEN:
        why = next((str(i[PREFIX_BROKEN]) for i in infos if PREFIX_BROKEN in i), "the template rewrote history")
        out.append(TrajectoryFailure(PREFIX_BROKEN, PREFIX_BROKEN, why.split("\n", 1)[0], why))
    for info in infos:
        calls = info.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict) and call.get("status") in TOOL_FAILED:
                result = str(call.get("result", ""))
                out.append(TrajectoryFailure(f"tool {call.get('name', 'unknown')}", str(call["status"]),
                                             result.split("\n", 1)[0] or str(call["status"]),
                                             f"{call['status']}: {call.get('call', '')}\n-> {result}"))  # fmt: skip
    return out


class TrajectoryWatch(ShareWatch):
    """Watches each step's trajectories (module docstring): every failure's whole text goes to ``RUN/train.log``
    (logger ``rlvr`` at info, kept off the console: ``extra={"console": False}``, :class:`rlvr.console.ConsoleFilter`;
    a text already written is named by the step that wrote it, not repeated); a kind whose share reaches
    ``threshold`` warns on the console with the share, the commonest reason and an example trajectory, not repeated
    without bound (:class:`~rlvr.reward.pool.ShareWatch`). ``threshold`` None: never warns (the texts are still
    kept). Errors: ``ValueError`` for a threshold outside (0, 1]."""

    def __init__(self, threshold: float | None, setting: str = "environment.warn_failure_frac") -> None:
        super().__init__(threshold, setting)
        self.seen: dict[str, int] = {}  # hash of a text written to train.log -> the step that wrote it

    def check(self, step: int, completions: Sequence[Completion]) -> list[str]:
        """Keep the failure texts of ``completions`` (one step's B trajectories) and warn about the kinds past the
        threshold; returns the warnings logged (empty: none)."""
        found = [(c, f) for c in completions for f in trajectory_failures(c)]
        if not found:
            return []
        self._keep(step, found)
        b, out = len(completions), []
        by_kind: dict[str, list[tuple[Completion, TrajectoryFailure]]] = {}
        for c, f in found:
            by_kind.setdefault(f.kind, []).append((c, f))
        for kind, items in by_kind.items():
            k = len({id(c) for c, _ in items})
            share = k / b
            if not self.due(kind, share):
                continue
            reason, n = collections.Counter(f.reason for _, f in items).most_common(1)[0]
            c = next(c for c, f in items if f.reason == reason)
            example = f"e.g. prompt {c.prompt_index} sample {c.sample_index}: {reason!r}"
            msg = f"step {step}: " + _what(kind, items, share, k, b, example, n) + f" {self.again(share)}"
            log.warning(msg)
            out.append(msg)
        return out

    def _keep(self, step: int, found: list[tuple[Completion, TrajectoryFailure]]) -> None:
        """Each distinct (kind, text) of the step once in ``train.log``, with the trajectories that had it."""
        groups: dict[tuple[str, str], list[Completion]] = {}
        for c, f in found:
            groups.setdefault((f.kind, f.text), []).append(c)
        for (kind, text), comps in groups.items():
            where = ", ".join(f"{c.prompt_index}/{c.sample_index}" for c in comps[:_WHERE_SHOWN])
            where += f" and {len(comps) - _WHERE_SHOWN} more" if len(comps) > _WHERE_SHOWN else ""
            h = hashlib.sha256(f"{kind}\0{text}".encode()).hexdigest()
            n = f"{len(comps)} trajector{'y' if len(comps) == 1 else 'ies'}"
            head = f"step {step}: {kind} failure in {n} (prompt/sample {where})"
            if h in self.seen:
                first = text.split("\n", 1)[0]
                log.info("%s: %r, the text written at step %d", head, first, self.seen[h], extra={"console": False})
                continue
            if len(self.seen) < SEEN_CAP:
                self.seen[h] = step
            log.info("%s:\n%s", head, text, extra={"console": False})


def _what(kind: str, items: list, share: float, k: int, b: int, example: str, n: int) -> str:
    """The body of a warning about ``kind`` (``k`` of the step's ``b`` trajectories; the commonest reason ``n``
    times among ``items``)."""
    common = f"the commonest reason in {n} of {len(items)}" if len(items) > 1 else "its reason"
    if kind == ENVIRONMENT:
        return (f"{share:.0%} of the step's trajectories ({k} of {b}) ended on an environment failure, not the "
                f"policy's doing; {example} ({common}). Fix the environment (a hang: environment.timeout_s; a crash: "
                f"environment.memory_mb); each failure's whole text, its traceback where one was kept, is in "
                f"train.log.")  # fmt: skip
    if kind == PREFIX_BROKEN:
        return (f"{share:.0%} of the step's trajectories ({k} of {b}) ended prefix_broken: the chat template renders "
                f"the earlier turns differently once the conversation grows (e.g. it strips reasoning), so each ends "
                f"at the break; {example} ({common}). Use a model or chat template that extends the conversation.")
    statuses = collections.Counter(f.status for _, f in items)
    counts = ", ".join(f"{m} {_PLURAL[s][m > 1]}" for s, m in statuses.items())
    return (f"tool {kind[len('tool '):]!r} failed in {share:.0%} of the step's trajectories ({k} of {b}; {counts} "
            f"among its calls): the "
            f"model is shown the error and the trajectory goes on; {example} ({common}). A tool that fails whatever "
            f"the model asks has a bug or too tight a limit (tools.timeout_s, tools.memory_mb); each failed call is "
            f"in train.log.")  # fmt: skip
