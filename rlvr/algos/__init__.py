"""The pure math of a training step: advantages, policy losses, loss aggregations, KL estimators, logprobs.

Each extension point is one :class:`rlvr.registry.Registry`; recipes name entries by string
(``algorithm.advantage``, ``algorithm.policy_loss``, ``algorithm.loss_agg``, ``algorithm.kl_estimator``).
"""

from rlvr.algos.advantages import ADVANTAGES
from rlvr.algos.gae import CRITIC_ADVANTAGES
from rlvr.algos.kl import KL_ESTIMATORS
from rlvr.algos.logprobs import entropy_from_logits, masked_mean, response_mask, token_logprobs
from rlvr.algos.losses import LOSS_AGGREGATIONS, POLICY_LOSSES

__all__ = [
    "ADVANTAGES",
    "CRITIC_ADVANTAGES",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "entropy_from_logits",
    "masked_mean",
    "response_mask",
    "token_logprobs",
]
