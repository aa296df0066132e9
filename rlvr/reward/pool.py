"""Scoring pool: the recipe's verifiers in worker processes, with a hard wall-clock limit per sample.

Model output is untrusted input: a verifier can hang (math-verify on towers of powers), exhaust memory or kill
its process. So every sample is scored in a worker process of a :class:`~rlvr.workers.ProcessPool`
(forkserver or spawn, never threads; the module docstring of :mod:`rlvr.workers` says why). Each worker
builds the verifiers once.

Per sample, exactly one :class:`Scored` comes back, in input order, always:

- a worker still busy ``timeout_s`` seconds after the sample was sent is killed (SIGKILL) and replaced; the
  sample scores 0 with reason ``timeout`` for every verifier;
- a worker that dies while scoring (a segfault, ``os._exit``, the OOM killer, ``memory_mb`` exceeded, a kill from
  outside) is replaced and the sample is scored once more, on a fresh worker: a worker lost to the machine (the
  OOM killer taking the largest process, a node's trouble) is an infrastructure fault, never the policy's 0
  (issue 41), and the second score stands (``Scored.rescored``); a sample that kills its worker again scores 0
  with reason ``crashed``: then the answer itself is what kills it (a blow-up past ``memory_mb``), the policy's
  outcome like a timeout;
- a verifier that raises scores 0 for that sample with reason ``error: <ExcType>: msg``; the worker lives on;
- a verifier that returns no valid score (not a number, NaN, or outside [0, 1]:
  :class:`~rlvr.reward.base.InvalidScoreError`) scores 0 for that sample with reason ``error: score 7.5 outside
  [0, 1]`` (:data:`~rlvr.reward.base.INVALID_SCORE`), as one that raised: never counted correct, and its weighted
  term adds nothing to the reward; the other verifiers' scores of the sample stand.

A replacement worker's start-up (imports, building the verifiers) is not counted against any sample's limit.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from rlvr.config import VerifierSpec
from rlvr.metrics import names as mn
from rlvr.reward.base import INVALID_SCORE, InvalidScoreError, build_verifier, coerce_result, resolve_verifier
from rlvr.types import VerifyResult
from rlvr.userfiles import is_file_target
from rlvr.workers import ProcessPool, error_reason

log = logging.getLogger("rlvr")

_ROW_KEYS_RESERVED = ("response", "gold")


@dataclass(frozen=True, kw_only=True)
class Scored:
    """The reward of one sample.

    ``reward``: sum over verifiers of ``weight * score`` (the recipe's weights; no normaliser).
    ``results``: each verifier's verdict, keyed by the verifier's short name (see :func:`verifier_keys`).
    ``latency_s``: wall-clock seconds from sending the sample to a worker to its result (or to the kill).
    """

    reward: float
    results: dict[str, VerifyResult]
    latency_s: float
    rescored: bool = False
    """The first worker died while scoring this sample and a fresh one scored it (an infrastructure fault
    recovered; ``latency_s`` covers both tries)."""

    def failed(self, reason: str) -> bool:
        """True when some verifier's reason is ``reason``; for ``error``, one that starts with ``error:`` (the
        verifier raised, or returned no valid score); for ``invalid_score``, one that starts with
        :data:`~rlvr.reward.base.INVALID_SCORE` (no valid score only)."""
        if reason in ("error", "invalid_score"):
            prefix = "error:" if reason == "error" else INVALID_SCORE
            return any((r.reason or "").startswith(prefix) for r in self.results.values())
        return any(r.reason == reason for r in self.results.values())


def verifier_key(spec: VerifierSpec) -> str:
    """A verifier's short name before repeats are numbered: ``spec.key`` when given; else, for ``module:attr`` and
    ``path/file.py:attr``, the attribute (the text after the last colon: ``fn`` whether the file is named
    ``verifiers/mine.py``, ``/abs/verifiers/mine.py`` or ``pkg.mine``); else the name (``math``, an entry point)."""
    if spec.key is not None:
        return spec.key
    return spec.name.rpartition(":")[2] if ":" in spec.name else spec.name


def verifier_keys(specs: Sequence[VerifierSpec], where: str = "reward.verifiers") -> list[str]:
    """Result and metric keys of the verifiers (``reward/score/<key>``), in order: each spec's
    :func:`verifier_key`, with ``#2``, ``#3`` ... when the same name (no ``key``) is listed again.

    Errors: ``ValueError`` when two different verifiers get one key (``a/check.py:score`` and
    ``b/check.py:score``, or a ``key`` that another verifier already has), naming both entries of ``where`` and
    the fix: a ``key:`` of its own for one of them.
    """
    first: dict[str, tuple[int, VerifierSpec]] = {}
    repeats: collections.Counter[str] = collections.Counter()
    keys = []
    for i, spec in enumerate(specs):
        key = verifier_key(spec)
        if key in first:
            j, other = first[key]
            if spec.key is not None or other.key is not None or spec.name != other.name:
                raise ValueError(
                    f"{where}[{j}] ({other.name!r}) and {where}[{i}] ({spec.name!r}) would both be keyed {key!r} in "
                    f"the results and metrics (reward/score/{key}): give {where}[{i}] a key of its own, e.g. "
                    f"`- {{name: {spec.name}, key: {key}_{i + 1}}}`"
                )
            repeats[key] += 1
            key = f"{key}#{repeats[key] + 1}"
            if key in first:
                raise ValueError(f"{where}[{first[key][0]}] has the key {key!r}, which {where}[{i}] gets as a repeat "
                                 f"of {spec.name!r}: give one of them another key")  # fmt: skip
        first[key] = (i, spec)
        keys.append(key)
    return keys


def _absolute(spec: VerifierSpec) -> VerifierSpec:
    """The spec with a ``file.py:attr`` path made absolute (workers must not depend on the working directory)."""
    if ":" not in spec.name or not is_file_target(spec.name):
        return spec
    target, _, attr = spec.name.rpartition(":")
    return dataclasses.replace(spec, name=f"{Path(target).expanduser().resolve()}:{attr}")


def _safe(value: Any) -> VerifyResult:
    """A verifier's result as a plain VerifyResult that pickles (parsed text capped at 2000 characters)."""
    r = coerce_result(value)
    parsed = None if r.parsed is None else str(r.parsed)[:2000]
    reason = None if r.reason is None else str(r.reason)[:500]
    return VerifyResult(score=float(r.score), parsed=parsed, reason=reason)


def _error(exc: BaseException) -> VerifyResult:
    """Score 0 with reason ``error: <ExcType>: msg``, or ``error: score ...`` (:data:`INVALID_SCORE`) for a verifier
    that returned no valid score."""
    if isinstance(exc, InvalidScoreError):
        return VerifyResult(score=0.0, parsed=None, reason=f"error: {str(exc)[:300]}")
    return VerifyResult(score=0.0, parsed=None, reason=error_reason(exc))


def _build_scorer(specs: tuple[VerifierSpec, ...], keys: list[str]) -> Callable[[tuple], dict[str, VerifyResult]]:
    """A scoring worker's handler (:class:`~rlvr.workers.ProcessPool`): the verifiers built once, then
    ``(response, gold, row) -> {key: VerifyResult}``, a verifier that raises scoring 0 with its reason."""
    verifiers = [(key, build_verifier(spec)) for key, spec in zip(keys, specs)]

    def score(job: tuple) -> dict[str, VerifyResult]:
        response, gold, row = job
        results = {}
        for key, verifier in verifiers:
            try:
                results[key] = _safe(verifier.verify(response, gold, **row))
            except Exception as e:  # noqa: BLE001 - a verifier's bug scores 0 with a reason
                results[key] = _error(e)
        return results

    return score


class ScoringPool:
    """Scores completions with the recipe's verifiers in ``num_workers`` processes (see the module docstring;
    the processes are a :class:`~rlvr.workers.ProcessPool`).

    Args:
        specs: the verifiers; a sample's reward is the weighted sum of their scores.
        num_workers: worker processes (each scores one sample at a time).
        timeout_s: hard wall-clock limit per sample, all verifiers together, in seconds.
        memory_mb: address-space limit per worker (``RLIMIT_AS``, MiB), set after the verifiers are built;
            None: no limit. A sample over it scores ``error: MemoryError`` or ``crashed``.
        start_method: ``forkserver`` (default where available) or ``spawn``. With forkserver, the modules a
            verifier class lists in a ``preload_modules`` attribute are imported once in the fork server (by
            the first pool of the process), so a replacement worker starts in milliseconds.

    Errors: ``ValueError`` for empty specs or non-positive sizes; the errors of
    :func:`~rlvr.reward.base.resolve_verifier` for a name that does not resolve (raised here, in the caller's
    process) and of :func:`verifier_keys` for two verifiers with one key; ``RuntimeError`` when a worker cannot
    build its verifiers (the message holds its traceback) or workers keep dying before they are ready.
    """

    def __init__(
        self,
        specs: Sequence[VerifierSpec],
        num_workers: int,
        timeout_s: float,
        memory_mb: int | None = None,
        *,
        start_method: str | None = None,
    ) -> None:
        if not specs:
            raise ValueError("ScoringPool needs at least one verifier spec")
        self._specs = tuple(_absolute(s) for s in specs)
        preload = ["rlvr.reward.pool"]
        for spec in self._specs:  # fail fast, in the caller's process, on a name that does not resolve
            target = resolve_verifier(spec.name)
            preload.extend(getattr(target, "preload_modules", ()))
        self.keys = verifier_keys(specs)  # short names, whichever way a file is named
        self.weights = {k: s.weight for k, s in zip(self.keys, self._specs)}
        self.timeout_s = float(timeout_s)
        self.memory_mb = memory_mb
        self._errors = 0
        self._rescored = 0
        self._pool = ProcessPool(_build_scorer, (self._specs, self.keys), num_workers, timeout_s, memory_mb,
                                 name="scoring", what="its verifiers", preload=preload, start_method=start_method)

    # -- public API --------------------------------------------------------------------------------------
    def score(
        self, responses: Sequence[str], golds: Sequence[str], rows: Sequence[dict[str, Any]]
    ) -> list[Scored]:
        """Score ``B`` samples: ``responses[i]`` against ``golds[i]`` with the data row ``rows[i]``.

        Returns ``[B]`` :class:`Scored`, in input order, one per sample whatever happens to the workers (a
        timeout, a crash: every verifier scores 0 with that reason). Keys ``response`` and ``gold`` of a row are
        not passed on (they would clash with the arguments).
        Errors: ``ValueError`` when the three lists differ in length; ``RuntimeError`` on a closed pool or when
        replacement workers cannot start.
        """
        n = len(responses)
        if len(golds) != n or len(rows) != n:
            raise ValueError(
                f"score needs equal lengths, got {n} responses, {len(golds)} golds, {len(rows)} rows"
            )
        jobs = [(str(responses[i]), str(golds[i]),
                 {k: v for k, v in (rows[i] or {}).items() if k not in _ROW_KEYS_RESERVED}) for i in range(n)]
        outcomes = self._pool.run(jobs)
        lost = [i for i, o in enumerate(outcomes) if o.reason == "crashed"]
        retried = dict(zip(lost, self._pool.run([jobs[i] for i in lost]))) if lost else {}
        self._rescored += sum(o.reason != "crashed" for o in retried.values())
        if lost:
            log.warning("a verifier worker died under %d of %d samples; each scored again on a fresh worker: %d "
                        "scored, %d killed it again (scored 0, crashed)", len(lost), n,
                        sum(o.reason != "crashed" for o in retried.values()),
                        sum(o.reason == "crashed" for o in retried.values()))  # fmt: skip
        out = []
        for i, o in enumerate(outcomes):
            latency = o.latency_s
            if i in retried:  # the worker died under it: scored again on a fresh one (the module docstring)
                o, latency = retried[i], latency + retried[i].latency_s
            if o.ok:
                results: dict[str, VerifyResult] = o.value
                self._errors += any((r.reason or "").startswith("error:") for r in results.values())
            else:  # timeout, crashed (twice), or a row that does not pickle (counted by the process pool)
                results = {k: VerifyResult(score=0.0, parsed=None, reason=o.reason) for k in self.keys}
            reward = sum(self.weights[k] * r.score for k, r in results.items())
            out.append(Scored(reward=reward, results=results, latency_s=latency,
                              rescored=i in retried and o.reason != "crashed"))
        return out

    def stats(self) -> dict[str, int]:
        """Counters since the pool started: ``samples`` (jobs sent to workers: a sample scored twice counts twice),
        ``timeouts``, ``crashes`` (workers that died under a sample), ``errors`` (samples with a verifier that
        raised or returned no valid score, or a row that did not pickle), ``restarts`` (workers replaced),
        ``rescored`` (samples whose worker died and that a fresh worker then scored)."""
        s = self._pool.stats()
        return {"samples": s["jobs"], "timeouts": s["timeouts"], "crashes": s["crashes"],
                "errors": s["errors"] + self._errors, "restarts": s["restarts"], "rescored": self._rescored}

    def close(self) -> None:
        """Stop the workers (politely, then SIGKILL after 2 s). Idempotent."""
        self._pool.close()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RewardWorker:
    """The reward role as a plain class (an executor runs it in-process or wraps it as a Ray actor).

    Owns one :class:`ScoringPool`; ``score`` and ``close`` delegate to it. Errors: those of ScoringPool.
    """

    def __init__(
        self,
        specs: Sequence[VerifierSpec],
        num_workers: int,
        timeout_s: float,
        memory_mb: int | None = None,
    ) -> None:
        self.pool = ScoringPool(specs, num_workers, timeout_s, memory_mb)

    def score(
        self, responses: Sequence[str], golds: Sequence[str], rows: Sequence[dict[str, Any]]
    ) -> list[Scored]:
        """``[B]`` Scored in input order (see :meth:`ScoringPool.score`)."""
        return self.pool.score(responses, golds, rows)

    def stats(self) -> dict[str, int]:
        """The pool's counters (see :meth:`ScoringPool.stats`)."""
        return self.pool.stats()

    def close(self) -> None:
        self.pool.close()

    def ping(self) -> bool:
        """Readiness check used by the executor once the role is constructed."""
        return True


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` by the nearest-rank method: the ``ceil(q / 100 * n)``-th smallest
    of the ``n`` values (1-based; the smallest for ``q = 0``), always one of the values, never interpolated.

    Errors: ``ValueError`` for empty ``values`` or ``q`` outside [0, 100].
    """
    if not values or not 0 <= q <= 100:
        raise ValueError(f"nearest_rank needs values and 0 <= q <= 100, got {len(values)} values, q={q}")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def reward_metrics(scored: Sequence[Scored]) -> dict[str, float]:
    """Metrics of one batch of B scored samples, each a mean over the B samples (normaliser B).

    ``reward/mean``; ``reward/timeout_frac``, ``reward/crash_frac``, ``reward/rescored_frac``, ``reward/error_frac``,
    ``reward/invalid_score_frac`` (part of the errors: no valid score), ``reward/no_answer_frac`` (samples where
    some verifier gave that reason, :meth:`Scored.failed`); ``reward/latency_mean_s``,
    ``reward/latency_max_s``, ``reward/latency_p50_s`` and ``reward/latency_p99_s`` (nearest-rank percentiles
    over the B latencies, see :func:`nearest_rank`; seconds); ``reward/score/<verifier key>`` (mean
    unweighted score). Empty input: ``{}``.
    """
    b = len(scored)
    if b == 0:
        return {}
    m = {
        mn.REWARD_MEAN: sum(s.reward for s in scored) / b,
        mn.REWARD_TIMEOUT_FRAC: sum(s.failed("timeout") for s in scored) / b,
        mn.REWARD_CRASH_FRAC: sum(s.failed("crashed") for s in scored) / b,
        mn.REWARD_RESCORED_FRAC: sum(s.rescored for s in scored) / b,
        mn.REWARD_ERROR_FRAC: sum(s.failed("error") for s in scored) / b,
        mn.REWARD_INVALID_SCORE_FRAC: sum(s.failed("invalid_score") for s in scored) / b,
        mn.REWARD_NO_ANSWER_FRAC: sum(s.failed("no_answer") for s in scored) / b,
        mn.REWARD_LATENCY_MEAN_S: sum(s.latency_s for s in scored) / b,
        mn.REWARD_LATENCY_MAX_S: max(s.latency_s for s in scored),
        mn.REWARD_LATENCY_P50_S: nearest_rank([s.latency_s for s in scored], 50),
        mn.REWARD_LATENCY_P99_S: nearest_rank([s.latency_s for s in scored], 99),
    }
    for key in scored[0].results:
        m[mn.reward_score(key)] = sum(s.results[key].score for s in scored if key in s.results) / b
    return m


def failure_kind(result: VerifyResult) -> str | None:
    """``error`` (the verifier raised or returned no valid score), ``timeout``, ``crash``, or None (scored)."""
    reason = result.reason or ""
    if reason.startswith("error:"):
        return "error"
    return {"timeout": "timeout", "crashed": "crash"}.get(reason)


_ADVICE = {
    "error": "fix the verifier (`rlvr verify FILE.jsonl --verifier NAME` runs it on saved responses)",
    "timeout": "make it faster or raise reward.timeout_s",
    "crash": "find what kills its worker (memory: reward.memory_mb)",
}


class ShareWatch:
    """When a share of a step's samples failing is worth a console warning (the policy of :class:`FailureWatch`
    and of the trajectories' :class:`rlvr.envs.watch.TrajectoryWatch`): per key, the first step at or over
    ``threshold`` warns; a later step warns again only when its share is at least :data:`WORSE_BY` above the share
    last warned about (so at most ``(1 - threshold) / WORSE_BY + 1`` warnings per key per run). A share that falls
    and climbs back to a level already warned about stays quiet: every step's shares are in ``metrics.jsonl``.
    ``threshold`` None: never warns. ``setting``: the recipe key of the threshold, named in the warnings.
    Errors: ``ValueError`` for a threshold outside (0, 1]."""

    WORSE_BY = 0.1

    def __init__(self, threshold: float | None, setting: str) -> None:
        if threshold is not None and not 0 < threshold <= 1:
            raise ValueError(f"{setting}={threshold:g} must be in (0, 1] (e.g. 0.25), or null to never warn")
        self.threshold, self.setting = threshold, setting
        self.warned: dict[str, float] = {}  # key -> the share last warned about

    def due(self, key: str, share: float) -> bool:
        """True when ``share`` of ``key`` is to be warned about now (then remembered as the share warned about)."""
        last = self.warned.get(key, -1.0)
        if self.threshold is None or share < self.threshold or share < last + self.WORSE_BY - 1e-9:
            return False
        self.warned[key] = share
        return True

    def again(self, share: float) -> str:
        """The warning's closing note: the setting and when the next warning for the key would come."""
        nxt = (f"next warning for it only at {min(1.0, share + self.WORSE_BY):.0%} or more" if share < 1
               else "no further warnings for it")  # fmt: skip
        return f"({self.setting}={self.threshold:g}; {nxt})"


class FailureWatch(ShareWatch):
    """Warns on the console (logger ``rlvr``) when a verifier fails (errs, returns no valid score, times out or
    crashes: :func:`failure_kind`) on at least ``threshold`` of a step's samples, naming the step, the verifier's
    key, the share, the failures by kind, the most frequent reason and the fix; per verifier key, not repeated
    without bound (:class:`ShareWatch`). ``threshold`` None: never warns. Errors: ``ValueError`` for a threshold
    outside (0, 1].
    """

    def __init__(self, threshold: float | None, setting: str = "reward.warn_error_frac") -> None:
        super().__init__(threshold, setting)

    def check(self, step: int, scored: Sequence[Scored]) -> list[str]:
        """Warn about the verifiers of ``scored`` (one step's B samples) past the threshold; returns the messages
        logged (empty: none)."""
        if self.threshold is None or not scored:
            return []
        b, out = len(scored), []
        for key in scored[0].results:
            failed = [s.results[key] for s in scored if key in s.results and failure_kind(s.results[key])]
            share = len(failed) / b
            if not self.due(key, share):
                continue
            kinds = collections.Counter(failure_kind(r) for r in failed)
            counts = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in kinds.items())
            example = collections.Counter(r.reason for r in failed).most_common(1)[0][0]
            advice = "; ".join(_ADVICE[k] for k in kinds)
            msg = (f"step {step}: verifier {key!r} failed on {share:.0%} of the step's samples ({len(failed)} of {b}: "
                   f"{counts}), each scored 0 by it; e.g. {example!r}. {advice[0].upper()}{advice[1:]}. "
                   f"{self.again(share)}")  # fmt: skip
            log.warning(msg)
            out.append(msg)
        return out
