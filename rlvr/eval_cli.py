"""The ``rlvr eval`` command line: its flags (:func:`add_eval_parser`), the :class:`~rlvr.evaluate.EvalConfig` they
make with a recipe's or a run's sections (:func:`config_from_args`), the console table (:func:`results_table`) and
the command (:func:`cmd_eval`). The evaluation itself: :mod:`rlvr.evaluate`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Any

from rlvr.config import EnvironmentConfig, ModelConfig, RecipeError, ToolsConfig, VerifierSpec
from rlvr.evaluate import EVAL_PROMPTS, EVAL_REWARD, EVAL_ROLLOUT, PRESETS, EvalConfig, evaluate

log = logging.getLogger("rlvr.eval")

# ------------------------------------------------------------------------------------------------------
# console


def _cell(m: dict[str, Any]) -> str:
    lo, hi = m["ci"]
    return f"{m['value']:.3f} [{lo:.3f}, {hi:.3f}]"


def results_table(results: dict[str, Any]) -> Any:
    """A ``rich`` table: one row per metric (pass@k and maj@k for k = 1, powers of 2 and n; mean@n; sample
    stats), one column per data set, and ``overall`` when there are several sets."""
    from rich.table import Table

    from rlvr.config import default_ks

    n = results["settings"]["n"]
    cols = dict(results["datasets"])
    if len(cols) > 1:
        cols["overall (pooled)"] = results["overall"]
    st = results["settings"]
    iv = st["interval"]
    table = Table(
        title=f"rlvr eval {results['model']}",
        caption=f"n={n} samples per problem, temperature {st['temperature']}, max {st['max_new_tokens']} new tokens; "
        f"value [{round(100 * iv['level'])}% interval: bootstrap over problems, {iv['resamples']} resamples]",
    )
    table.add_column("metric")
    for name in cols:
        table.add_column(name, justify="right")
    table.add_row("problems", *[str(c["problems"]) for c in cols.values()])
    metrics = [f"pass@{k}" for k in default_ks(n)] + [f"maj@{k}" for k in default_ks(n) if k > 1] + [f"mean@{n}"]
    for m in metrics:
        table.add_row(m, *[_cell(c["metrics"][m]) for c in cols.values()])
    sets = list(results["datasets"].values())
    stats = [("mean length (tokens)", "length_mean", "{:.1f}"), ("truncated", "truncated_frac", "{:.1%}"),
             ("no answer", "no_answer_frac", "{:.1%}")]  # fmt: skip
    for label, key, fmt in stats:
        table.add_row(label, *[fmt.format(d["stats"][key]) for d in sets], *([""] if len(cols) > len(sets) else []))
    table.add_row("seconds / problem", *[f"{d['timing']['seconds_per_problem']:.2f}" for d in sets],
                  *([""] if len(cols) > len(sets) else []))  # fmt: skip
    return table


# ------------------------------------------------------------------------------------------------------
# command line


def add_eval_parser(sub: Any) -> None:
    """Register the ``eval`` subcommand on an ``argparse`` subparsers object (see :func:`cmd_eval`). Every setting
    flag defaults to None: unset, the value comes from ``--recipe`` (its sections) or the eval defaults."""
    ro, pr, rw = EVAL_ROLLOUT, EVAL_PROMPTS, EVAL_REWARD
    p = sub.add_parser("eval", help="evaluate a model on data sets: pass@k, maj@k, mean@k with 95%% intervals")
    p.add_argument("model", help="embedded name (smollm2-135m-instruct, tiny-random), a local folder, or a hub id; "
                   "a run (RUN: its final/, else its newest checkpoint; RUN/final; RUN/checkpoints/step_N) is "
                   "evaluated with its recipe's prompt template, data fields, verifiers and dtype unless flags say "
                   "otherwise")
    p.add_argument("--data", nargs="+", action="extend", required=True, metavar="SET",
                   help=f"presets {', '.join(PRESETS)}, a .jsonl/.json/.parquet file, or a datasets name; repeatable")
    p.add_argument("--recipe", default=None, metavar="YAML",
                   help="take the prompt template, sampling (n = validation.samples, temperature), the first verifier "
                   "(for sets that are not presets; presets use math), dtype and seed from a training recipe (e.g. "
                   "RUN/recipe.yaml); the flags below override it")
    p.add_argument("--n", type=int, default=None, help=f"samples per problem (default {ro.samples_per_prompt})")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default 1.0: the policy's own distribution, as in training "
                   "validation; 0: greedy)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"(default {ro.max_new_tokens}, or what the model's context leaves beside prompts of up to "
                   "--max-prompt-tokens or half the context, if less)")
    p.add_argument("--limit", type=int, default=None, help="the first N rows of each set, in file order")
    p.add_argument("--seed", type=int, default=None, help="engine seed (default 0)")
    p.add_argument("--engine", choices=["vllm", "hf"], default=None)
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float32", "float16"], default=None,
                   help="engine dtype (default auto: bfloat16 on a GPU or a CPU with native bf16, else float32)")
    p.add_argument("--output", "-o", default=None, help="output folder (default evals/<model>)")
    p.add_argument("--prompt-template", default=None, help="user message with {question} (default: "
                   "the question + 'Please reason step by step, and put your final answer within \\boxed{}.')")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--no-chat-template", dest="chat_template", action="store_false", default=None,
                   help="raw prompt text")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help=f"longer prompts are dropped (default {pr.max_prompt_tokens})")
    p.add_argument("--split", default=None, help=f"split of a datasets name (default {pr.split})")
    p.add_argument("--question-field", default=None,
                   help="file sets: question field or template, e.g. '{Body} {Question}' (default question)")
    p.add_argument("--answer-field", default=None, help="file sets: gold answer field (default answer)")
    p.add_argument("--answer-format", choices=["raw", "gsm8k"], default=None,
                   help="file sets: raw (default) or gsm8k (the text after '#### ')")
    p.add_argument("--verifier", default=None, help="verifier of file sets (default math; presets use math)")
    p.add_argument("--verifier-args", default=None, help="constructor args of --verifier as JSON")
    p.add_argument("--workers", type=int, default=None, help=f"scoring processes (default {rw.num_workers})")
    p.add_argument("--timeout", type=float, default=None, help=f"seconds per sample's scoring (default {rw.timeout_s:g})")
    p.add_argument("--kv-cache-gib", type=float, default=None, help=f"(default {ro.kv_cache_gib:g})")
    p.add_argument("--threads", type=int, default=None, help="engine torch threads (default 1)")
    p.add_argument("--batch-prompts", type=int, default=None, help="prompts per engine call (default 32)")
    p.add_argument("--bootstrap-resamples", type=int, default=None)
    p.add_argument("--environment", default=None, metavar="NAME",
                   help="multi-turn: n trajectories per problem in this environment (feedback, guess, "
                   "module:Name, file.py:Name), the final answer scored; a run's or --recipe's environment section "
                   "is taken without it")
    p.add_argument("--env-args", default=None, metavar="JSON", help="constructor args of --environment as JSON")
    p.add_argument("--max-turns", type=int, default=None, help="assistant turns per trajectory at most (default 4)")
    p.add_argument("--max-trajectory-tokens", type=int, default=None,
                   help="a trajectory's token budget after its prompt (environment.max_tokens, default 1024)")
    p.add_argument("--tools", default=None, metavar="NAMES",
                   help="tools the model may call, comma-separated (calculator, python, module:func, file.py:func): "
                   "trajectories whose replies without a call are the final answers; a run's or --recipe's tools "
                   "are taken without it ('none' drops them)")
    p.set_defaults(fn=cmd_eval)


def _json_object(text: str | None, flag: str) -> dict[str, Any] | None:
    """``text`` read as a JSON object (None: not given). Errors: ``ValueError`` naming ``flag``."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} must be a JSON object, got {text!r} ({e.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object, got {text!r}")
    return value


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def recipe_sections(recipe: Any) -> dict[str, Any]:
    """:class:`EvalConfig` fields from a training recipe: its model dtype, data template and fields, rollout
    sampling (n = ``validation.samples``, temperature ``validation.temperature``, as validation samples), reward
    section and seed; the split stays the eval default (``test``), the prompts are read in file order."""
    data = dataclasses.replace(recipe.data, split=EVAL_PROMPTS.split, limit=None, shuffle=False)
    rollout = dataclasses.replace(recipe.rollout, samples_per_prompt=recipe.validation.samples,
                                  temperature=recipe.validation.temperature, num_engines=1)  # fmt: skip
    return {"prompts": data, "rollout": rollout, "reward": recipe.reward, "seed": recipe.run.seed,
            "dtype": recipe.model.dtype, "environment": recipe.environment, "tools": recipe.tools}  # fmt: skip


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The :class:`EvalConfig` of parsed ``rlvr eval`` arguments: the eval defaults, or ``--recipe``'s sections
    (:func:`recipe_sections`), or for a run's policy (:func:`rlvr.eval_run.run_of`) its recipe's
    :data:`rlvr.eval_run.RUN_KEYS` (:func:`rlvr.eval_run.run_sections`; logged), with every given flag on top.
    Errors: ``ValueError`` for bad ``--verifier-args`` or a run folder without a policy;
    :class:`~rlvr.config.RecipeError` for a bad ``--recipe`` or run recipe."""
    from rlvr.eval_run import log_run, run_of, run_sections
    from rlvr.recipe import load_recipe

    vargs, eargs = _json_object(args.verifier_args, "--verifier-args"), _json_object(args.env_args, "--env-args")
    base: dict[str, Any] = {"prompts": EVAL_PROMPTS, "rollout": EVAL_ROLLOUT, "reward": EVAL_REWARD, "seed": 0,
                            "dtype": "auto", "environment": EnvironmentConfig(), "tools": ToolsConfig()}  # fmt: skip
    run, model = run_of(args.model), args.model
    if run is not None:
        model = str(run.model_dir)
    if args.recipe is not None:
        try:
            base = recipe_sections(load_recipe(args.recipe))
        except OSError as e:
            raise ValueError(f"--recipe {args.recipe}: cannot read it ({e.strerror or e})") from None
        except RecipeError as e:
            raise RecipeError(f"--recipe {args.recipe}: {e}") from None
        if run is not None:
            log.info("%s: --recipe %s given, so the run's own %s is not read", args.model, args.recipe, run.recipe)
    elif run is not None:
        try:
            recipe = load_recipe(run.recipe)
        except RecipeError as e:
            raise RecipeError(f"{run.recipe} (the recipe of {args.model}): {e}; give --recipe with a recipe "
                              "that loads (its template, verifier and dtype are used)") from None  # fmt: skip
        base = run_sections(recipe, base)
        log_run(args.model, run, recipe, args)
    prompts = dataclasses.replace(base["prompts"], **_given(
        prompt_template=args.prompt_template, system_prompt=args.system_prompt, chat_template=args.chat_template,
        max_prompt_tokens=args.max_prompt_tokens, split=args.split, limit=args.limit, question=args.question_field,
        answer=args.answer_field, answer_format=args.answer_format))  # fmt: skip
    rollout = dataclasses.replace(base["rollout"], **_given(
        samples_per_prompt=args.n, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
        engine=args.engine, kv_cache_gib=args.kv_cache_gib, threads=args.threads))  # fmt: skip
    reward = base["reward"]
    if args.verifier is not None or vargs is not None:
        first = reward.verifiers[0] if reward.verifiers else VerifierSpec()
        if args.verifier not in (None, first.name) and vargs is None:
            vargs = {}  # another verifier: the recipe's arguments were its first verifier's
        first = dataclasses.replace(first, **_given(name=args.verifier, args=vargs))
        reward = dataclasses.replace(reward, verifiers=(first, *reward.verifiers[1:]))
    reward = dataclasses.replace(reward, **_given(num_workers=args.workers, timeout_s=args.timeout))
    environment = base["environment"]
    if args.environment is not None and args.environment != environment.name and eargs is None:
        eargs = {}  # another environment: the recipe's arguments were its own
    environment = dataclasses.replace(environment, **_given(
        name=args.environment, args=eargs, max_turns=args.max_turns, max_tokens=args.max_trajectory_tokens))  # fmt: skip
    tools = base["tools"]
    if args.tools is not None:
        names = tuple(n.strip() for n in args.tools.split(",") if n.strip() and n.strip() != "none")
        tools = dataclasses.replace(tools, names=names)
    if not environment.enabled and not tools.enabled and (eargs is not None or args.max_turns is not None
                                                          or args.max_trajectory_tokens is not None):
        raise ValueError("--env-args, --max-turns and --max-trajectory-tokens need --environment NAME or --tools (or "
                         "a run or --recipe with an environment or tools section)")
    return EvalConfig(
        model=ModelConfig(path=model, dtype=args.dtype or base["dtype"]), data=tuple(args.data),
        prompts=prompts, rollout=rollout, reward=reward, environment=environment, tools=tools, seed=args.seed if args.seed is not None else base["seed"],
        output=args.output, **_given(batch_prompts=args.batch_prompts, bootstrap_resamples=args.bootstrap_resamples),
        fit_new_tokens=args.max_new_tokens is None and args.recipe is None,
    )  # fmt: skip


def cmd_eval(args: argparse.Namespace) -> int:
    """Run ``rlvr eval``; print the table and the output files. Exit status: 0 done; 2 bad arguments, data,
    model or verifier names (one line on stderr); 1 when the run fails after the engine started."""
    from rich.console import Console

    from rlvr.console import quiet_own_output

    try:
        cfg = config_from_args(args)
        cfg.check()
        with quiet_own_output():  # vLLM's and torch's C++ messages and progress bars: the noise rlvr train filters
            results = evaluate(cfg)
    except (ValueError, KeyError, OSError, ImportError, AttributeError, RecipeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"rlvr eval: {msg}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"rlvr eval: the run failed: {e}", file=sys.stderr)
        return 1
    console = Console(width=max(100, Console().width))
    console.print(results_table(results))
    for name, d in results["datasets"].items():
        st = d["stats"]
        if "turns_mean" in st:  # trajectories (--environment, --tools)
            tools = (f"; tool calls per trajectory {st['tool_calls_mean']:.2f}, trajectories calling a tool "
                     f"{st['tool_use_frac']:.3f}") if results["settings"]["tools"]["names"] else ""
            console.print(f"{name}: {st['turns_mean']:.2f} turns per trajectory; solved at turn 1 "
                          f"{st['solved_turn_1_frac']:.3f}, after it {st['solved_after_turn_1_frac']:.3f}{tools}; "
                          "ended: " + ", ".join(f"{k} {v}" for k, v in st["end_reasons"].items()))
    t = results["timing"]
    console.print(f"engine start {t['engine_start_s']:.1f} s; generation {t['generate_s']:.1f} s "
                  f"({t['tokens_per_s']:.0f} tokens/s); scoring {t['score_s']:.1f} s; "
                  f"{t['seconds_per_problem']:.2f} s per problem; total {t['total_s']:.1f} s")
    console.print(f"results: {results['files']['results']}\nsamples: {results['files']['samples']}")
    return 0
