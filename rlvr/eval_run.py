"""``rlvr eval RUN``: what a run's policy is evaluated with, from the run's own ``recipe.yaml`` (:data:`RUN_KEYS`:
its prompt template, data fields, verifiers and dtype), unless flags say otherwise (:func:`rlvr.eval_cli.
config_from_args` applies them)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("rlvr.eval")

RUN_KEYS: dict[str, tuple[str, ...]] = {
    "data.prompt_template": ("--prompt-template",),
    "data.system_prompt": ("--system-prompt",),
    "data.chat_template": ("--no-chat-template",),
    "data.question": ("--question-field",),
    "data.answer": ("--answer-field",),
    "data.answer_format": ("--answer-format",),
    "data.reasoning_gym": (),
    "data.env_rows": (),
    "reward.verifiers": ("--verifier", "--verifier-args"),
    "model.dtype": ("--dtype",),
    "environment": ("--environment", "--env-args", "--max-turns", "--max-trajectory-tokens"),
    "tools": ("--tools",),
}
"""What ``rlvr eval RUN`` takes from the run's recipe (how the run wrote a prompt, read a row of its data and
scored an answer, the task settings of a ``reasoning_gym:`` or ``env:`` source, so that ``--data reasoning_gym:<task> --seed N``
evaluates the task it trained on with other seeds' rows, its dtype, its multi-turn environment and its tools), each
with the flags that override it (none for the task settings). The data
fields apply to the sets that are not presets (a file in the training format needs no ``--question-field``);
presets keep their own. Sampling, lengths and scoring limits stay the eval defaults, so runs and models compare at
the same settings (``--recipe RUN/recipe.yaml`` takes those too), except a run with an environment or tools: its
``rollout.max_new_tokens`` too, a turn's length being part of how its trajectories end (``--max-new-tokens`` wins)."""


def run_sections(recipe: Any, base: dict[str, Any]) -> dict[str, Any]:
    """:class:`~rlvr.evaluate.EvalConfig` fields for a run's policy: ``base`` (the eval defaults) with the
    :data:`RUN_KEYS` of the run's recipe (every verifier: the first scores the sets that are not presets)."""
    d = recipe.data
    prompts = dataclasses.replace(base["prompts"], prompt_template=d.prompt_template, system_prompt=d.system_prompt,
                                  chat_template=d.chat_template, question=d.question, answer=d.answer,
                                  answer_format=d.answer_format, reasoning_gym=d.reasoning_gym,
                                  env_rows=d.env_rows)  # fmt: skip
    from rlvr.reward.judge import rule_specs

    # the rule verifiers: a judge verifier asks a role that ``rlvr eval`` does not start
    reward = dataclasses.replace(base["reward"], verifiers=tuple(rule_specs(recipe.reward.verifiers)))
    rollout = base["rollout"]
    if recipe.environment.enabled or recipe.tools.enabled:  # a turn's length is part of the run's environment (a cut turn ends it)
        rollout = dataclasses.replace(rollout, max_new_tokens=recipe.rollout.max_new_tokens)
    return {**base, "prompts": prompts, "reward": reward, "dtype": recipe.model.dtype, "environment": recipe.environment,
            "tools": recipe.tools, "rollout": rollout}


def run_of(model: str) -> Any:
    """The :class:`~rlvr.runtime.checkpoint.RunPolicy` behind ``rlvr eval``'s model argument when it is a run folder
    (its ``final/``, else its newest complete checkpoint's policy: :func:`rlvr.models.resolve_model`), ``RUN/final``,
    a checkpoint folder or its ``trainer/hf``; None for anything else (an embedded name, a hub id, another folder).
    Errors: ``ValueError`` for a run folder that holds no policy yet."""
    from rlvr.models import EMBEDDED_MODELS, resolve_model
    from rlvr.runtime.checkpoint import run_policy

    if model in EMBEDDED_MODELS or not Path(model).expanduser().is_dir():
        return None
    return run_policy(resolve_model(model))


def log_run(model: str, run: Any, recipe: Any, args: argparse.Namespace) -> None:
    """Log which policy of the run is evaluated and what was taken from its recipe (or which flags won)."""
    if Path(model).expanduser().resolve() == run.run_dir.resolve():
        what = "its final/" if run.source == "final/" else f"its newest {run.source} (it has no final/)"
        where = f"{model} is a run folder: evaluating {what}, {run.model_dir}"
    else:
        where = f"{model}: the {run.source} policy of the run {run.run_dir}"
    values = {"data.prompt_template": recipe.data.prompt_template, "data.system_prompt": recipe.data.system_prompt,
              "data.chat_template": recipe.data.chat_template, "data.question": recipe.data.question,
              "data.answer": recipe.data.answer, "data.answer_format": recipe.data.answer_format,
              "data.reasoning_gym": dataclasses.asdict(recipe.data.reasoning_gym),
              "data.env_rows": dataclasses.asdict(recipe.data.env_rows),
              "model.dtype": recipe.model.dtype, "environment": recipe.environment.name,
              "tools": list(recipe.tools.names),
              "reward.verifiers": [v.name for v in recipe.reward.verifiers]}  # fmt: skip
    dest = {"--no-chat-template": "chat_template"}
    flags = [f for k in RUN_KEYS for f in RUN_KEYS[k] if getattr(args, dest.get(f, f[2:].replace("-", "_"))) is not None]
    taken = [f"{k}={values[k]!r}" for k in RUN_KEYS if not set(RUN_KEYS[k]) & set(flags)]
    log.info("%s; from %s: %s%s", where, run.recipe, ", ".join(taken) or "nothing",
             f" (flags given instead: {', '.join(flags)})" if flags else "")
