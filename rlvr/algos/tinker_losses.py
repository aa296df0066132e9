"""The Tinker API's built-in losses (``TrainingClient.forward_backward(data, loss_fn, loss_fn_config)``), one datum
at a time, for ``rlvr serve`` (issue 43): the server computes ``target_logprobs`` with the model and calls
:func:`tinker_loss`; Tinker SDK 0.38.0 names seven built-ins (``tinker.types.LossFnType``, less ``custom``).

Sources: Tinker's loss docs, https://tinker-docs.thinkingmachines.ai/tinker/losses/ (one page per loss:
``/losses/ppo``, ``/losses/cispo``, ``/losses/dro``, ``/losses/gspo``, ``/losses/stable-reinforce``; the older
single page https://tinker-docs.thinkingmachines.ai/losses), the cookbook's ``tutorials/202_loss_functions.py``
(the PPO and CISPO defaults) and the SDK (``types/datum.py``: the input keys and their dtypes).

Dimensions and units. N = ``model_input.length`` = positions of the datum; position i predicts
``target_tokens[i]`` (the full sequence shifted by one). ``target_logprobs`` [N]: log p_theta(target_tokens[i]) in
nats, with gradient. Every ``loss_fn_inputs`` tensor has shape [N]: ``target_tokens`` int64, the others float
(``logprobs`` = log q, the SAMPLER's logprobs of the same tokens, nats; ``advantages``; ``weights``;
``sequence_ratio_mask``). ``cross_entropy`` and ``importance_sampling`` also take [N, K] (K targets per position,
"multi-target" in Tinker's docs), with ``target_logprobs`` [N, K] and every input [N, K].

Normaliser. Every Tinker loss is a SUM over positions (no division by token or sequence counts: "for all
objectives we sum the token-level losses over the sequence length"; to average, scale the advantages or
weights). The datum's loss is its share of the request's loss: the request's loss and its gradient are the sums
over its datums. Positions a loss should not train carry advantage 0 (RL losses) or weight 0 (``cross_entropy``);
``dro``'s penalty has no such switch (it applies at every position, as on Tinker: tinker-cookbook issue 907).

Outputs. ``loss_fn_outputs`` per datum: ``{"logprobs": target_logprobs}`` (detached) for every loss; the server
builds it. Metrics (``ForwardBackwardOutput.metrics``): ``{"loss:sum": the loss value}``; the suffix names the
reduction (the SDK's ``chunked_fwdbwd_helpers.REDUCE_MAP``): the request's value is the SUM of its datums'.

The seven, with r = exp(target_logprobs - logprobs) (the per-token importance ratio p_theta / q):

==================== ================================================= =====================================
loss                 loss of one datum (sum over positions t)          loss_fn_config (default)
==================== ================================================= =====================================
cross_entropy        ``-sum w_t lp_t``                                 none
importance_sampling  ``-sum r_t A_t``                                  none
ppo                  ``-sum min(r_t A_t, clip(r_t, lo, hi) A_t)``      clip_low_threshold (0.8),
                                                                       clip_high_threshold (1.2)
cispo                ``-sum sg(clip(r_t, lo, hi)) lp_t A_t``           clip_low_threshold (0.0),
                                                                       clip_high_threshold (4.0)
dro                  ``-sum (lp_t A_t - beta/2 (lp_t - q_t)^2)``       beta (0.05, see :data:`CONFIG_DEFAULTS`)
gspo                 ppo with r_t = sg(s) exp(lp_t - sg(lp_t)),        clip_low_threshold (1 - 3e-4),
                     ``s = exp(mean_{t in M}(lp_t - q_t))``            clip_high_threshold (1 + 4e-4)
stable_reinforce     not supported here (ValueError, see below)        kl_coeff (Tinker's; unknown default)
==================== ================================================= =====================================

``lo`` / ``hi`` are ABSOLUTE ratio thresholds (Tinker: ``torch.clamp(prob_ratio, clip_low_threshold,
clip_high_threshold)``), not rlvr's ``1 - clip_low`` / ``1 + clip_high``: ``{"clip_low_threshold": 0.8}`` is rlvr's
``clip_low: 0.2``. sg = stop-gradient. M = positions where ``sequence_ratio_mask != 0``.

One home per formula. ``ppo`` is rlvr's :func:`rlvr.algos.losses.ppo_clip` (token advantages [1, N], mask all
ones, ``clip_low = 1 - lo``, ``clip_high = hi - 1``), ``cispo`` is :func:`rlvr.algos.losses.cispo` (same mapping),
``gspo`` is ``ppo_clip`` again with ``old_logprobs = sg(lp) - sg(log s)`` (so the ratio's value is s and its
gradient that of p_theta(x_t): Tinker's GSPO-token), ``dro``'s penalty is ``beta * k2`` with
:func:`rlvr.algos.kl.k2` (``0.5 (log r)^2``), and every sum is the ``seq_mean_token_sum`` aggregation over one
sequence (:func:`rlvr.algos.losses.seq_mean_token_sum`, num_seqs = 1). Where the result differs from Tinker's
code: rlvr clamps a log-ratio to +-``LOG_RATIO_CLAMP`` (20 nats) before ``exp``, so in ``ppo`` and ``gspo`` a
token with |log r| > 20 has r = e^+-20 and no gradient (Tinker: the exact r, and in ``ppo`` a token with A < 0 and
log r > 20 keeps its gradient ``-A r``); in ``cispo`` such a token's weight is ``clip(e^+-20)``. No realistic
datum is affected (e^20 = 4.9e8). ``importance_sampling``'s r is not clamped (as on Tinker; rlvr has no
unclipped ratio loss to reuse: ``ppo_clip`` would clamp it), nor is anything in ``cross_entropy`` or ``dro``.
rlvr's own ``gspo`` is not reused: it takes one advantage per sequence and gives every token the gradient of
the sequence ratio (the paper's sequence-level GSPO), where Tinker's is per-token (GSPO-token, Zheng et al. 2025,
sec. 4.3) with per-token advantages; ``ppo_clip`` fed the shifted ``old_logprobs`` is exactly GSPO-token.

Papers: PPO Schulman et al. 2017 (arXiv 1707.06347, eq. 7); CISPO MiniMax 2025 ("MiniMax-M1", arXiv 2506.13585,
sec. 3.1) and Khatri et al. 2025 (ScaleRL, arXiv 2510.13786); DRO Richemond et al. 2024 (arXiv 2405.19107) and
Kimi Team 2025 (arXiv 2501.12599); GSPO Zheng et al. 2025 (arXiv 2507.18071).

Where Tinker's docs are silent (the choices made, each a ``CONFIG_DEFAULTS`` value or a check below):

- ``dro``'s default ``beta``: the docs show only ``{"beta": 0.05}`` under "Custom beta"; 0.05 is used.
- ``gspo``'s default thresholds: the page's text stops at ``clipped_ratio =``; the paper's ranges
  (eps_low 3e-4, eps_high 4e-4, sec. 5.1; rlvr's ``GSPOSettings``) are used, as absolute thresholds.
- ``gspo`` without ``sequence_ratio_mask``: refused (the ratio is defined over it; the SDK knows the key); a mask
  with no non-zero entry is refused too (Tinker's ``[in_ratio].mean()`` would give NaN).
- ``stable_reinforce``: its objective uses stability information that Tinker's sampler records at sampling time
  (``record_stability_info=True``) and that a datum names through its provenance spans (``sequence_id``); the
  formula is not in the docs this was written from, and neither that information nor the spans reach this
  function, so it raises ``ValueError`` (the server can offer ``ppo``, ``cispo`` or ``importance_sampling``).
- Extra ``loss_fn_inputs`` keys are refused (Tinker's server refuses them: ``DROLossExtraArgs.__init__() got an
  unexpected keyword argument 'weights'``, tinker-cookbook issue 907), as are unknown ``loss_fn_config`` keys,
  string or non-finite config values, ``clip_low_threshold > clip_high_threshold``, ``beta < 0`` and non-finite
  float inputs (the docs say nothing of these; each would otherwise train on a silently wrong or NaN loss).
- ``custom``: a ``forward_backward_custom`` runs client-side (the SDK's ``forward``, then ``forward_backward``
  with ``cross_entropy`` on the loss's gradients), so a server never sees it; ``custom`` with a ``loss_id`` (a loss
  uploaded with ``ServiceClient.create_custom_loss``) is not supported here: ``ValueError``.

Errors: ``ValueError`` naming the loss, the key and the fix, for each case above and for an unknown loss name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

from rlvr.algos.kl import k2
from rlvr.algos.losses import CISPOSettings, PPOClipSettings, cispo, ppo_clip, seq_mean_token_sum
from rlvr.lazy import lazy_module

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_module("torch")

TINKER_LOSSES: tuple[str, ...] = (
    "cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce",
)
"""Tinker's built-in losses (SDK 0.38.0 ``LossFnType`` less ``custom``); ``stable_reinforce`` raises (module doc)."""

_RL = ("target_tokens", "logprobs", "advantages")
_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": _RL,
    "ppo": _RL,
    "cispo": _RL,
    "dro": _RL,
    "gspo": _RL + ("sequence_ratio_mask",),
}
_MULTI_TARGET = ("cross_entropy", "importance_sampling")  # [N, K] inputs allowed (Tinker's multi-target)
_WHAT = {
    "target_tokens": "int64 token ids",
    "weights": "float per-position loss weights, 0 on prompt positions",
    "logprobs": "float sampling logprobs log q of target_tokens, nats",
    "advantages": "float per-position advantages, 0 on positions not to train",
    "sequence_ratio_mask": "float, non-zero on the positions the sequence ratio averages over",
}

CONFIG_DEFAULTS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},  # Tinker's (tutorial 202, eps 0.2)
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},  # Tinker's (tutorial 202): one-sided
    "dro": {"beta": 0.05},  # the docs' only value ("Custom beta"); no default is stated
    "gspo": {"clip_low_threshold": 1.0 - 3e-4, "clip_high_threshold": 1.0 + 4e-4},  # the paper's, sec. 5.1
}
"""Each loss's ``loss_fn_config`` keys with the values used when the request omits them."""

_STABLE_REINFORCE = (
    "loss 'stable_reinforce' is not supported by this server: its objective uses stability information that "
    "Tinker's sampler records at sampling time (record_stability_info=True) and that a datum names through its "
    "provenance spans (sequence_id); this server's sampler records none, and Tinker does not publish the formula. "
    "Use 'ppo', 'cispo' or 'importance_sampling' (off-policy corrections with the sampling logprobs) instead"
)
_CUSTOM = (
    "loss 'custom' is not a built-in loss: forward_backward_custom(data, fn) runs fn client-side (the SDK calls "
    "forward, runs fn on the logprobs, then forward_backward with 'cross_entropy' weighted by the gradients), so "
    "call it with a Python function; a loss uploaded with ServiceClient.create_custom_loss (a loss_id) is not "
    "supported by this server"
)


POSITIONWISE: frozenset[str] = frozenset({"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"})
"""Losses whose sum is one term per position, each depending on that position alone: several datums' [N_i]
inputs end to end ([sum N_i]) give the sum of their losses in one call. Not ``gspo``: its sequence ratio is a
mean over the datum's positions."""


def trained_positions(name: str, inputs: Mapping[str, Tensor]) -> Tensor:
    """[N] bool: the positions whose term can have a non-zero gradient with respect to ``target_logprobs`` (the
    others' terms are 0 or constant: the trainer may compute their logprobs without gradient). ``cross_entropy``:
    weight != 0; ``importance_sampling``, ``ppo``, ``cispo``, ``gspo``: advantage != 0 (each position's gradient is
    its advantage times a factor; gspo's sequence ratio enters detached); ``dro``: every position (its penalty
    beta/2 (lp - q)^2 applies where the advantage is 0). Multi-target [N, K] inputs: a position is trained when any
    of its K is. Errors: ``ValueError`` as :func:`required_inputs`."""
    key = {"cross_entropy": "weights", "dro": None}.get(_known(name), "advantages")
    n = inputs["target_tokens"].shape[0]
    if key is None:
        return torch.ones(n, dtype=torch.bool)
    nz = inputs[key] != 0
    return nz.reshape(n, -1).any(dim=1)


def _known(name: str) -> str:
    """``name`` if this module computes it, else ``ValueError`` (stable_reinforce, custom, unknown)."""
    if name == "stable_reinforce":
        raise ValueError(_STABLE_REINFORCE)
    if name == "custom":
        raise ValueError(_CUSTOM)
    if name not in _INPUTS:
        raise ValueError(f"unknown loss {name!r}: Tinker's built-in losses are {', '.join(TINKER_LOSSES)}")
    return name


def required_inputs(name: str) -> tuple[str, ...]:
    """The ``loss_fn_inputs`` keys loss ``name`` takes, all required and no others: ``cross_entropy``
    (target_tokens, weights); ``importance_sampling``, ``ppo``, ``cispo``, ``dro`` (target_tokens, logprobs,
    advantages); ``gspo`` (those and sequence_ratio_mask). Errors: ``ValueError`` as :func:`tinker_loss` for
    ``stable_reinforce``, ``custom`` and unknown names."""
    return _INPUTS[_known(name)]


def _check_inputs(name: str, target_logprobs: Tensor, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Validate the datum's tensors; return the float inputs (all but target_tokens) in target_logprobs' dtype."""
    dims = (1, 2) if name in _MULTI_TARGET else (1,)
    shape = "[N] or [N, K]" if name in _MULTI_TARGET else "[N]"
    if not isinstance(target_logprobs, torch.Tensor) or not target_logprobs.is_floating_point() \
            or target_logprobs.dim() not in dims:
        raise ValueError(f"loss {name!r}: target_logprobs must be a float tensor {shape} (log p of target_tokens), "
                         f"got {target_logprobs!r:.80}")
    if not isinstance(inputs, Mapping):
        raise ValueError(f"loss {name!r}: loss_fn_inputs must be a dict of tensors, got {type(inputs).__name__}")
    takes = _INPUTS[name]
    for key in takes:
        if key not in inputs:
            raise ValueError(f"loss {name!r}: loss_fn_inputs lacks {key!r} ({shape} {_WHAT[key]}); "
                             f"{name} takes {', '.join(takes)}")
    for key in inputs:
        if key not in takes:
            raise ValueError(f"loss {name!r}: loss_fn_inputs has {key!r}, which {name} does not take "
                             f"(it takes {', '.join(takes)}): remove it")
    out: dict[str, Tensor] = {}
    for key in takes:
        t = inputs[key]
        if not isinstance(t, torch.Tensor) or t.shape != target_logprobs.shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"loss {name!r}: loss_fn_inputs[{key!r}] has shape {got}, expected "
                             f"{tuple(target_logprobs.shape)}: one value per position, as target_tokens")
        if key == "target_tokens":
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise ValueError(f"loss {name!r}: loss_fn_inputs['target_tokens'] must hold int64 token ids, "
                                 f"got dtype {t.dtype}")
            continue
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"loss {name!r}: loss_fn_inputs[{key!r}] has a non-finite value (nan or inf); "
                             f"every position needs a finite {_WHAT[key]}")
        out[key] = t.to(target_logprobs.dtype)
    if name == "gspo" and not bool((out["sequence_ratio_mask"] != 0).any()):
        raise ValueError("loss 'gspo': loss_fn_inputs['sequence_ratio_mask'] marks no position; the sequence ratio "
                         "is the mean log-ratio over its non-zero positions: mark the sampled (completion) tokens")
    return out


def _config(name: str, config: Mapping[str, Any] | None) -> dict[str, float]:
    """The loss's config: :data:`CONFIG_DEFAULTS` overridden by ``config``; ``ValueError`` on a bad key or value."""
    cfg = dict(CONFIG_DEFAULTS[name])
    if config is None:
        return cfg
    if not isinstance(config, Mapping):
        raise ValueError(f"loss {name!r}: loss_fn_config must be a dict of numbers, got {type(config).__name__}")
    for key, value in config.items():
        if key not in cfg:
            takes = ", ".join(f"{k} (default {v})" for k, v in CONFIG_DEFAULTS[name].items()) or "no config"
            raise ValueError(f"loss {name!r}: unknown loss_fn_config key {key!r}; {name} takes {takes}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"loss {name!r}: loss_fn_config[{key!r}] must be a finite number, got {value!r}")
        cfg[key] = float(value)
    if "beta" in cfg and cfg["beta"] < 0:
        raise ValueError(f"loss {name!r}: loss_fn_config['beta'] must be >= 0 (the weight of the quadratic "
                         f"penalty), got {cfg['beta']}")
    if "clip_low_threshold" in cfg and cfg["clip_low_threshold"] > cfg["clip_high_threshold"]:
        raise ValueError(f"loss {name!r}: clip_low_threshold {cfg['clip_low_threshold']} exceeds clip_high_threshold "
                         f"{cfg['clip_high_threshold']}; they are absolute ratio bounds (e.g. 0.8 and 1.2)")
    return cfg


def _row(t: Tensor) -> Tensor:
    """[N] -> [1, N]: one datum as rlvr's [B, T] batch of one sequence."""
    return t.reshape(1, -1)


def _sum(token_loss: Tensor) -> Tensor:
    """The sum over every position: rlvr's ``seq_mean_token_sum`` aggregation over one sequence (num_seqs 1;
    it reads neither num_tokens nor max_len, both given as the datum's size)."""
    rows = _row(token_loss)
    everything = torch.ones_like(rows, dtype=torch.bool)
    return seq_mean_token_sum(rows, everything, num_tokens=rows.numel(), num_seqs=1, max_len=rows.numel())


def _rlvr_policy_loss(fn: Callable, lp: Tensor, old: Tensor, adv: Tensor, settings: Any) -> Tensor:
    """rlvr's per-token policy loss ``fn`` on the datum as one sequence, every position in the mask, no TIS:
    [1, N] token losses (token advantages [1, N])."""
    token_loss, _stats = fn(_row(lp), _row(old), _row(adv), torch.ones_like(_row(lp), dtype=torch.bool), settings)
    return token_loss


def _cross_entropy(lp: Tensor, x: dict[str, Tensor], cfg: dict[str, float]) -> Tensor:
    """``-w_t lp_t``: the negative log-likelihood, weighted (https://tinker-docs.thinkingmachines.ai/losses)."""
    return -lp * x["weights"]


def _importance_sampling(lp: Tensor, x: dict[str, Tensor], cfg: dict[str, float]) -> Tensor:
    """``-r_t A_t`` with ``r_t = exp(lp_t - q_t)``, unclipped and unclamped (Tinker's ``importance_sampling``)."""
    return -torch.exp(lp - x["logprobs"]) * x["advantages"]


def _ppo(lp: Tensor, x: dict[str, Tensor], cfg: dict[str, float]) -> Tensor:
    """``-min(r A, clip(r, lo, hi) A)``: rlvr's ``ppo_clip`` with ``clip_low = 1 - lo``, ``clip_high = hi - 1``."""
    settings = PPOClipSettings(clip_low=1.0 - cfg["clip_low_threshold"], clip_high=cfg["clip_high_threshold"] - 1.0)
    return _rlvr_policy_loss(ppo_clip, lp, x["logprobs"], x["advantages"], settings)


def _cispo(lp: Tensor, x: dict[str, Tensor], cfg: dict[str, float]) -> Tensor:
    """``-sg(clip(r, lo, hi)) lp A``: rlvr's ``cispo`` with ``clip_low = 1 - lo``, ``clip_high = hi - 1``."""
    settings = CISPOSettings(clip_low=1.0 - cfg["clip_low_threshold"], clip_high=cfg["clip_high_threshold"] - 1.0)
    return _rlvr_policy_loss(cispo, lp, x["logprobs"], x["advantages"], settings)


def _dro(lp: Tensor, x: dict[str, Tensor], cfg: dict[str, float]) -> Tensor:
    """``-(lp A - beta/2 (lp - q)^2)`` = ``-(lp A - beta k2)`` with rlvr's ``k2 = (log r)^2 / 2``."""
    return -(lp * x["advantages"] - cfg["beta"] * k2(lp, x["logprobs"]))


def _gspo(lp: Tensor, x: dict[str, Tensor], cfg: dict[str, float]) -> Tensor:
    """GSPO-token: ppo with every position's ratio worth ``s = exp(mean_{t in M}(lp_t - q_t))`` (detached) and
    carrying the gradient of its own ``lp_t``; fed to ``ppo_clip`` as ``old = sg(lp) - sg(log s)``."""
    in_ratio = x["sequence_ratio_mask"] != 0
    log_s = (lp.detach() - x["logprobs"])[in_ratio].mean()
    return _ppo(lp, {"logprobs": lp.detach() - log_s, "advantages": x["advantages"]}, cfg)


_TOKEN_LOSSES: dict[str, Callable[[Tensor, dict[str, Tensor], dict[str, float]], Tensor]] = {
    "cross_entropy": _cross_entropy,
    "importance_sampling": _importance_sampling,
    "ppo": _ppo,
    "cispo": _cispo,
    "dro": _dro,
    "gspo": _gspo,
}


def tinker_loss(
    name: str, target_logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float] | None
) -> tuple[Tensor, dict[str, float]]:
    """One datum's loss under Tinker's built-in loss ``name`` (formulas, defaults, sources: the module doc).

    ``target_logprobs``: [N] float (or [N, K] for ``cross_entropy`` and ``importance_sampling``), log p_theta of
    ``inputs["target_tokens"]`` in nats, with gradient. ``inputs``: the datum's ``loss_fn_inputs``, exactly
    :func:`required_inputs` ``(name)``, each of target_logprobs' shape (``target_tokens`` int64, the rest float).
    ``config``: the request's ``loss_fn_config`` (None: :data:`CONFIG_DEFAULTS`; a key it omits keeps its default).

    Returns ``(loss, metrics)``: ``loss`` a 0-dim tensor, the SUM over the datum's positions (nats-weighted by
    advantages or weights; not divided by N), to call ``backward`` on; the request's loss is the sum over its
    datums. ``metrics`` = ``{"loss:sum": float(loss)}``: this datum's contribution; combine datums by adding.
    Errors: ``ValueError`` naming the loss, the bad key and the fix (module doc).
    """
    name = _known(name)
    x = _check_inputs(name, target_logprobs, inputs)
    cfg = _config(name, config)
    loss = _sum(_TOKEN_LOSSES[name](target_logprobs, x, cfg))
    return loss, {"loss:sum": float(loss.detach())}
