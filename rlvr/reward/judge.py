"""A verifier backed by a model: the judge role, its prompt, its verdict parse rules, and FAPO's flawed-positive
penalty (Ding et al. 2025, "FAPO: Flawed-Aware Policy Optimization for Efficient and Reliable Reasoning",
arXiv 2510.22543, sec. 4).

A rule verifier (:mod:`rlvr.reward.pool`) scores one sample at a time in a small CPU worker process; no model fits
there. A judge verifier (``reward.verifiers: - name: judge``) instead asks a language model, held by its own role
(:class:`JudgeWorker`, the recipe's ``judge:`` section), about a whole batch at once: the model is served by the
same vLLM engine code as rollout (:class:`rlvr.rollout.vllm_engine.VLLMEngine`), is not in the weight-sync group
(its weights never change), and answers each item (question, response, gold) with free text that a parse rule
(:data:`PARSE_RULES`) turns into a :class:`~rlvr.types.VerifyResult`.

Model output is untrusted input: a verdict that no rule parses (empty, garbage, cut by the token limit), and a
sample whose generation raises, score 0 with reason ``judge_unparseable: <excerpt>``; the batch goes on.

Result keys: the judge's verdicts join each sample's :class:`~rlvr.reward.pool.Scored.results` under the
verifier's key (``judge``; ``judge#2`` for a second one, :func:`rlvr.reward.pool.verifier_keys`) after the rule
verifiers' keys, and ``Scored.reward`` is recomputed as the weighted sum over all of them (:func:`merge_judged`).

This module imports neither torch nor vLLM at import time (the recipe checks read :class:`JudgeSettings`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from rlvr.metrics import names as mn
from rlvr.types import VerifyResult

log = logging.getLogger("rlvr")

JUDGE = "judge"
"""The verifier name that selects the judge role (reserved: not looked up among the rule verifiers)."""

UNPARSEABLE = "judge_unparseable"
"""Reason prefix of a verdict no rule parsed (``judge_unparseable: <excerpt>``)."""
NOT_JUDGED = "not_judged"
"""Reason of a sample not sent to the judge (``only_correct`` and the primary verifier marked it wrong)."""
FLAWED = "flawed"
"""Reason of a verdict below full marks (an error found; for ``boxed_score``, any score below 1)."""
EXCERPT_CHARS = 80
"""Characters of a verdict kept in an ``judge_unparseable`` reason."""


@dataclass(frozen=True, kw_only=True)
class JudgeSettings:
    """The ``args`` of a ``name: judge`` verifier spec (checked when the recipe loads, each error naming
    ``reward.verifiers[i].args.<field>``)."""

    template: str = ("Problem: {question}\nReference answer: {gold}\nSolution:\n{steps}\n\nIf every step is "
                     "correct, answer \\boxed{-1}; otherwise answer the index of the earliest wrong step in \\boxed{}.")  # fmt: skip
    """The judge's user message. Fields ``{question}``, ``{response}``, ``{gold}`` and ``{steps}`` (the response
    split into numbered steps, :func:`format_steps`) are replaced; every other brace is literal text (so
    ``\\boxed{}`` needs no escaping). The tokenizer's chat template is applied on top."""
    parse: Literal["boxed_step", "yes_no", "boxed_score"] = "boxed_step"
    """The verdict's parse rule (:data:`PARSE_RULES`): ``boxed_step`` (FAPO GenRM: the last ``\\boxed{}`` holds
    the earliest wrong step, -1 for none), ``yes_no`` (the last standalone yes / no), ``boxed_score`` (the last
    ``\\boxed{}`` holds a score in [0, 1])."""
    max_new_tokens: int = 128
    """Tokens the judge may write per verdict; a verdict cut here that no rule parses is ``judge_unparseable``."""
    temperature: float = 0.0
    """Sampling temperature of the judge (0: greedy; one sample per item)."""
    only_correct: bool = True
    """Send only the samples the primary (first) verifier marks correct (score >= 1), as FAPO's reference code
    does; the others get ``VerifyResult(0.0, None, "not_judged")``. False: judge every sample."""

    def errors(self, where: str) -> list[str]:
        """Problems of these settings, each naming ``where`` + the field and the fix."""
        errs = []
        if not any(f"{{{f}}}" in self.template for f in ("response", "steps")):
            errs.append(f"{where}.template must contain {{response}} or {{steps}}: the judge has to see the response")
        if self.max_new_tokens < 1:
            errs.append(f"{where}.max_new_tokens={self.max_new_tokens} must be >= 1 (e.g. 128)")
        if self.temperature < 0:
            errs.append(f"{where}.temperature={self.temperature} must be >= 0 (0: greedy)")
        return errs


@dataclass(frozen=True, kw_only=True)
class JudgeItem:
    """One sample to judge: the question before templating, the policy's response and the gold answer."""

    question: str
    response: str
    gold: str


# -- parse rules (pure) ------------------------------------------------------------------------------------------
def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces matched; surrounding spaces kept), or
    None when there is none or the last one is never closed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


_INT = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_boxed_step(text: str) -> VerifyResult | None:
    """FAPO GenRM's protocol: the last ``\\boxed{}`` holds an integer; -1: no error (score 1.0, parsed ``"-1"``);
    k >= 0: the earliest flawed step (score 0.0, parsed ``"k"``, reason ``flawed``). None (unparseable) for no box,
    a non-integer, or an integer below -1."""
    box = last_boxed(text)
    if box is None or not _INT.fullmatch(box.strip()):
        return None
    k = int(box.strip())
    if k == -1:
        return VerifyResult(score=1.0, parsed="-1", reason=None)
    if k >= 0:
        return VerifyResult(score=0.0, parsed=str(k), reason=FLAWED)
    return None


def parse_yes_no(text: str) -> VerifyResult | None:
    """The last standalone ``yes`` / ``no`` (case-insensitive, whole word): yes = sound (1.0, parsed ``"yes"``),
    no = flawed (0.0, parsed ``"no"``, reason ``flawed``). None when neither word appears."""
    words = _YES_NO.findall(text)
    if not words:
        return None
    if words[-1].lower() == "yes":
        return VerifyResult(score=1.0, parsed="yes", reason=None)
    return VerifyResult(score=0.0, parsed="no", reason=FLAWED)


def parse_boxed_score(text: str) -> VerifyResult | None:
    """The last ``\\boxed{}`` holds a number s in [0, 1]: score s (parsed its text; reason ``flawed`` below 1).
    None for no box, not a number, or a number outside [0, 1]."""
    box = last_boxed(text)
    if box is None or not _NUMBER.fullmatch(box.strip()):
        return None
    s = float(box.strip())
    if not 0.0 <= s <= 1.0:
        return None
    return VerifyResult(score=s, parsed=box.strip(), reason=None if s >= 1.0 else FLAWED)


PARSE_RULES: dict[str, Callable[[str], VerifyResult | None]] = {
    "boxed_step": parse_boxed_step,
    "yes_no": parse_yes_no,
    "boxed_score": parse_boxed_score,
}
"""Parse rule name (``JudgeSettings.parse``) -> function: verdict text -> VerifyResult, or None if unparseable."""


def unparseable(why: str) -> VerifyResult:
    """The per-sample failure: score 0, nothing parsed, reason ``judge_unparseable: <why>`` (why cut to
    :data:`EXCERPT_CHARS`, newlines as spaces)."""
    short = " ".join(why.split())[:EXCERPT_CHARS]
    return VerifyResult(score=0.0, parsed=None, reason=f"{UNPARSEABLE}: {short}")


def parse_verdict(text: str, rule: str) -> VerifyResult:
    """``text`` parsed by the rule ``rule`` (:data:`PARSE_RULES`); an empty or unparseable verdict gives
    :func:`unparseable` with an excerpt of it. Errors: ``KeyError`` for an unknown rule (the recipe checks it)."""
    parsed = PARSE_RULES[rule](text) if text.strip() else None
    if parsed is None:
        return unparseable(repr(text.strip()[:EXCERPT_CHARS]) if text.strip() else "empty verdict")
    return parsed


# -- prompts (pure) ---------------------------------------------------------------------------------------------
def split_steps(response: str) -> list[str]:
    """The response's steps: its paragraphs (split on blank lines) or, for a response of one paragraph, its lines;
    each stripped, empty ones dropped. ``""`` -> ``[]``."""
    text = response.replace("\r\n", "\n").strip()
    parts = re.split(r"\n\s*\n", text)
    if len(parts) == 1:
        parts = text.split("\n")
    return [p.strip() for p in parts if p.strip()]


def format_steps(response: str) -> str:
    """The response as numbered steps, one per line: ``Step 0: ...``, ``Step 1: ...`` (the numbering FAPO's GenRM
    answers in; :func:`split_steps`). A response with no text is ``Step 0: `` (one empty step)."""
    steps = split_steps(response) or [""]
    return "\n".join(f"Step {i}: {s}" for i, s in enumerate(steps))


_FIELD = re.compile(r"\{(question|response|gold|steps)\}")


def render_prompt(template: str, item: JudgeItem) -> str:
    """The template with ``{question}``, ``{response}``, ``{gold}``, ``{steps}`` replaced from ``item`` (one pass:
    text coming from the item is never substituted again); every other brace stays as written."""
    fields = {"question": item.question, "response": item.response, "gold": item.gold}
    if "{steps}" in template:
        fields["steps"] = format_steps(item.response)
    return _FIELD.sub(lambda m: fields[m.group(1)], template)


# -- the batch, with an engine (pure apart from the engine) ------------------------------------------------------
def judge_batch(engine: Any, tokenizer: Any, items: Sequence[JudgeItem], settings: JudgeSettings,
                max_model_len: int) -> tuple[list[VerifyResult], list[str]]:
    """Judge ``items`` [N] with ``engine`` (anything with :meth:`VLLMEngine.generate`'s signature): render each
    prompt, apply the tokenizer's chat template, generate one verdict per item in one call, parse them.

    Returns (results [N], verdict texts [N]) in input order. Per-sample failures, never raised: a prompt longer
    than ``max_model_len - settings.max_new_tokens`` tokens, a verdict no rule parses (:func:`parse_verdict`) and,
    when the batch's generate raises, a sample whose own generate raises again (each is retried alone, so one bad
    sample does not fail the others) are all :func:`unparseable`.
    """
    from rlvr.types import Prompt, SamplingConfig

    results: list[VerifyResult | None] = [None] * len(items)
    texts = [""] * len(items)
    limit = max_model_len - settings.max_new_tokens
    prompts = []
    for i, item in enumerate(items):
        ids = chat_ids(tokenizer, render_prompt(settings.template, item))
        if len(ids) > limit:
            results[i] = unparseable(f"prompt of {len(ids)} tokens over judge.max_model_len - max_new_tokens = {limit}")
            continue
        prompts.append(Prompt(index=i, text="", prompt_ids=ids, gold=item.gold))
    sampling = SamplingConfig(n=1, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
    try:
        outs = engine.generate(prompts, sampling) if prompts else []
    except Exception as e:  # noqa: BLE001 - retried one by one below
        log.warning("judge: generate of %d prompts raised %s: %s; retrying each alone", len(prompts), type(e).__name__, e)
        outs = []
        for p in prompts:
            try:
                outs.extend(engine.generate([p], sampling))
            except Exception as e1:  # noqa: BLE001 - this sample's failure
                results[p.index] = unparseable(f"generate raised {type(e1).__name__}: {e1}")
    for c in outs:
        texts[c.prompt_index] = c.text
        results[c.prompt_index] = parse_verdict(c.text, settings.parse)
    return [r if r is not None else unparseable("no verdict returned") for r in results], texts


def chat_ids(tokenizer: Any, user_message: str) -> list[int]:
    """Token ids [L] of ``user_message`` as one user turn under the tokenizer's chat template, with the generation
    prompt (the plain text's ids when the tokenizer has no chat template)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": user_message}], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(user_message)["input_ids"])


class JudgeWorker:
    """The judge role: one vLLM engine (:class:`rlvr.rollout.vllm_engine.VLLMEngine`) serving a fixed model, and
    its tokenizer. Its weights never change: it is not in the weight-sync group (``Roles.judge``, beside
    ``Roles.engines``).

    Args: ``model_dir`` a local HF folder (``rlvr.models.resolve_model`` of ``judge.model``); the engine settings
    as :class:`VLLMEngine` takes them (``dtype``, ``max_model_len`` prompt + verdict tokens, ``kv_cache_gib``,
    ``gpu_memory_utilization``, ``enforce_eager``, ``threads``, ``seed``).
    Errors: those of vLLM's engine start (a model that does not load).
    """

    def __init__(self, model_dir: str, *, dtype: str, max_model_len: int, seed: int = 0, kv_cache_gib: float = 1.0,
                 gpu_memory_utilization: float = 0.2, enforce_eager: bool = True, threads: int = 1) -> None:
        from transformers import AutoTokenizer

        from rlvr.rollout.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model_dir, dtype=dtype, max_model_len=max_model_len, seed=seed,
                                 kv_cache_gib=kv_cache_gib, gpu_memory_utilization=gpu_memory_utilization,
                                 enforce_eager=enforce_eager, threads=threads)  # fmt: skip
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.max_model_len = max_model_len

    def judge(self, items: Sequence[JudgeItem], settings: JudgeSettings | None = None) -> list[VerifyResult]:
        """One :class:`VerifyResult` per item, in order (:func:`judge_batch`; ``settings`` default: the defaults)."""
        return judge_batch(self.engine, self.tokenizer, items, settings or JudgeSettings(), self.max_model_len)[0]

    def judge_with_text(self, items: Sequence[JudgeItem], settings: JudgeSettings) -> tuple[list[VerifyResult], list[str]]:
        """:meth:`judge` and the raw verdict texts [N] (what the judge wrote; logged as examples)."""
        return judge_batch(self.engine, self.tokenizer, items, settings, self.max_model_len)

    def ping(self) -> bool:
        return True

    def shutdown(self) -> None:
        """Stop the judge's engine now (:meth:`VLLMEngine.shutdown`)."""
        self.engine.shutdown()


# -- the reward around the judge (pure) ---------------------------------------------------------------------------
def judge_keys(specs: Sequence[Any]) -> list[tuple[int, str]]:
    """(position, result key) of each judge verifier among ``specs`` (``VerifierSpec``s), keys as
    :func:`rlvr.reward.pool.verifier_keys` names them."""
    from rlvr.reward.pool import verifier_keys

    return [(i, k) for i, (s, k) in enumerate(zip(specs, verifier_keys(specs))) if s.name == JUDGE]


def rule_specs(specs: Sequence[Any]) -> list[Any]:
    """The specs the scoring pool runs: every verifier except the judge ones."""
    return [s for s in specs if s.name != JUDGE]


def settings_of(spec: Any, where: str = "reward.verifiers[i].args") -> JudgeSettings:
    """A judge spec's :class:`JudgeSettings` from its ``args``. Errors: ``RecipeError`` naming ``where`` + the
    bad field (an unknown one with its nearest name, a parse rule not in :data:`PARSE_RULES`)."""
    from rlvr.config import build_settings

    return build_settings(JudgeSettings, dict(spec.args), where)


def selected(scored: Sequence[Any], primary: str, only_correct: bool) -> list[int]:
    """Positions of the samples to send to the judge: all of them, or (``only_correct``) those the primary
    verifier gives full marks (score >= 1)."""
    return [i for i, s in enumerate(scored) if not only_correct or s.results[primary].score >= 1.0]


def merge_judged(scored: Sequence[Any], judged: dict[str, list[VerifyResult]], weights: dict[str, float]) -> list[Any]:
    """``scored`` [B] with each judge's verdicts (``judged[key]`` [B]) added to ``results`` after the rule
    verifiers' keys and ``reward`` recomputed as ``sum_k weights[k] * results[k].score`` (every key of the
    merged results; no normaliser). Errors: ``ValueError`` for a verdict list that is not [B]."""
    for key, vals in judged.items():
        if len(vals) != len(scored):
            raise ValueError(f"judge {key!r}: {len(vals)} verdicts for {len(scored)} samples")
    out = []
    for i, s in enumerate(scored):
        results = {**s.results, **{key: vals[i] for key, vals in judged.items()}}
        reward = sum(weights[k] * r.score for k, r in results.items())
        out.append(dataclasses.replace(s, results=results, reward=reward))
    return out


def is_flawed(result: VerifyResult) -> bool:
    """A parsed verdict below full marks (reason ``flawed``); unparseable and not-judged verdicts are not."""
    return result.reason == FLAWED


def flawed_penalties(scored: Sequence[Any], primary: str, lam: float, key: str = JUDGE) -> list[float]:
    """FAPO's R_Delta per sample, [B] (Ding et al. 2025, sec. 4: R_FAPO = R_RLVR + R_Delta): ``-lam`` for a flawed
    positive (the primary verifier gives full marks, the judge ``key`` parsed a flaw), scaled by ``1 - score``
    of the judge (1 for the binary rules ``boxed_step`` / ``yes_no``); 0 otherwise, and 0 for an unparseable
    verdict (as the authors' verl recipe). ``lam`` is in rlvr's 0/1 reward units (the paper's lambda = 1 on its
    +-1 scale is ``lam = 0.5``). Samples without a ``key`` result (not judged at all) get 0."""
    out = []
    for s in scored:
        j = s.results.get(key)
        flawed = j is not None and s.results[primary].score >= 1.0 and is_flawed(j)
        out.append(-lam * (1.0 - j.score) if flawed else 0.0)
    return out


def judge_metrics(scored: Sequence[Any], primary: str, key: str = JUDGE) -> dict[str, float]:
    """The judge's per-step metrics over B scored samples (empty when no sample has a ``key`` result):
    ``reward/flawed_positive_frac`` (flawed positives / samples the primary verifier marks correct; 0 when none
    is), ``reward/judged_frac`` (samples sent to the judge / B), ``reward/judge_unparseable_frac``
    (unparseable verdicts / samples sent to the judge; 0 when none was sent)."""
    if not scored or key not in scored[0].results:
        return {}
    correct = [s.results[primary].score >= 1.0 for s in scored]
    verdicts = [s.results[key] for s in scored]
    judged = [v.reason != NOT_JUDGED for v in verdicts]
    bad = [(v.reason or "").startswith(UNPARSEABLE) for v in verdicts]
    flawed_pos = [c and is_flawed(v) for c, v in zip(correct, verdicts)]
    return {
        mn.REWARD_FLAWED_POSITIVE_FRAC: sum(flawed_pos) / sum(correct) if any(correct) else 0.0,
        mn.REWARD_JUDGED_FRAC: sum(judged) / len(scored),
        mn.REWARD_JUDGE_UNPARSEABLE_FRAC: sum(bad) / sum(judged) if any(judged) else 0.0,
    }
