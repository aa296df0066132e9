"""Check a weight sync on what the engine computes: logprobs of a fixed probe sequence, engine against trainer.

The checksum of :mod:`rlvr.sync.weights` covers the transfer only; it passes when the engine received the right
tensors but computes with others (a reload that loads nothing, a tied output head left stale, a wrong name
mapping, a prefix cache kept across weights). The probe closes that class: after a sync each engine continues a
fixed prompt greedily for :data:`PROBE_NEW_TOKENS` tokens on its serving path (``Engine.probe_logprobs``), the
trainer scores the same tokens (``PolicyWorker.probe_logprobs``), and the largest absolute difference (nats)
must stay within the dtype's tolerance (:func:`tolerance`), else :class:`WeightSyncError`.

The prompt is the same at every probe and longer than one KV-cache block (vLLM: 128 tokens on CPU, 16 on GPU)
when the engine's context allows, so the previous probe's cached blocks are reused by the next one whenever a
sync forgets to drop the prefix cache.
"""

from __future__ import annotations

from typing import Callable, Sequence

from rlvr.sync.weights import WeightSyncError

PROBE_TEXT = (
    "Question: A farmer has 17 sheep and buys 5 more, then sells 9 of them at the market. How many sheep does "
    "the farmer have now? Answer: 17 plus 5 is 22, and 22 minus 9 is 13, so the answer is 13.\n"
)
"""Text of the probe prompt (repeated and cut to length); plain words and digits every tokenizer encodes."""

PROBE_PROMPT_TOKENS = 200
"""Probe prompt length in tokens, capped by the engine's context: over one CPU block (128) and many GPU blocks."""

PROBE_NEW_TOKENS = 8
"""Greedy tokens generated (and compared) per probe."""

DEFAULT_TOLERANCE: dict[str, float] = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.1}
"""Largest |engine - trainer| logprob (nats) on the probe tokens accepted when ``sync.probe_tolerance`` is unset.
Measured on this CPU (tiny-random and SmolLM2-135M, good syncs): float32 <= 5e-5, bfloat16 <= 0.05 (the trainer
runs bf16 autocast over fp32 master weights, the engine bf16 weights: different roundings and kernels). Failed
syncs measured far above: a no-op reload or a stale tied head >= 0.2 (bf16 bound set just above the noise
floor, so a small skipped update in bf16 can hide below it; fp32 sees 1e-2-scale errors). float16 has 3 more
mantissa bits than bfloat16."""


def tolerance(dtype: str, configured: float | None) -> float:
    """The probe tolerance in nats: ``configured`` when set, else :data:`DEFAULT_TOLERANCE` for ``dtype``."""
    return float(configured) if configured is not None else DEFAULT_TOLERANCE[dtype]


def probe_prompt(model_dir: str, max_tokens: int) -> list[int]:
    """Token ids of the probe prompt: :data:`PROBE_TEXT` encoded by the model's tokenizer (no special tokens),
    repeated and cut to ``min(PROBE_PROMPT_TOKENS, max_tokens)`` tokens.

    Errors: ``ValueError`` when ``max_tokens`` < 2 (no room for a prompt)."""
    from transformers import AutoTokenizer

    n = min(PROBE_PROMPT_TOKENS, int(max_tokens))
    if n < 2:
        raise ValueError(f"the sync probe needs a context of at least {2 + PROBE_NEW_TOKENS} tokens")
    ids = AutoTokenizer.from_pretrained(model_dir)(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    return (ids * (n // len(ids) + 1))[:n]


def probe_gap(engine_lps: Sequence[float], trainer_lps: Sequence[float]) -> float:
    """max_i |engine_lps[i] - trainer_lps[i]| in nats over the probe tokens (the lists must have equal length).

    Errors: ``ValueError`` when the lengths differ or are 0."""
    if len(engine_lps) != len(trainer_lps) or not engine_lps:
        raise ValueError(f"probe logprobs of unequal or zero length: {len(engine_lps)} vs {len(trainer_lps)}")
    return max(abs(float(a) - float(b)) for a, b in zip(engine_lps, trainer_lps))


def run_probe(
    get: Callable[[list, float | None, str], list],
    engines: Sequence,
    trainers: Sequence,
    prompt_ids: list[int],
    *,
    tol: float,
    version: int,
    dtype: str,
    timeout_s: float,
) -> dict[str, float]:
    """Probe every engine after the sync to policy ``version``; return ``{"sync/probe_gap": max over engines}``.

    ``get(calls, timeout_s, what)``: the controller's wait; ``engines``/``trainers``: role handles (every trainer
    rank scores, rank 0's answer is used). Errors: :class:`WeightSyncError` naming the engine, the gap, the
    tolerance and the setting, when any engine's gap exceeds ``tol``.
    """
    outs = get([e.call("probe_logprobs", prompt_ids, PROBE_NEW_TOKENS) for e in engines], timeout_s,
               f"sync probe of policy version {version} (engines)")
    conts = [list(ids) for ids, _ in outs]
    scored = get([t.call("probe_logprobs", prompt_ids, conts) for t in trainers], timeout_s,
                 f"sync probe of policy version {version} (trainer)")[0]
    gaps = [probe_gap(lps, tr) for (_, lps), tr in zip(outs, scored)]
    gen = [probe_gap(lps[-PROBE_NEW_TOKENS:], tr[-PROBE_NEW_TOKENS:]) for (_, lps), tr in zip(outs, scored)]
    means = [sum(abs(a - b) for a, b in zip(lps, tr)) / len(tr) for (_, lps), tr in zip(outs, scored)]
    for i, g in enumerate(gaps):
        if not g <= tol:  # NaN fails too
            raise WeightSyncError(
                f"weight sync to engine{i} (policy version {version}) received the right tensors but computes "
                f"other logprobs: the probe's largest |engine - trainer| gap is {g:.4g} nats over "
                f"{len(prompt_ids)}+{PROBE_NEW_TOKENS} tokens (generated ones: {gen[i]:.4g}), above the {dtype} "
                f"tolerance {tol:g} (sync.probe_tolerance). The engine is not using the trainer's weights (a skipped "
                "or partial load, a stale tied output head, a wrong name mapping, a prefix cache kept across "
                "weights); the run stops rather than learn from another policy's rollouts."
            )
    return {"sync/probe_gap": max(gaps), "sync/probe_gap_gen": max(gen), "sync/probe_gap_mean": max(means)}
