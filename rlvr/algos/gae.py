"""PPO with a learned critic: token rewards, generalized advantage estimation, the clipped value loss.

Estimators that need a value model live in their own registry, :data:`CRITIC_ADVANTAGES`, with one signature:
``fn(token_rewards [B, T], values [B, T], mask [B, T], settings) -> (advantages [B, T], returns [B, T])``, where
B = sequences (prompts x samples) and T = positions of the shifted frame of :class:`rlvr.train.batch.TrainBatch`
(position t scores the token ``input_ids[:, t + 1]``; ``values[b, t]`` is V of the state before that token).
``algorithm.advantage`` names an entry of this registry or of :data:`rlvr.algos.advantages.ADVANTAGES`; the step
loop starts a critic when the name is in this one.

Errors: ``ValueError`` on mismatched shapes, NaN/inf inputs, or settings out of range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.lazy import lazy_module
from rlvr.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.config import Recipe

torch = lazy_module("torch")  # imported on first use: loading a recipe resolves these settings without torch

CRITIC_ADVANTAGES: Registry = Registry("critic advantage estimator", flags=("token_advantages",))

WHITEN_EPS = 1e-8
"""Added to the std before dividing when whitening advantages."""


def _check(mask: Tensor, **tensors: Tensor) -> None:
    for name, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [B, T] = {tuple(mask.shape)} like the mask")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} holds NaN or inf")


def outcome_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's outcome reward on its last response token (the eos, if any; case R3), 0 elsewhere.

    rewards: [B] (reward units); mask: [B, T] (1 on response positions, contiguous) -> [B, T] float32.
    A sequence with an empty response (no position in the mask) gets no reward anywhere.
    Errors: ``ValueError`` when B differs.
    """
    if rewards.dim() != 1 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(f"rewards must be [B] = [{mask.shape[0]}], got {tuple(rewards.shape)}")
    m = mask.float()
    t = m.shape[1]
    # index of the last 1 in each row: the highest position whose mask is set
    pos = torch.arange(t, dtype=torch.float32).expand_as(m)
    last = torch.where(m > 0, pos, torch.full_like(pos, -1.0)).amax(dim=1).long()  # [B], -1 when empty
    out = torch.zeros_like(m)
    has = last >= 0
    out[has.nonzero(as_tuple=True)[0], last[has]] = rewards.float()[has]
    return out


def gae_advantages(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv 1506.02438, eq. 16) over response tokens.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` with ``V`` after the last response token = 0 (the episode ends);
    ``A_t = sum_l (gamma * lam)^l delta_{t+l}``, accumulated backwards over the masked positions only (prompt and
    padding positions are skipped, so a left offset of the response does not matter); returns ``R_t = A_t + V_t``
    (the critic's regression target, the lambda-return). With gamma = lam = 1, ``A_t = sum_{s>=t} r_s - V_t``.
    token_rewards, values, mask: [B, T] -> (advantages [B, T], returns [B, T]) float32, 0 where masked.
    Errors: ``ValueError`` on shape mismatch, NaN/inf, or gamma/lam outside [0, 1].
    """
    _check(mask, token_rewards=token_rewards, values=values)
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma ({gamma}) and lam ({lam}) must be in [0, 1]")
    m = mask.float()
    r, v = token_rewards.float() * m, values.float() * m
    b, t = m.shape
    adv = torch.zeros_like(m)
    next_v = torch.zeros(b)
    running = torch.zeros(b)
    for i in range(t - 1, -1, -1):
        on = m[:, i] > 0
        delta = r[:, i] + gamma * next_v - v[:, i]
        running = torch.where(on, delta + gamma * lam * running, running)
        adv[:, i] = torch.where(on, running, torch.zeros_like(running))
        next_v = torch.where(on, v[:, i], next_v)
    return adv, (adv + v) * m


def whiten(advantages: Tensor, mask: Tensor) -> Tensor:
    """Shift and scale to mean 0 and std 1 over the masked tokens of the whole batch (normaliser: the batch's
    response-token count; population std), 0 where masked. Standard PPO practice (OpenRLHF, verl ``masked_whiten``).
    A batch whose masked advantages are all equal becomes all 0. advantages, mask: [B, T] -> [B, T] float32.
    """
    _check(mask, advantages=advantages)
    m = mask.float()
    n = m.sum().clamp(min=1.0)
    mean = (advantages * m).sum() / n
    var = (((advantages - mean) * m) ** 2).sum() / n
    return (advantages - mean) * torch.rsqrt(var + WHITEN_EPS) * m


@dataclass(frozen=True, kw_only=True)
class GAESettings:
    gamma: float = 1.0
    """Discount per token (verl and OpenRLHF default 1.0 for LLMs)."""
    lam: float = 0.95
    """GAE lambda (Schulman et al. 2016, eq. 16); OpenRLHF's default 0.95, verl's 1.0."""
    whiten: bool = True
    """Normalise token advantages to mean 0, std 1 over the batch's response tokens (PPO practice)."""

    def errors(self, recipe: Recipe, where: str) -> list[str]:
        if 0 <= self.gamma <= 1 and 0 <= self.lam <= 1:
            return []
        return [f"{where}.gamma ({self.gamma}) and {where}.lam ({self.lam}) must be in [0, 1]"]


@CRITIC_ADVANTAGES.register("gae", settings=GAESettings, token_advantages=True)
def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, cfg: GAESettings) -> tuple[Tensor, Tensor]:
    """PPO's advantages from a learned critic (Ouyang et al. 2022 / Schulman et al. 2017 with GAE):
    :func:`gae_advantages` with ``cfg.gamma`` and ``cfg.lam``, then :func:`whiten` when
    ``cfg.whiten`` (the returns are taken before whitening).
    token_rewards, values, mask: [B, T] -> (advantages [B, T], returns [B, T]) float32.
    """
    adv, ret = gae_advantages(token_rewards, values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten:
        adv = whiten(adv, mask)
    return adv, ret


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss per token (the PPO2 baselines form; OpenRLHF ``ValueLoss``, verl
    ``compute_value_loss``): ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2)``; with
    ``clip = 0`` the plain ``0.5 * (V - R)^2``. Unmasked and unreduced: reduce with a loss aggregation, which names
    the normaliser. Returns (token loss [B, T], stats: ``value_clip_frac`` [B, T] where the clipped term is the larger).
    values (with grad), old_values (at rollout time), returns, mask: [B, T]. Errors: ``ValueError`` on shapes, clip < 0.
    """
    if clip < 0:
        raise ValueError(f"value clip must be >= 0, got {clip}")
    for name, t in (("values", values), ("old_values", old_values), ("returns", returns)):
        if t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [B, T] = {tuple(mask.shape)}")
    plain = (values - returns) ** 2
    if clip == 0:
        return 0.5 * plain, {"value_clip_frac": torch.zeros_like(plain)}
    clipped_v = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (clipped_v - returns) ** 2
    return 0.5 * torch.maximum(plain, clipped), {"value_clip_frac": (clipped > plain).float()}
