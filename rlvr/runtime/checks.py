"""Load-time checks: what can be known about a recipe before any role starts, each error naming the recipe key
to change and the value that fits.

- :func:`preflight` (every ``rlvr train``, before the run folder is made): verifier names and ``args`` against
  their constructors, data files, model name, and the model's context against ``data.max_prompt_tokens +
  rollout.max_new_tokens`` (:func:`check_context`); no data, no weights.
- :func:`load_prompts`: the data load the run itself uses (:func:`rlvr.runtime.controller.train`): rows, their
  golds (``data.bad_gold``, ``timeouts.gold_check_s``), prompts tokenised and filtered by length.
- :func:`build_verifiers`: every rule verifier built with its args, in this process.
- :func:`check_chat_template`: a multi-turn recipe's chat template probed with the run's own check
  (:func:`rlvr.envs.template_check.checked_renderer`, which the run's :class:`~rlvr.envs.rollout.TurnRollouts` calls).
- :func:`dry_run` (``rlvr train --dry-run``): all of the above with the tokenizer and the model's config only (no
  Ray, no engine, no weights), one line per thing checked; so a green dry run means the run's own loading passes.
- :func:`memory_lines` (``--dry-run`` too): the memory model per role and device (:mod:`rlvr.runtime.memory`).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from rlvr.config import Recipe, RecipeError
from rlvr.types import Prompt

log = logging.getLogger("rlvr")

NOT_CHECKED = "not checked:"
"""The start of a :func:`dry_run` line for a check that could not be made here."""


def preflight(recipe: Recipe, *, model_optional: bool = False) -> list[str]:
    """Checks that need no role started: every verifier name resolves and its ``args`` fit its constructor
    (:func:`rlvr.reward.base.check_verifier_args`), the data source and validation source exist (or may be
    ``datasets`` names), the model name is embedded, a folder, or a hub id, and its context holds a prompt and its
    response (:func:`check_context`; reads the model's config, building an embedded model on first use), and
    ``trainer.lora``'s targets and rank against the model's modules (:func:`rlvr.train.lora.check_lora`), and
    ``data.chat_template_path`` names a template (:func:`rlvr.data.datasets.chat_template_text`).
    ``model_optional`` (``--dry-run``): a model whose config cannot be read here (a hub id neither cached nor
    reachable) is a ``not checked`` line instead of an error. Returns one line per check made (``checked: ...``)
    or skipped (``not checked: ...``).

    Errors: ``ValueError`` (:class:`~rlvr.config.RecipeError` for unknown verifier args and a context too short) /
    ``KeyError`` / ``FileNotFoundError`` / ``ImportError`` with the message of the failed check;
    :class:`~rlvr.models.ModelUnavailable` (an ``OSError``) for a model that cannot be read, unless
    ``model_optional``.
    """
    return _preflight(recipe, model_optional)[0]


def _preflight(recipe: Recipe, model_optional: bool) -> tuple[list[str], tuple[str, int | None] | None]:
    """:func:`preflight`'s lines and (model location, context), None when the model is not available here."""
    from rlvr.data.datasets import did_you_mean, resolve_data_path
    from rlvr.models import ModelUnavailable, check_model_name, model_context
    from rlvr.reward.base import check_verifier_args, resolve_verifier
    from rlvr.reward.judge import JUDGE

    check_model_name(recipe.model.path)
    _warn_settings(recipe)
    packages = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
    for backend in recipe.metrics.backends:
        if importlib.util.find_spec(packages[backend]) is None:
            raise ImportError(f"metrics.backends has {backend!r} but its package is not installed: "
                              f"pip install 'rlvr[logging]' (or {packages[backend]}), or drop it from metrics.backends")
    specs = recipe.reward.verifiers
    rules = [(i, s) for i, s in enumerate(specs) if s.name != JUDGE]  # a judge's args: the recipe loader checks them
    for _, spec in rules:
        resolve_verifier(spec.name)
    for i, spec in rules:
        check_verifier_args(spec, f"reward.verifiers[{i}].args")
    if recipe.judge.model is not None and len(rules) < len(specs):
        check_model_name(recipe.judge.model)
    sources = [("data.source", recipe.data.source, recipe.data.split)]
    if recipe.validation.every_steps > 0:  # validation off (0): its source is never read
        sources.append(("validation.source", recipe.validation.source, recipe.validation.split))
    for key, source, split in sources:
        if source is None or source == "generated":
            continue
        looks_like_file = source.endswith((".jsonl", ".json", ".parquet")) or source.startswith((".", "/", "~"))
        if looks_like_file and resolve_data_path(source) is None:
            hint = did_you_mean(source, split=split)
            raise FileNotFoundError(f"{key}={source!r}: no such file (relative paths are tried from the working "
                                    f"directory, then from the rlvr repository); fix the path.{hint}")
    lines = [f"checked: verifier args {', '.join(f'reward.verifiers[{i}]' for i, _ in rules)} fit their constructors"]
    if recipe.data.chat_template_path is not None:  # the file or shipped name is read and parses as Jinja
        from rlvr.data.datasets import chat_template_text

        chat_template_text(recipe.data.chat_template_path)
        lines.append(f"checked: data.chat_template_path {recipe.data.chat_template_path} reads as a Jinja template")
    if recipe.environment.name is not None:  # multi-turn: the environment resolves and takes its args
        from rlvr.envs.runner import resolve_environment
        from rlvr.registry import check_kwargs

        env_cls = resolve_environment(recipe.environment.name)
        try:
            check_kwargs(env_cls, recipe.environment.args, "environment.args")
        except RecipeError as e:  # often a recipe's args kept while environment.name was overridden
            raise RecipeError(f"{e} (environment.args={dict(recipe.environment.args)} come from the recipe and its "
                              f"overrides, for environment {recipe.environment.name}; 'environment.args={{}}' clears "
                              "them)") from None
        own_check = getattr(env_cls, "check_args", None)  # the environment's own load-time check (rlvr.envs.base)
        if callable(own_check):
            try:
                own_check(**recipe.environment.args)
            except RecipeError:
                raise
            except (KeyError, ValueError, TypeError, ImportError, AttributeError, OSError) as e:
                msg = e.args[0] if isinstance(e, KeyError) and e.args else e
                raise RecipeError(f"environment.args ({recipe.environment.name}): {msg}") from None
        lines.append(f"checked: environment {recipe.environment.name} resolves and takes environment.args")
    if recipe.tools.enabled:  # each tool resolves and has a JSON schema (signature + docstring)
        from rlvr.tools.registry import resolve_tools

        try:
            resolve_tools(recipe.tools.names)
        except (KeyError, ImportError, AttributeError, TypeError, ValueError, OSError) as e:
            raise RecipeError(f"tools.names: {str(e).strip(chr(34))}") from None
        lines.append(f"checked: tools {', '.join(recipe.tools.names)} resolve and have JSON schemas")
    try:
        model = model_context(recipe.model.path)
    except ModelUnavailable as e:
        if not model_optional:
            raise
        return [*lines, f"{NOT_CHECKED} the model's context and the prompt lengths: {e}"], None
    if recipe.teacher.model is not None:
        lines.append(check_teacher_tokenizer(recipe.model.path, recipe.teacher.model))
    lines.append(check_context(recipe, model[1]))
    if recipe.trainer.lora.rank > 0:  # the adapters' targets and rank against the model's modules (meta device)
        from rlvr.train.lora import check_lora

        lines.append(check_lora(recipe.trainer.lora, model[0], recipe.model.path))
    return lines, model


TOKENIZER_PROBE = "On-policy distillation: 12 + 30 = 42. \\boxed{42}\n<|im_start|>assistant Ünïcode ✓ 数学"
"""A string both tokenizers must encode to the same ids (digits, LaTeX, a chat marker, accents, CJK)."""


def check_teacher_tokenizer(student: str, teacher: str) -> str:
    """Refuse a teacher whose tokenizer is not the student's: the teacher scores the student's token ids, so the
    same id must mean the same text to both (on-policy distillation, :mod:`rlvr.algos.distill`). Compared: the
    vocabularies (token -> id maps, special tokens included) and the ids of :data:`TOKENIZER_PROBE`.
    ``student``, ``teacher``: ``model.path`` and ``teacher.model`` (names, folders or hub ids, resolved as the
    roles resolve them). Returns the line for the preflight's list.
    Errors: :class:`~rlvr.config.RecipeError` naming both models and the first difference found;
    :class:`~rlvr.models.ModelUnavailable` for a model that cannot be read."""
    from transformers import AutoTokenizer

    from rlvr.models import check_model_name, model_context

    toks = {}
    for key, name in (("model.path", student), ("teacher.model", teacher)):
        check_model_name(name)
        toks[key] = AutoTokenizer.from_pretrained(model_context(name)[0])
    s, t = toks["model.path"], toks["teacher.model"]
    vs, vt = s.get_vocab(), t.get_vocab()
    where = f"teacher.model={teacher!r} and model.path={student!r}"
    if vs != vt:
        only_s = sorted(set(vs) - set(vt))[:3]
        moved = sorted(k for k in set(vs) & set(vt) if vs[k] != vt[k])[:3]
        raise RecipeError(f"{where} have different tokenizers (vocabularies of {len(vt)} and {len(vs)} tokens; "
                          f"only the student's: {only_s}; same token, another id: {moved}): the teacher scores the "
                          "student's token ids, so it must share the student's tokenizer; pick a teacher of the "
                          "student's family (e.g. a run of this model: RUN/final)")  # fmt: skip
    ids_s, ids_t = s.encode(TOKENIZER_PROBE), t.encode(TOKENIZER_PROBE)
    if ids_s != ids_t:
        raise RecipeError(f"{where}: their tokenizers share a vocabulary but split {TOKENIZER_PROBE!r} differently "
                          f"(student {ids_s[:12]}..., teacher {ids_t[:12]}...): the teacher must tokenize as the "
                          "student does")  # fmt: skip
    return f"checked: teacher.model {teacher} shares the student's tokenizer ({len(vs)} tokens)"


def _warn_settings(recipe: Recipe) -> None:
    """Warnings about settings that work but cost (bf16 on a CPU without bf16, overlap on shared cores)."""
    from rlvr.hardware import cpu_has_bf16

    if recipe.model.dtype == "bfloat16" and recipe.trainer.num_gpus == 0 and not cpu_has_bf16():
        log.warning("this CPU has no bf16 instructions (AVX512-BF16 / AMX): bf16 matmuls run ~100x slower than fp32 "
                    "here (measured on an AVX2-only EPYC: 1.06 s against 0.011 s for a 640x576 @ 576x1536 matmul); "
                    "set model.dtype=auto (the default: float32 here) or float32 for a run many times faster")
    ro, tr = recipe.rollout, recipe.trainer
    if ro.max_staleness and ro.num_gpus == 0 and tr.num_gpus == 0 and not (ro.cpus and tr.cpus):
        log.warning("rollout.max_staleness=%d on CPU with the engines and the trainer on the same cores: the overlapped "
                    "stages compete for them (measured on 2 cores: steps 1.25x slower than max_staleness=0, "
                    "benchmarks/async_speedup.py); overlap pays where they have hardware of their own (GPUs, or "
                    "rollout.cpus / trainer.cpus on a machine with cores to spare)", ro.max_staleness)
    if ro.max_staleness and recipe.algorithm.rollout_correction == "none":
        log.warning("rollout.max_staleness=%d with algorithm.rollout_correction=none: the update is the on-policy "
                    "gradient evaluated on samples %d version(s) old, uncorrected (the default, auto, would use AReaL's "
                    "decoupled objective)", ro.max_staleness, ro.max_staleness)


def check_context(recipe: Recipe, ctx: int | None) -> str:
    """Check that a prompt of ``data.max_prompt_tokens`` and what follows it (``rollout.max_new_tokens``, or with an
    environment a trajectory's ``environment.max_tokens``: :attr:`~rlvr.config.Recipe.response_budget`) fit in the
    model's context ``ctx`` (positions; None: the config declares none, not checked); validation samples as many
    new tokens. Returns the line saying what was checked.

    Errors: :class:`~rlvr.config.RecipeError` naming both keys and the largest values that fit: each key alone
    with the other kept, where that leaves at least one token; else both (:func:`rlvr.models.token_budgets`).
    """
    from rlvr.models import token_budgets

    key, n = recipe.response_budget
    p, model = recipe.data.max_prompt_tokens, recipe.model.path
    keys = f"data.max_prompt_tokens + {key}"
    if ctx is None:
        return f"{NOT_CHECKED} {keys} = {p} + {n}: model {model} declares no max_position_embeddings"
    if p + n <= ctx:
        return f"checked: model {model} context {ctx} >= {p} + {n} ({keys})"
    fixes = []
    if ctx - n >= 1:
        fixes.append(f"data.max_prompt_tokens to at most {ctx - n} (keeping {key}={n})")
    if ctx - p >= 1:
        fixes.append(f"{key} to at most {ctx - p} (keeping data.max_prompt_tokens={p})")
    if not fixes:
        lp, ln = token_budgets(ctx, p, n, fit=True)
        fixes.append(f"both, e.g. data.max_prompt_tokens={lp} {key}={ln}")
    raise RecipeError(f"{keys} = {p} + {n} = {p + n} tokens, more than the {ctx}-token context of model "
                      f"{model} (max_position_embeddings of its config.json), which a prompt and its response share "
                      f"(the engine refuses a longer one): lower {', or '.join(fixes)}")


def load_prompts(recipe: Recipe, tokenizer: Any, ctx: int | None) -> tuple[list[Prompt], str]:
    """The run's prompts, as the run loads them: :func:`rlvr.data.load_rows`, the golds checked by the primary
    verifier (:func:`rlvr.reward.golds.check_golds` under ``data.bad_gold`` and ``timeouts.gold_check_s``), then
    templated and filtered by ``data.max_prompt_tokens`` (:func:`rlvr.data.build_prompts`). ``ctx``: the model's
    context (None: unknown), so that advice stays within it. Returns (prompts, the line saying what was checked).

    Errors: those of the three steps and of :func:`check_context`; :class:`~rlvr.config.RecipeError` when fewer
    prompts are left than ``rollout.prompts_per_step`` (the message says where the rows went and what to change).
    """
    from rlvr.data import build_prompts, load_rows
    from rlvr.reward.golds import check_golds
    from rlvr.tools.formats import recipe_tool_listing

    r = recipe
    check_context(r, ctx)
    rows = load_rows(r.data, r.run.seed)
    kept, report = check_golds(rows, r.reward.verifiers, r.data.bad_gold, r.timeouts.gold_check_s)
    context = (ctx, r.response_budget[1], r.response_budget[0]) if ctx is not None else None
    prompts, dropped = build_prompts(kept, tokenizer, r.data, context, recipe_tool_listing(r.tools, r.data, tokenizer))
    log.info("%d prompts (%d dropped as longer than %d tokens)", len(prompts), dropped, r.data.max_prompt_tokens)
    if len(prompts) < r.rollout.prompts_per_step:
        raise RecipeError(_too_few(r, len(prompts), len(rows), len(report.bad), dropped, ctx))
    unchecked = "" if report.checked else ", no check_gold"
    line = (f"checked: data {r.data.source}: {len(rows)} rows, golds usable {report.kept}/{report.total} (verifier "
            f"{report.verifier}{unchecked}), {len(prompts)} prompts ({dropped} over {r.data.max_prompt_tokens} tokens)")
    return prompts, line


def _too_few(r: Recipe, prompts: int, rows: int, bad: int, too_long: int, ctx: int | None) -> str:
    """Why fewer prompts than ``rollout.prompts_per_step`` are left, and what to change: raising
    ``data.max_prompt_tokens`` is offered only where prompts were dropped as too long and the context holds more."""
    p, n = r.data.max_prompt_tokens, r.rollout.max_new_tokens
    fixes = ["lower rollout.prompts_per_step"]
    if too_long:
        room = ctx - n if ctx is not None else None
        if room is None:
            fixes.append("raise data.max_prompt_tokens")
        elif p < room:
            fixes.append(f"raise data.max_prompt_tokens (at most {room}: the model's {ctx}-token context less "
                         f"rollout.max_new_tokens={n})")
        else:
            fixes.append("shorten the prompts (data.prompt_template, data.system_prompt), or lower "
                         "rollout.max_new_tokens to make room for a larger data.max_prompt_tokens")
    if r.data.limit is not None and r.data.limit <= rows:
        fixes.append("raise data.limit")
    if bad:
        fixes.append("fix the unusable golds (the warning above lists them)")
    return (f"data: {prompts} usable prompts but rollout.prompts_per_step={r.rollout.prompts_per_step} ({rows} rows; "
            f"{bad} without a usable gold, {too_long} longer than data.max_prompt_tokens={p}): {', or '.join(fixes)}")


def build_verifiers(recipe: Recipe) -> str:
    """Build every rule verifier of ``reward.verifiers`` with its args, in this process (as each scoring worker
    will). Returns the line saying so.

    Errors: those of :func:`rlvr.reward.base.resolve_verifier`; :class:`~rlvr.config.RecipeError` naming
    ``reward.verifiers[i].args`` when a constructor refuses its args (its own message included).
    """
    from rlvr.reward.base import build_verifier
    from rlvr.reward.judge import JUDGE

    rules = [(i, s) for i, s in enumerate(recipe.reward.verifiers) if s.name != JUDGE]
    for i, spec in rules:
        try:
            build_verifier(spec)
        except (TypeError, ValueError) as e:
            raise RecipeError(f"reward.verifiers[{i}] ({spec.name}) cannot be built with args {dict(spec.args)}: "
                              f"{type(e).__name__}: {e}; fix reward.verifiers[{i}].args") from e
    return f"checked: verifiers {', '.join(s.name for _, s in rules)} built"


def check_chat_template(recipe: Recipe, tokenizer: Any) -> str | None:
    """The chat template of a multi-turn recipe (``environment`` or ``tools``) probed by the check the run makes
    when it starts its turns (:func:`rlvr.envs.template_check.checked_renderer`: a system message, the tools
    listing, tool calls in ``tools.format`` answered by tool messages, an environment's user message), on
    ``tokenizer`` (the model's; ``data.chat_template_path``'s template is set on it). Returns the line saying what
    was checked; None for a single-turn recipe (its template renders prompts only: :func:`load_prompts`).

    Errors: :class:`~rlvr.config.RecipeError` with the reason and the fix (``data.chat_template_path``)."""
    from rlvr.envs.template_check import checked_renderer

    r = recipe
    if not (r.environment.enabled or r.tools.enabled):
        return None
    _, listing = checked_renderer(tokenizer, r.data, r.environment.enabled, r.tools, r.model.path)
    which = f"data.chat_template_path={r.data.chat_template_path}" if r.data.chat_template_path else r.model.path
    parts = ["a system message"] + ([f"tool calls ({listing.fmt}) and tool messages"] if listing else []) + \
        (["an environment's user message"] if r.environment.enabled else [])
    return f"checked: chat template ({which}) carries a trajectory token for token ({', '.join(parts)})"


def dry_run(recipe: Recipe) -> list[str]:
    """``rlvr train --dry-run``: :func:`preflight`, then a multi-turn recipe's chat template probed as the run
    probes it (:func:`check_chat_template`), the data loaded as the run loads it (:func:`load_prompts`,
    and the validation prompts when ``validation.every_steps``) with the model's tokenizer, and every verifier
    built (:func:`build_verifiers`); no Ray, no engine, no weights. Where the model is not available here (a hub
    id neither cached nor reachable) the rows and golds are still checked, and the prompt lengths are a
    ``not checked`` line. Returns one line per check.

    Errors: those of the checks it runs.
    """
    from rlvr.data import load_rows
    from rlvr.reward.golds import check_golds

    r = recipe
    lines, model = _preflight(r, model_optional=True)
    if model is None:
        rows = load_rows(r.data, r.run.seed)
        _, report = check_golds(rows, r.reward.verifiers, r.data.bad_gold, r.timeouts.gold_check_s)
        lines += [f"checked: data {r.data.source}: {len(rows)} rows, golds usable {report.kept}/{report.total} "
                  f"(verifier {report.verifier})",
                  f"{NOT_CHECKED} prompt lengths (data.max_prompt_tokens): the model's tokenizer is not available here"]
        if r.environment.enabled or r.tools.enabled:
            lines.append(f"{NOT_CHECKED} the chat template's multi-turn probe: the model's tokenizer is not "
                         "available here")
    else:
        from transformers import AutoTokenizer

        from rlvr.runtime.validation import validation_prompts

        tokenizer = AutoTokenizer.from_pretrained(model[0])
        template_line = check_chat_template(r, tokenizer)  # the run's own template check (TurnRollouts)
        lines += [template_line] if template_line else []
        lines.append(load_prompts(r, tokenizer, model[1])[1])
        if r.validation.every_steps:
            va = r.validation
            val = validation_prompts(r, tokenizer)
            lines.append(f"checked: validation data {va.source or r.data.source} [{va.split}]: {len(val)} prompts")
    lines.append(build_verifiers(r))
    return lines


def memory_lines(recipe: Recipe) -> list[str]:
    """The memory model's block for ``--dry-run`` (:func:`rlvr.runtime.memory.format_plan`) from the recipe and the
    model's config, and, on a machine with a CUDA GPU, whether the recipe fits it. A model whose config cannot be
    read here or whose architecture is not modelled gives one ``not checked`` line instead."""
    from rlvr.models import ModelUnavailable, model_context
    from rlvr.runtime.memory import GB, format_plan, load_config, memory_plan

    try:
        def config_of(name: str) -> dict:
            model_dir = model_context(name)[0]  # fails fast for a hub id neither cached nor reachable
            try:
                return load_config(model_dir, local_only=True)
            except OSError:
                return load_config(model_dir)

        teacher_config = config_of(recipe.teacher.model) if recipe.teacher.model else None  # the teacher's own model
        plan = memory_plan(recipe, config_of(recipe.model.path), teacher_config=teacher_config)
    except (ModelUnavailable, OSError, ValueError, KeyError) as e:
        return [f"{NOT_CHECKED} memory model: {e}"]
    lines = format_plan(plan)
    if plan.card_bytes is not None:
        import torch

        if torch.cuda.is_available():
            have = torch.cuda.get_device_properties(0).total_memory
            verdict = "fits" if have >= plan.card_bytes else "does NOT fit"
            lines.append(f"this machine's GPU 0: {have / GB:.1f} GB: the recipe {verdict}")
    return lines
