"""rlvr: RL post-training of reasoning models against verifiable rewards.

Public API (the rest is implementation):

- :func:`load_recipe` (``rlvr.recipe``), :class:`Recipe`, :class:`RecipeError` (``rlvr.config``): recipes
- :func:`train`: run a recipe end to end (``rlvr.runtime.controller``); :func:`evaluate`: ``rlvr eval``
  (``rlvr.evaluate``)
- :func:`pass_at_k`: the unbiased pass@k estimator (``rlvr.metrics``)
- :func:`resolve_model`: embedded model names, local folders, hub ids (``rlvr.models``)
- :class:`Registry`, :class:`VerifyResult`, :class:`Completion`, :class:`Prompt`
- the registries ``ADVANTAGES``, ``CRITIC_ADVANTAGES``, ``POLICY_LOSSES``, ``LOSS_AGGREGATIONS``,
  ``KL_ESTIMATORS`` (``rlvr.algos``)
"""

from rlvr.algos import ADVANTAGES, CRITIC_ADVANTAGES, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES  # no torch yet
from rlvr.config import Recipe, RecipeError
from rlvr.recipe import load_recipe
from rlvr.metrics.passk import pass_at_k
from rlvr.registry import Registry
from rlvr.types import Completion, Prompt, VerifyResult

__version__ = "0.1.0"


def train(recipe, run_dir=None, executor=None):
    """Run a recipe end to end; see :func:`rlvr.runtime.controller.train`."""
    from rlvr.runtime.controller import train as _train

    return _train(recipe, run_dir, executor)


def evaluate(cfg):
    """Evaluate a model on data sets (pass@k, maj@k, mean@k with intervals); see :func:`rlvr.evaluate.evaluate`."""
    from rlvr.evaluate import evaluate as _evaluate

    return _evaluate(cfg)


def resolve_model(path: str) -> str:
    """A local model folder for ``path``; see :func:`rlvr.models.resolve_model`."""
    from rlvr.models import resolve_model as _resolve

    return _resolve(path)


__all__ = [
    "ADVANTAGES",
    "CRITIC_ADVANTAGES",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "Completion",
    "Prompt",
    "Recipe",
    "RecipeError",
    "Registry",
    "VerifyResult",
    "evaluate",
    "load_recipe",
    "pass_at_k",
    "resolve_model",
    "train",
]
