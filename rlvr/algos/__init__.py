"""The pure math of a training step: advantages, policy losses, loss aggregations, KL estimators, logprobs.

Each extension point is one :class:`rlvr.registry.Registry`; a recipe names an entry, with its own settings where
it has any (``advantage: {name: passk, k: 4}``, ``policy_loss: {name: ppo_clip, clip_high: 0.28}``,
``loss_agg: token_mean``, ``kl_estimator: k3``).

Every module of this package is imported here (:func:`_import_all`), so a new estimator is one new module that
registers itself (see README, "Add an advantage estimator"); these modules import torch on first use only
(:mod:`rlvr.lazy`), so loading a recipe stays light.
"""

import importlib
import pkgutil

from rlvr.algos.advantages import ADVANTAGES
from rlvr.algos.gae import CRITIC_ADVANTAGES
from rlvr.algos.kl import KL_ESTIMATORS
from rlvr.algos.logprobs import entropy_from_logits, logprobs_and_entropy, masked_mean, response_mask, token_logprobs
from rlvr.algos.losses import LOSS_AGGREGATIONS, POLICY_LOSSES


ENTRY_POINT_GROUP = "rlvr.algos"
"""Entry-point group of third-party packages' algorithm modules: ``[project.entry-points."rlvr.algos"]`` with
``my_estimators = "my_pkg.estimators"`` makes every process that loads the registries (the driver and each Ray
worker alike) import ``my_pkg.estimators``, which registers its entries as the built-in modules do."""


def _import_all() -> None:
    """Import every module of this package, then every module of the ``rlvr.algos`` entry points (each registers
    its entries). Errors: a plugin module that fails to import raises ``ImportError`` naming its entry point."""
    from importlib.metadata import entry_points

    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:
            raise ImportError(f"rlvr.algos plugin {ep.name!r} ({ep.value}) failed to import: {e}") from e


_import_all()

__all__ = [
    "ADVANTAGES",
    "CRITIC_ADVANTAGES",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "entropy_from_logits",
    "logprobs_and_entropy",
    "masked_mean",
    "response_mask",
    "token_logprobs",
]
