"""Check a weight sync on what the engine computes: logprobs of a fixed probe sequence, engine against trainer.

The checksum of :mod:`rlvr.sync.weights` covers the transfer only; it passes when the engine received the right
tensors but computes with others (a reload that loads nothing, a tied output head left stale, a wrong name
mapping, a prefix cache kept across weights). The read-back (:mod:`rlvr.sync.readback`) checks what was loaded,
exactly in any dtype; the probe checks what the engine computes, which also covers the prefix cache: after a sync
each engine continues a fixed prompt greedily for :data:`PROBE_NEW_TOKENS` tokens on its serving path and scores the prompt's tokens
(``Engine.probe_logprobs``), the trainer scores the same sequence (``PolicyWorker.probe_logprobs``), and the mean
absolute difference (nats) over all tokens, and over the generated ones, must stay within the dtype's tolerance
(:func:`tolerance`), else :class:`WeightSyncError` (:func:`run_probe`).

The prompt is the same at every probe and longer than one KV-cache block (vLLM: 128 tokens on CPU, 16 on GPU)
when the engine's context allows, so the previous probe's cached blocks are reused by the next one whenever a
sync forgets to drop the prefix cache.
"""

from __future__ import annotations

from typing import Callable, Sequence

from rlvr.metrics import names as mn
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

DEFAULT_TOLERANCE: dict[str, float] = {"float32": 2e-4, "bfloat16": 0.1, "float16": 0.1}
"""Largest accepted *mean* |engine - trainer| logprob (nats) over the probe tokens (all of them, and the generated
ones alone) when ``sync.probe_tolerance`` is unset. Measured on this CPU, SmolLM2-135M, tiny recipe, lr 1e-5,
3 syncs: float32 good syncs mean <= 1.9e-5 (largest token 5.6e-5); a stale tied head 7.3e-4 at the first sync
(1.7e-3 by the third); a reload that loads nothing 7.0e-3 (1.8e-2). bfloat16 good syncs mean <= 0.049 (largest
token 0.25: why the check is on the mean), from the trainer's bf16 autocast over fp32 master weights against the
engine's bf16 weights and kernels; 0.1 is twice that floor, so in bf16 the probe catches gross errors (a wrong
mapping, a stale prefix on a real model: 3 nats) but not small skipped updates: a reload that loads nothing gave
0.049 and 0.044 after one and two lr-1e-5 steps, inside the floor (the sampled-token ``train/rollout_gap_abs_max``
showed 1.29 at step 2); the read-back (``sync.check``) stops such a sync instead.
float16 is not measured here: it keeps bfloat16's bound (3 more mantissa bits, so at least as tight in fact)."""


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
    return max(_abs_diffs(engine_lps, trainer_lps))


def mean_gap(engine_lps: Sequence[float], trainer_lps: Sequence[float]) -> float:
    """mean_i |engine_lps[i] - trainer_lps[i]| in nats (normaliser: the number of tokens compared).

    Errors: ``ValueError`` when the lengths differ or are 0."""
    d = _abs_diffs(engine_lps, trainer_lps)
    return sum(d) / len(d)


def _abs_diffs(a: Sequence[float], b: Sequence[float]) -> list[float]:
    if len(a) != len(b) or not a:
        raise ValueError(f"probe logprobs of unequal or zero length: {len(a)} vs {len(b)}")
    return [abs(float(x) - float(y)) for x, y in zip(a, b)]


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
    """Probe every engine after the sync to policy ``version``.

    Each engine's logprobs of tokens 1.. of prompt + its greedy continuation ([P - 1 + n], n =
    :data:`PROBE_NEW_TOKENS`) are compared with the trainer's. Two means are checked against ``tol``: over all
    P - 1 + n tokens, and over the n generated ones alone (the serving path, where a kept prefix cache shows;
    the prompt's P - 1 come from prompt-logprob requests). A mean, not a max: bf16 noise puts a few tokens 0.25
    nats off even after a good sync, while a wrong weight shifts most of them.

    Returns, maxima over engines (nats): ``sync/probe_gap_mean``, ``sync/probe_gap_gen_mean`` (the checked ones)
    and ``sync/probe_gap_max`` (largest single-token gap, for the record).
    ``get(calls, timeout_s, what)``: the controller's wait; ``engines``/``trainers``: role handles (every trainer
    rank scores, rank 0's answer is used). Errors: :class:`WeightSyncError` naming the engine, the gaps, the
    tolerance and the setting, when either mean of any engine exceeds ``tol`` (or is NaN).
    """
    outs = get([e.call("probe_logprobs", prompt_ids, PROBE_NEW_TOKENS) for e in engines], timeout_s,
               f"sync probe of policy version {version} (engines)")
    conts = [list(ids) for ids, _ in outs]
    scored = get([t.call("probe_logprobs", prompt_ids, conts) for t in trainers], timeout_s,
                 f"sync probe of policy version {version} (trainer)")[0]
    diffs = [_abs_diffs(lps, tr) for (_, lps), tr in zip(outs, scored)]  # per engine: [P - 1 + n] nats
    means = [sum(d) / len(d) for d in diffs]  # normaliser: the tokens compared
    gen = [sum(d[-PROBE_NEW_TOKENS:]) / len(d[-PROBE_NEW_TOKENS:]) for d in diffs]  # normaliser: the n generated
    worst = [max(d) for d in diffs]
    for i, (m, g) in enumerate(zip(means, gen)):
        if not (m <= tol and g <= tol):  # NaN fails too
            raise WeightSyncError(
                f"weight sync to engine{i} (policy version {version}) received the right tensors but computes "
                f"other logprobs: the probe's mean |engine - trainer| gap is {m:.4g} nats over "
                f"{len(prompt_ids)}+{PROBE_NEW_TOKENS} tokens and {g:.4g} over the generated ones (largest "
                f"{worst[i]:.4g}), above the {dtype} tolerance {tol:g} (sync.probe_tolerance). The engine is not "
                "using the trainer's weights (a skipped or partial load, a stale tied output head, a wrong name "
                "mapping, a prefix cache kept across weights); the run stops rather than learn from another "
                "policy's rollouts."
            )
    return {mn.SYNC_PROBE_GAP_MEAN: max(means), mn.SYNC_PROBE_GAP_GEN_MEAN: max(gen), mn.SYNC_PROBE_GAP_MAX: max(worst)}
