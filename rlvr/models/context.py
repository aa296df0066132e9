"""A model's context (its longest sequence, prompt and response together) and how the two share it.

One home for the fact, read by ``rlvr train`` (checked at load: :func:`rlvr.runtime.checks.check_context`) and by
``rlvr eval`` (:func:`token_budgets` fits its new tokens to the context). A vLLM engine refuses a
``max_model_len`` over the model's ``max_position_embeddings``, and the trainer's positions past it are garbage,
so every kept prompt plus its response must fit: ``prompt tokens + new tokens <= context``.
"""

from __future__ import annotations

import os


class ModelUnavailable(OSError):
    """A model whose config cannot be read here: a hub id neither in the local Hugging Face cache nor reachable,
    or an embedded model that cannot be fetched. The message names ``model.path`` and the fix."""


def context_limit(model_dir: str, local_only: bool = False) -> int | None:
    """The model's longest sequence (``max_position_embeddings`` of its config; a multimodal config's
    ``text_config``), None when it declares none. ``local_only``: read a hub id from the local cache only.

    Errors: ``OSError`` when the config cannot be read (a hub id not cached, with ``local_only`` or no network).
    """
    from transformers import AutoConfig

    conf = AutoConfig.from_pretrained(model_dir, local_files_only=local_only)
    conf = getattr(conf, "text_config", None) or conf
    value = getattr(conf, "max_position_embeddings", None)
    return int(value) if value else None


def model_context(path: str) -> tuple[str, int | None]:
    """(loadable model location, its context) for a recipe's ``model.path``: :func:`rlvr.models.resolve_model`
    (an embedded model is built on first use), then its config. A hub id is read from the local cache first and
    fetched only when the hub is reachable (no retries against an unreachable hub), so this takes seconds.

    Errors: :class:`ModelUnavailable` for a hub id neither cached nor reachable, or an embedded model that cannot
    be fetched; ``OSError`` for a local folder whose config cannot be read.
    """
    from rlvr.data.datasets import hub_reachable
    from rlvr.models import resolve_model

    try:
        model_dir = resolve_model(path)
    except RuntimeError as e:  # an embedded model that cannot be fetched or fails its checksum
        raise ModelUnavailable(f"model.path={path!r}: {e}") from e
    try:
        return model_dir, context_limit(model_dir, local_only=True)
    except OSError:
        if os.path.isdir(model_dir):
            raise
    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    if flag or not hub_reachable():
        why = "HF_HUB_OFFLINE is set" if flag else "the Hugging Face hub is unreachable"
        raise ModelUnavailable(f"model.path={path!r}: not in the local Hugging Face cache and {why}; download it "
                               f"where the hub is reachable (huggingface-cli download {path}) or give a local folder")
    return model_dir, context_limit(model_dir)


def token_budgets(ctx: int | None, max_prompt_tokens: int, max_new_tokens: int, fit: bool) -> tuple[int, int]:
    """(prompt token limit, new tokens) for a model of ``ctx`` positions (``max_position_embeddings``; None: no
    limit known, both as given). Prompt and response share the context: prompts longer than the limit are dropped
    (counted as ``too_long``), so every kept prompt plus its response fits.

    - ``fit`` (the eval default, no flag): new tokens = ``min(max_new_tokens, ctx - budget)``, the prompt budget
      being ``min(max_prompt_tokens, ctx // 2)`` (SmolLM2, 8192 positions: 512 new tokens, prompts up to 1024;
      ``tiny-random``, 512 positions: 256 and 256);
    - given: ``max_new_tokens`` as it is.

    The prompt limit is then ``min(max_prompt_tokens, ctx - new tokens)``.
    Errors: ``ValueError`` when the new tokens leave no position for a prompt (given >= ``ctx``, or ``ctx`` < 2),
    naming the most that fits and the fix.
    """
    if ctx is None:
        return max_prompt_tokens, max_new_tokens
    budget = min(max_prompt_tokens, ctx // 2)
    new = min(max_new_tokens, ctx - budget) if fit else max_new_tokens
    limit = min(max_prompt_tokens, ctx - new)
    if limit < 1:
        most = f"at most {ctx - 1}, e.g. {ctx - budget} to keep {budget} tokens for the prompt" if ctx > 1 else "none"
        raise ValueError(f"{new} new tokens (--max-new-tokens, or rollout.max_new_tokens of --recipe) leave no room "
                         f"for a prompt in the model's {ctx}-token context (max_position_embeddings of its "
                         f"config.json): lower it ({most}), or leave --max-new-tokens out to fit it to the context")  # fmt: skip
    return limit, new
