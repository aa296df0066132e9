"""``rlvr eval MODEL --data SET [SET ...]``: sampled evaluation of a model on data sets with gold answers.

The model (an embedded name such as ``smollm2-135m-instruct``, a local Hugging Face folder such as a run's
``RUN/final``, or a hub id) is loaded once in this process by the rollout engine (:class:`~rlvr.rollout.vllm_engine.
VLLMEngine`; ``--engine hf``: :class:`~rlvr.rollout.hf_engine.HFEngine`), samples n responses per problem, and the
verifier pool (:class:`~rlvr.reward.pool.ScoringPool`: worker processes, a hard time limit per sample) scores them,
exactly as in training. No Ray. A run's policy (``RUN``, ``RUN/final``, ``RUN/checkpoints/step_N``) is evaluated
with the run's prompt template, data fields, verifiers and dtype (:data:`rlvr.eval_run.RUN_KEYS`, from its
``recipe.yaml``) unless flags say otherwise.

Data sets: a preset name (:data:`PRESETS`: the copies in ``data/``, test split), a local ``.jsonl`` / ``.json`` /
``.parquet`` file, or a ``datasets`` name (``--split``). ``--limit N`` keeps the first N rows in file order (a fixed,
reproducible subset); rows whose gold the verifier cannot parse are then dropped and counted (case V15), as are
prompts longer than ``--max-prompt-tokens`` (or than the model's context minus ``--max-new-tokens``). Without
``--max-new-tokens`` the default 512 is lowered where the model's context is too short for it (:func:`token_budgets`).

Metrics (:mod:`rlvr.runtime.validation`, shared with validation during training): for every k in 1..n, ``pass@k``
(Chen et al. 2021, eq. 1), ``maj@k`` (the exact expected majority vote over k-subsets, random tie break) and
``mean@k`` (= c / n for every k), each a mean over problems (normaliser P) with a 95% percentile-bootstrap
interval over problems (:func:`rlvr.metrics.intervals.bootstrap_ci`, 1000 resamples, seed 0). Reported per data
set and ``overall``: pooled over the problems of all sets (each problem weighs the same, so a big set weighs
more; the interval resamples the pooled problems).

Outputs in ``--output`` (default ``evals/<model>``, ``-2``, ``-3`` ... when taken): ``results.json`` (settings,
metrics with intervals, counts, timings; :func:`evaluate` returns the same dict), ``samples.jsonl`` (one line per
sample: data set, row index, id, prompt, response, gold, parsed answer, score, correct, reason, finish reason,
tokens), and a table on the console.

Temperature 1.0 by default: the model's own sampling distribution, the one RL trains and training validation
samples from, so these numbers match ``val/pass@k``; pass@k and maj@k for k > 1 need diverse samples. ``0`` is
greedy decoding (vLLM with ``--n 1`` only).

Multi-turn (``--environment NAME``, or a run's or ``--recipe``'s ``environment:`` section): each of the n samples
is a trajectory (:mod:`rlvr.envs`: the model answers, the environment replies, up to ``--max-turns`` assistant
turns, token-in/token-out), exactly as training rolls it out; the verifier scores the final answer and pass@k,
maj@k and mean@k are over trajectories. ``samples.jsonl`` then holds each trajectory's structure as a training
run's ``samples.jsonl`` does (:func:`rlvr.metrics.samples.trajectory_fields`: turns, end reason, a failure's text,
the conversation, per-turn rewards, the environment's info, each tool call's name and outcome), and each set's
``stats`` the turns per trajectory and the shares solved at turn 1 and after it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from rlvr.config import (DataConfig, EnvironmentConfig, ModelConfig, RewardConfig, RolloutConfig, ToolsConfig,
                         VerifierSpec, plain)
from rlvr.metrics.intervals import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE, bootstrap_ci
from rlvr.metrics.samples import trajectory_fields
from rlvr.models.context import context_limit, token_budgets
from rlvr.runtime.validation import mean_over_problems, problem_metrics, problem_outcomes
from rlvr.types import Completion, Prompt, SamplingConfig

log = logging.getLogger("rlvr.eval")

BOXED_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
"""Default user message: the instruction the training recipes use (the ``math`` verifier reads the last box)."""
SCORER_MEMORY_MB = 4096
"""Address-space limit of each scoring process (MiB), as the recipe default ``reward.memory_mb``."""


@dataclass(frozen=True, kw_only=True)
class EvalSet:
    """A data set to evaluate: where its rows are and how to read them (fields as in :class:`~rlvr.config.DataConfig`;
    ``question`` may be a template over fields)."""

    name: str
    source: str
    question: str = "question"
    answer: str = "answer"
    answer_format: Literal["raw", "gsm8k"] = "raw"
    verifier: str = "math"
    verifier_args: dict[str, Any] = field(default_factory=dict)

    @property
    def verifier_spec(self) -> VerifierSpec:
        return VerifierSpec(name=self.verifier, args=self.verifier_args)


PRESETS: dict[str, EvalSet] = {
    "gsm8k": EvalSet(name="gsm8k", source="data/gsm8k/test.jsonl", answer_format="gsm8k"),
    "svamp": EvalSet(name="svamp", source="data/svamp/test.jsonl", question="{Body} {Question}", answer="Answer"),
    "math500": EvalSet(name="math500", source="data/math500/test.jsonl", question="problem"),
    "aime24": EvalSet(name="aime24", source="data/aime24/test.jsonl", question="problem"),
    "aime25": EvalSet(name="aime25", source="data/aime25/test.jsonl", question="problem"),
    "amc23": EvalSet(name="amc23", source="data/amc23/test.jsonl", question="problem"),
}
"""Named data sets: the copies in ``data/`` (see ``data/README.md``), all scored by the ``math`` verifier (boxed
answer, else an answer marker, else the last number; math-verify equivalence)."""


EVAL_PROMPTS = DataConfig(source="", prompt_template=BOXED_TEMPLATE, max_prompt_tokens=1024, split="test",
                          shuffle=False)  # fmt: skip
"""``rlvr eval``'s prompt section without a recipe: the boxed instruction, 1024 prompt tokens, the test split."""
EVAL_ROLLOUT = RolloutConfig(samples_per_prompt=8, max_new_tokens=512, kv_cache_gib=2.0)
"""``rlvr eval``'s sampling without a recipe: n = 8 samples per problem at temperature 1.0, 512 new tokens (fewer
where the model's context is shorter: :func:`token_budgets`)."""
EVAL_REWARD = RewardConfig(timeout_s=10.0, memory_mb=SCORER_MEMORY_MB)
"""``rlvr eval``'s scoring without a recipe: the ``math`` verifier for file sets, 2 workers, 10 s per sample."""


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Settings of one ``rlvr eval`` run, made of the training recipe's own sections (:mod:`rlvr.config`), so a
    recipe's template, sampling and verifiers carry over (``rlvr eval ... --recipe R.yaml``; flags override):

    - ``model``: the model (``path``) and the engine's ``dtype`` (``auto``: :func:`rlvr.hardware.fast_dtype`);
    - ``prompts``: a :class:`~rlvr.config.DataConfig` read for every set (``source`` unused: each set has its own):
      ``prompt_template``, ``system_prompt``, ``chat_template``, ``max_prompt_tokens``, ``split`` (``datasets``
      names), ``limit`` (the first N rows of each set, in file order), and ``question`` / ``answer`` /
      ``answer_format`` of the sets that are not presets (presets keep their own, :func:`resolve_sets`);
    - ``rollout``: ``engine``, n = ``samples_per_prompt`` (metrics for every k in 1..n), ``temperature`` (0: greedy),
      ``top_p``, ``top_k``, ``max_new_tokens``, ``kv_cache_gib``, ``threads`` (one engine, in this process);
    - ``reward``: the first verifier scores the sets that are not presets (presets: ``math``); ``num_workers``
      scoring processes, ``timeout_s`` per sample, ``memory_mb`` per worker;
    - ``environment``: multi-turn trajectories instead of single answers when it names one (``enabled``): its
      ``max_turns``, ``max_tokens`` (the trajectory's budget after the prompt), ``args`` and limits, as in training;
    - ``tools``: the tools the model may call (:mod:`rlvr.tools`), as in training; tools alone make trajectories
      too (a reply without a call is the final answer), within ``environment.max_turns`` and ``max_tokens``.
    """

    model: ModelConfig
    data: tuple[str, ...]
    prompts: DataConfig = field(default_factory=lambda: EVAL_PROMPTS)
    rollout: RolloutConfig = field(default_factory=lambda: EVAL_ROLLOUT)
    reward: RewardConfig = field(default_factory=lambda: EVAL_REWARD)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    seed: int = 0
    """Engine seed (vLLM: the engine's sampler; HF: torch). Same seed, engine and machine: same samples."""
    output: str | None = None
    batch_prompts: int = 32
    """Prompts per engine call (progress is logged and samples are written after each)."""
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES
    bootstrap_seed: int = BOOTSTRAP_SEED
    fit_new_tokens: bool = False
    """Lower ``rollout.max_new_tokens`` to fit the model's context (:func:`token_budgets`) instead of refusing a
    value that does not fit. ``rlvr eval`` sets it when neither ``--max-new-tokens`` nor ``--recipe`` gives one."""

    @property
    def multi_turn(self) -> bool:
        """Trajectories (an environment, tools, or both) rather than single answers."""
        return self.environment.enabled or self.tools.enabled

    @property
    def n(self) -> int:
        """Samples per problem (``rollout.samples_per_prompt``)."""
        return self.rollout.samples_per_prompt

    def check(self) -> None:
        """Errors: ``ValueError`` naming the flag for a value out of range."""
        errs = []
        ro, pr = self.rollout, self.prompts
        if not self.data:
            errs.append("--data: name at least one data set (" + ", ".join(PRESETS) + ", or a file)")
        if self.n < 1 or ro.max_new_tokens < 1 or pr.max_prompt_tokens < 1 or self.batch_prompts < 1:
            errs.append("--n, --max-new-tokens, --max-prompt-tokens and --batch-prompts must be >= 1")
        if pr.limit is not None and pr.limit < 1:
            errs.append(f"--limit {pr.limit}: must be >= 1")
        if ro.temperature < 0 or not 0 < ro.top_p <= 1:
            errs.append("--temperature must be >= 0 (0: greedy) and --top-p in (0, 1]")
        if ro.temperature == 0 and (ro.engine == "hf" or self.n != 1):
            errs.append("--temperature 0 (greedy decoding) gives one answer per problem: it needs --n 1 and "
                        "--engine vllm (the hf engine always samples)")
        if self.reward.num_workers < 1 or not self.reward.timeout_s > 0 or self.bootstrap_resamples < 1:
            errs.append("--workers and --bootstrap-resamples must be >= 1, --timeout > 0")
        if not self.reward.verifiers:
            errs.append("reward.verifiers is empty: name a verifier (--verifier math)")
        if "{question}" not in pr.prompt_template:
            errs.append("--prompt-template must contain {question}")
        env = self.environment
        if self.multi_turn and (env.max_turns < 1 or env.max_tokens < ro.max_new_tokens):
            errs.append(f"--max-turns must be >= 1 and one turn's --max-new-tokens ({ro.max_new_tokens}) at most the "
                        f"trajectory's budget environment.max_tokens ({env.max_tokens}): lower --max-new-tokens or "
                        "raise --max-trajectory-tokens")
        if errs:
            raise ValueError("; ".join(errs))


# ------------------------------------------------------------------------------------------------------
# data


def resolve_sets(cfg: EvalConfig) -> list[EvalSet]:
    """The :class:`EvalSet` of each ``cfg.data`` entry; repeated names get ``#2``, ``#3``.

    A preset name (:data:`PRESETS`) is taken as it is: its fields and verifier are fixed (to change them, give
    its file, e.g. ``data/gsm8k/test.jsonl``). Anything else is a file or a ``datasets`` name, read with
    ``cfg.prompts.question`` / ``answer`` / ``answer_format`` and scored by ``cfg.reward.verifiers[0]`` (defaults
    ``question``, ``answer``, ``raw``, ``math``) and labelled by its file name (``folder/test`` for ``test.jsonl``).

    Errors: ``FileNotFoundError`` for a path-like entry (``.jsonl``, ``.json``, ``.parquet``, or starting with
    ``.``, ``/``, ``~``) that exists nowhere; ``ValueError`` for a bare name (no ``/``) that is no file or folder
    and is near a preset (``gsm8kk``: a typo, not a ``datasets`` name). Both messages name the nearest preset or
    file (:func:`rlvr.data.datasets.near_source`) and the presets.
    """
    from rlvr.data.datasets import did_you_mean, near_source, resolve_data_path

    sets, seen, names = [], Counter(), list(PRESETS)
    for entry in cfg.data:
        if entry in PRESETS:
            es = PRESETS[entry]
        else:
            path = resolve_data_path(entry)
            if path is None and (entry.endswith((".jsonl", ".json", ".parquet")) or entry.startswith((".", "/", "~"))):
                raise FileNotFoundError(
                    f"--data {entry!r}: no such file (relative paths are tried from the working directory, then "
                    f"from the rlvr repository); presets: {', '.join(PRESETS)}.{did_you_mean(entry, names, 'test')}"
                )
            near = near_source(entry, names, "test") if path is None and "/" not in entry else None
            if near in PRESETS:
                raise ValueError(
                    f"--data {entry!r}: not a preset, nor a file or folder; did you mean {near!r}? (presets: "
                    f"{', '.join(PRESETS)}; a `datasets` name this close to a preset is taken for a typo: give it as "
                    "org/name)"
                )
            label = Path(entry).stem if path is not None else entry
            if path is not None and path.is_file() and label in ("test", "train", "validation", "dev"):
                label = f"{path.parent.name}/{label}"
            pr, verifier = cfg.prompts, cfg.reward.verifiers[0]
            es = EvalSet(name=label, source=entry, question=pr.question, answer=pr.answer,
                         answer_format=pr.answer_format, verifier=verifier.name, verifier_args=dict(verifier.args))  # fmt: skip
        seen[es.name] += 1
        if seen[es.name] > 1:
            es = dataclasses.replace(es, name=f"{es.name}#{seen[es.name]}")
        sets.append(es)
    return sets


@dataclass(frozen=True, kw_only=True)
class LoadedSet:
    """A data set's prompts: ``prompts[i].index == i``; ``file_rows[i]`` the row's position in the source (from 0)."""

    spec: EvalSet
    prompts: list[Prompt]
    file_rows: list[int]
    counts: dict[str, int]
    """``rows`` read, ``bad_gold`` dropped, ``too_long`` dropped, ``problems`` kept."""


def data_config(es: EvalSet, cfg: EvalConfig, prompt_limit: int) -> DataConfig:
    """The :class:`~rlvr.config.DataConfig` that reads ``es``: ``cfg.prompts`` with the set's source and fields."""
    return dataclasses.replace(cfg.prompts, source=es.source, question=es.question, answer=es.answer,
                               answer_format=es.answer_format, max_prompt_tokens=prompt_limit, shuffle=False)  # fmt: skip


def load_set(es: EvalSet, cfg: EvalConfig, tokenizer: Any, prompt_limit: int) -> LoadedSet:
    """Read, gold-check (drop), template and length-filter one data set (:mod:`rlvr.data.datasets`).

    Errors: those of :func:`rlvr.data.load_rows` / :func:`~rlvr.data.build_prompts` (``ValueError``,
    ``FileNotFoundError``) and :class:`~rlvr.config.RecipeError` when no row has a usable gold.
    """
    from rlvr.data import build_prompts, load_rows
    from rlvr.reward.golds import check_golds

    dc = data_config(es, cfg, prompt_limit)
    try:
        rows = load_rows(dc, cfg.seed)
    except ValueError as e:
        if "data." not in str(e):
            raise
        raise ValueError(f"--data {es.source}: {e} (here data.question is --question-field, data.answer "
                         "--answer-field, data.answer_format --answer-format)") from e  # fmt: skip
    for i, r in enumerate(rows):
        r["file_row"] = i
    kept, report = check_golds(rows, [es.verifier_spec], "drop", deadline_key=None)
    from rlvr.tools.formats import recipe_tool_listing

    listing = recipe_tool_listing(cfg.tools, dc, tokenizer)  # the first prompt carries it: counted, and it sizes
    # the engine's context
    try:
        prompts, too_long = build_prompts(kept, tokenizer, dc, tools=listing)
    except ValueError as e:
        why = (f"; the limit {prompt_limit} is the model's context minus {cfg.rollout.max_new_tokens} new tokens: "
               "lower --max-new-tokens" if prompt_limit < cfg.prompts.max_prompt_tokens else "")
        raise ValueError(f"--data {es.source}: {e} (here data.max_prompt_tokens is --max-prompt-tokens, "
                         f"or the recipe's data.max_prompt_tokens with --recipe{why})") from e
    file_rows = [kept[p.index]["file_row"] for p in prompts]
    prompts = [dataclasses.replace(p, index=i) for i, p in enumerate(prompts)]
    counts = {"rows": len(rows), "bad_gold": len(report.bad), "too_long": too_long, "problems": len(prompts)}
    return LoadedSet(spec=es, prompts=prompts, file_rows=file_rows, counts=counts)


# ------------------------------------------------------------------------------------------------------
# metrics


def metric_table(per_problem: dict[str, list[float]], cfg: EvalConfig) -> dict[str, dict[str, Any]]:
    """``{metric: {"value": mean over problems, "ci": [low, high]}}`` from per-problem values [P] per metric.

    The interval: :func:`rlvr.metrics.intervals.bootstrap_ci` over problems (all metrics on the same resamples).
    """
    import numpy as np

    names = list(per_problem)
    values = np.array([per_problem[k] for k in names], dtype=np.float64).T  # [P, M]
    low, high = bootstrap_ci(values, resamples=cfg.bootstrap_resamples, seed=cfg.bootstrap_seed)
    means = mean_over_problems(per_problem)
    return {k: {"value": means[k], "ci": [float(low[i]), float(high[i])]} for i, k in enumerate(names)}


def sample_stats(completions: list[Completion], scored: list, key: str) -> dict[str, Any]:
    """Counts over the B samples of a set (fractions: normaliser B): ``samples``, ``score_mean`` (mean score of the
    verifier), ``length_mean`` (generated tokens: a trajectory's sampled ones), ``truncated_frac`` (stopped by
    ``--max-new-tokens``), ``no_answer_frac``, ``timeout_frac``, and ``reasons`` (reason kind -> samples;
    ``correct`` for full marks). Trajectories (``--environment``) add ``turns_mean`` (assistant turns),
    ``solved_turn_1_frac`` / ``solved_after_turn_1_frac`` (correct, with one turn / more than one),
    ``end_reasons`` (why each ended -> trajectories), ``tool_calls_mean`` (``tool`` messages per trajectory: calls
    answered, malformed ones included) and ``tool_use_frac`` (trajectories with at least one)."""
    from rlvr.verify_cli import reason_key

    b = len(scored)
    reasons = Counter(reason_key(s.results[key].reason) for s in scored)
    stats = {
        "samples": b,
        "score_mean": sum(s.results[key].score for s in scored) / b,
        "length_mean": sum(c.sampled_tokens for c in completions) / b,
        "truncated_frac": sum(c.truncated for c in completions) / b,
        "no_answer_frac": reasons.get("no_answer", 0) / b,
        "timeout_frac": reasons.get("timeout", 0) / b,
        "reasons": dict(reasons.most_common()),
    }
    if any(c.end_reason is not None for c in completions):
        right = [s.results[key].score >= 1.0 for s in scored]
        stats["turns_mean"] = sum(c.turns for c in completions) / b
        stats["solved_turn_1_frac"] = sum(r and c.turns == 1 for c, r in zip(completions, right)) / b
        stats["solved_after_turn_1_frac"] = sum(r and c.turns > 1 for c, r in zip(completions, right)) / b
        stats["end_reasons"] = dict(Counter(str(c.end_reason) for c in completions).most_common())
        calls = [sum(m.get("role") == "tool" for m in (c.messages or [])[c.opening_messages:]) for c in completions]
        stats["tool_calls_mean"] = sum(calls) / b
        stats["tool_use_frac"] = sum(n > 0 for n in calls) / b
    return stats


# ------------------------------------------------------------------------------------------------------
# running


def engine_context(longest_prompt: int, prompt_limit: int, after_prompt: int, environment: bool) -> int:
    """The eval engine's ``max_model_len`` (tokens): the longest prompt read plus what may follow it
    (``after_prompt``: one answer's ``max_new_tokens``, or a trajectory's ``environment.max_tokens``). With an
    environment the longest prompt is at least ``prompt_limit``: an environment's own opening replaces the row's
    prompt and is held only to that limit (an opening longer than the row's prompt overran a context sized by the
    rows alone)."""
    return (max(longest_prompt, prompt_limit) if environment else longest_prompt) + after_prompt


def _engine(cfg: EvalConfig, model_dir: str, max_model_len: int) -> Any:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # as the training roles: per-weight dtype warnings
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dtype = cfg.model.dtype
    if dtype == "auto":
        import torch

        from rlvr.hardware import fast_dtype

        dtype = fast_dtype(1 if torch.cuda.is_available() else 0)
    from rlvr.rollout import engine_class

    ro = cfg.rollout
    return engine_class(ro.engine)(model_dir, dtype=dtype, max_model_len=max_model_len, seed=cfg.seed,
                                   kv_cache_gib=ro.kv_cache_gib, threads=ro.threads)  # fmt: skip


def sample_record(ls: LoadedSet, p: Prompt, c: Completion, s: Any, key: str) -> dict[str, Any]:
    """One ``samples.jsonl`` line (module docstring); ``id``: :func:`rlvr.data.datasets.row_id`."""
    from rlvr.data.datasets import row_id

    r = s.results[key]
    pid = row_id(p.row)
    record = {
        "dataset": ls.spec.name, "row": ls.file_rows[p.index], "id": pid, "sample": c.sample_index,
        "prompt": p.text, "response": c.text, "gold": p.gold, "parsed": r.parsed, "score": r.score,
        "correct": r.score >= 1.0, "reason": r.reason, "finish_reason": c.finish_reason, "tokens": c.sampled_tokens,
    }  # fmt: skip
    if c.end_reason is not None:  # a trajectory: ``response`` is its final answer
        record.update(trajectory_fields(c))
    return record


def run_set(engine: Any, pool: Any, ls: LoadedSet, cfg: EvalConfig, out: TextIO, turns: Any = None) -> dict[str, Any]:
    """Generate n samples per problem in batches of ``cfg.batch_prompts`` (``turns``, a
    :class:`rlvr.envs.rollout.TurnRollouts`: n trajectories on ``engine``), score them (a trajectory's final
    answer), write their lines to ``out``.

    Returns the set's entry of ``results.json``: counts, ``metrics`` (every k in 1..n, with intervals),
    ``stats`` (:func:`sample_stats`), ``timing`` (``generate_s``, ``score_s``, ``tokens``, ``tokens_per_s``,
    ``seconds_per_problem``: generation + scoring seconds / P) and ``per_problem`` lists for pooling.
    """
    ro = cfg.rollout
    sampling = SamplingConfig(n=cfg.n, max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
                              top_k=ro.top_k)  # fmt: skip
    key = pool.keys[0]
    completions: list[Completion] = []
    scored: list = []
    t_gen = t_score = 0.0
    prompts = ls.prompts
    for start in range(0, len(prompts), cfg.batch_prompts):
        chunk = prompts[start : start + cfg.batch_prompts]
        t0 = time.perf_counter()
        if turns is None:
            comps = engine.generate(chunk, sampling)  # [len(chunk) x n], prompt-major
        else:
            comps = turns.submit(chunk, sampling, engine.generate).result()[0]  # trajectories, prompt-major
        t1 = time.perf_counter()
        rows = [prompts[c.prompt_index].row for c in comps]
        if turns is not None:
            from rlvr.envs.rollout import scoring_rows

            rows = scoring_rows(comps, rows)
        res = pool.score([c.text for c in comps], [prompts[c.prompt_index].gold for c in comps], rows)
        t_gen, t_score = t_gen + t1 - t0, t_score + time.perf_counter() - t1
        records = (sample_record(ls, prompts[c.prompt_index], c, s, key) for c, s in zip(comps, res))
        out.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        out.flush()
        completions += comps
        scored += res
        done, tokens = start + len(chunk), sum(c.sampled_tokens for c in completions)
        log.info("%s: %d/%d problems, %d tokens, %.0f tokens/s", ls.spec.name, done, len(prompts), tokens,
                 tokens / max(t_gen, 1e-9))  # fmt: skip
    per = problem_metrics(*problem_outcomes(scored, cfg.n, key), range(1, cfg.n + 1))
    tokens = sum(c.sampled_tokens for c in completions)
    return {
        "source": ls.spec.source, "question_field": ls.spec.question, "answer_field": ls.spec.answer,
        "answer_format": ls.spec.answer_format, "verifier": ls.spec.verifier, "verifier_args": ls.spec.verifier_args,
        **ls.counts,
        "metrics": metric_table(per, cfg),
        "stats": sample_stats(completions, scored, key),
        "timing": {"generate_s": t_gen, "score_s": t_score, "tokens": tokens, "tokens_per_s": tokens / max(t_gen, 1e-9),
                   "seconds_per_problem": (t_gen + t_score) / len(prompts)},
        "per_problem": per,
    }  # fmt: skip


def model_label(model: str) -> str:
    """A short name of the model for the output folder: ``smollm2-135m-instruct``, ``org/name`` -> ``name``, a
    run's ``RUN/final`` -> ``RUN-final``, ``RUN/checkpoints/step_000004/trainer/hf`` -> ``RUN-step_000004``."""
    path = Path(model.rstrip("/"))
    step = path.parent.parent
    if (path.name, path.parent.name, step.parent.name) == ("hf", "trainer", "checkpoints") and step.parent.parent.name:
        return f"{step.parent.parent.name}-{step.name}"
    return f"{path.parent.name}-{path.name}" if path.name == "final" and path.parent.name else path.name


def make_output_dir(cfg: EvalConfig) -> Path:
    """Create the output folder: ``cfg.output``, else ``evals/<model label>`` (``-2``, ``-3`` ... when taken).

    Errors: ``FileExistsError`` when ``cfg.output`` already holds ``results.json`` or ``samples.jsonl``.
    """
    if cfg.output:
        out = Path(cfg.output)
        taken = [f for f in ("results.json", "samples.jsonl") if (out / f).exists()]
        if taken:
            raise FileExistsError(f"--output {out}: already holds {', '.join(taken)}; choose another folder")
    else:
        base = Path("evals") / model_label(cfg.model.path)
        out, i = base, 1
        while out.exists():
            i += 1
            out = base.with_name(f"{base.name}-{i}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _settings(cfg: EvalConfig, model_dir: str, prompt_limit: int, max_model_len: int) -> dict[str, Any]:
    return {
        **plain(cfg),
        "n": cfg.n,
        "temperature": cfg.rollout.temperature,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "model_dir": model_dir,
        "prompt_token_limit": prompt_limit,
        "max_model_len": max_model_len,
        "ks": list(range(1, cfg.n + 1)),
        "interval": {"level": CONFIDENCE, "method": "percentile bootstrap over problems (Efron & Tibshirani 1993, "
                     "ch. 13.3)", "resamples": cfg.bootstrap_resamples, "seed": cfg.bootstrap_seed},
        "definitions": {
            "pass@k": "unbiased estimator of Chen et al. 2021 eq. 1, mean over problems",
            "maj@k": "expected correctness of a majority vote over a random k-subset of the n samples (correct "
                     "samples vote together for the gold, unparsed wrong ones abstain, ties credit 1/t), "
                     "mean over problems",
            "mean@k": "fraction of correct samples (c / n, the same for every k), mean over problems",
            "overall": "pooled over the problems of all data sets (each problem weighs the same)",
        },
    }  # fmt: skip


def _timing(datasets: dict[str, Any], engine_s: float, total_s: float) -> dict[str, float]:
    """Run timing: seconds to start the engine, to generate and to score (all sets), generated tokens per second
    of generation, seconds of generation + scoring per problem (normaliser: all problems), and the total."""
    gen = sum(d["timing"]["generate_s"] for d in datasets.values())
    score = sum(d["timing"]["score_s"] for d in datasets.values())
    tokens = sum(d["timing"]["tokens"] for d in datasets.values())
    problems = sum(d["problems"] for d in datasets.values())
    return {"engine_start_s": engine_s, "generate_s": gen, "score_s": score, "tokens_per_s": tokens / max(gen, 1e-9),
            "seconds_per_problem": (gen + score) / problems, "total_s": total_s}  # fmt: skip


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """Run ``rlvr eval`` (module docstring): load the sets, sample, score, write ``results.json`` and
    ``samples.jsonl`` into the output folder; return the results (``results["files"]`` names the files).

    Errors: ``ValueError`` for bad settings, a given ``--max-new-tokens`` the context cannot hold
    (:func:`token_budgets`) or data errors;
    ``FileNotFoundError`` for a missing data file; ``KeyError`` / ``ImportError`` for a verifier name that does not
    resolve; :class:`~rlvr.config.RecipeError` when a set has no usable gold; ``FileExistsError`` (output taken);
    ``RuntimeError`` when the scoring workers cannot start.
    """
    from transformers import AutoTokenizer

    from rlvr.models import resolve_model
    from rlvr.reward.base import resolve_verifier
    from rlvr.reward.pool import ScoringPool

    cfg.check()
    t_start = time.perf_counter()
    sets = resolve_sets(cfg)
    if all(entry in PRESETS for entry in cfg.data) and cfg.reward.verifiers[0].name != "math":
        log.warning("every set is a preset, scored by the math verifier: the verifier %r applies to file sets only",
                    cfg.reward.verifiers[0].name)
    for es in sets:
        resolve_verifier(es.verifier)  # a bad name fails before the model loads
    if cfg.environment.name is not None:  # so does a bad environment name or argument
        from rlvr.envs.runner import resolve_environment
        from rlvr.registry import check_kwargs

        check_kwargs(resolve_environment(cfg.environment.name), cfg.environment.args, "--env-args (environment.args)")
    if cfg.tools.enabled:  # and a tool that does not resolve or has no schema
        from rlvr.tools.registry import resolve_tools

        resolve_tools(cfg.tools.names)
    model_dir = resolve_model(cfg.model.path)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ctx = context_limit(model_dir)
    env = cfg.environment
    if cfg.multi_turn:  # a trajectory's whole budget after its prompt must fit beside the prompt
        prompt_limit, _ = token_budgets(ctx, cfg.prompts.max_prompt_tokens, env.max_tokens, False)
        new_tokens = cfg.rollout.max_new_tokens
    else:
        prompt_limit, new_tokens = token_budgets(ctx, cfg.prompts.max_prompt_tokens, cfg.rollout.max_new_tokens,
                                                 cfg.fit_new_tokens)  # fmt: skip
    if new_tokens != cfg.rollout.max_new_tokens:
        log.info("max new tokens %d: the default %d lowered to fit the model's %d-token context with prompts up to "
                 "%d tokens (--max-new-tokens to choose)", new_tokens, cfg.rollout.max_new_tokens, ctx, prompt_limit)
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_new_tokens=new_tokens))
    loaded = [load_set(es, cfg, tok, prompt_limit) for es in sets]
    after_prompt = env.max_tokens if cfg.multi_turn else new_tokens
    longest = max(len(p.prompt_ids) for ls in loaded for p in ls.prompts)
    max_model_len = engine_context(longest, prompt_limit, after_prompt, env.enabled)
    out_dir = make_output_dir(cfg)
    files = {"results": str(out_dir / "results.json"), "samples": str(out_dir / "samples.jsonl")}
    t0 = time.perf_counter()
    engine = _engine(cfg, model_dir, max_model_len)
    engine_s = time.perf_counter() - t0
    datasets: dict[str, Any] = {}
    pools: dict[str, Any] = {}
    turns = None
    try:
        if cfg.multi_turn:  # the turn loop, environment and tool workers, as in training (rlvr.envs.rollout)
            from rlvr.envs.rollout import TurnRollouts

            turns = TurnRollouts(env, cfg.prompts, new_tokens, model_dir, tools=cfg.tools,
                                     verifiers=tuple(cfg.reward.verifiers))
        with open(files["samples"], "w", encoding="utf-8") as out:
            for ls in loaded:
                key = json.dumps([ls.spec.verifier, ls.spec.verifier_args], sort_keys=True)
                if key not in pools:  # one pool per distinct verifier, started when first needed
                    rw = cfg.reward
                    pools[key] = ScoringPool([ls.spec.verifier_spec], rw.num_workers, rw.timeout_s, rw.memory_mb)
                datasets[ls.spec.name] = run_set(engine, pools[key], ls, cfg, out, turns)
    finally:
        for pool in pools.values():
            pool.close()
        if turns is not None:
            turns.close()
        del engine
    keys = next(iter(datasets.values()))["per_problem"]
    per = {k: [v for d in datasets.values() for v in d["per_problem"][k]] for k in keys}  # pooled problems
    overall = {
        "problems": sum(d["problems"] for d in datasets.values()),
        "samples": sum(d["stats"]["samples"] for d in datasets.values()),
        "metrics": metric_table(per, cfg),
    }
    for d in datasets.values():
        d.pop("per_problem")
    results = {
        "model": cfg.model.path,
        "settings": _settings(cfg, model_dir, prompt_limit, max_model_len),
        "datasets": datasets,
        "overall": overall,
        "timing": _timing(datasets, engine_s, time.perf_counter() - t_start),
        "files": files,
    }
    Path(files["results"]).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return results
