"""Advantage estimators: per-group rewards -> per-sample advantages, registered by name.

Every estimator has one signature, ``fn(rewards: Tensor [P, G], settings) -> Tensor [P, G]`` (float32, same
device), where ``settings`` is the entry's own frozen dataclass (registered with it; a recipe gives its fields,
``advantage: {name: passk, k: 4}``; :class:`rlvr.registry.NoSettings` for an entry without any), where P = prompts and G = samples per prompt (group size). Row ``p`` holds the G
samples of prompt ``p``; flatten with ``.reshape(-1)`` to get the [B] advantages of sequence ``p * G + g``.

Every statistic is taken over one group (a row), never over the whole batch (case A3), except in the two
REINFORCE++ estimators, whose paper normalises by batch statistics (said in their docstrings). A group with
one sample, or whose rewards are all equal, carries no signal: its advantages are exactly 0, never NaN (case
A2); ``reinforce_pp_global`` is the exception (its baseline is the batch).

The pass@k estimators (``passk``, ``pkpo``) take k from their settings and need binary (0/1) rewards.

Errors: ``ValueError`` when ``rewards`` is not 2-D or holds NaN/inf, and as each estimator documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlvr.lazy import lazy_module
from rlvr.registry import NoSettings, Registry

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.config import Recipe

torch = lazy_module("torch")  # imported on first use: loading a recipe resolves these settings without torch

# flags: needs_groups (compares the G samples of a prompt: G >= 2), binary_rewards (0/1 rewards: pass@k counts),
# needs_teacher (the teacher role's logprobs of the batch: rlvr.algos.distill), token_advantages (one per token)
ADVANTAGES: Registry = Registry("advantage estimator",
                                flags=("needs_groups", "binary_rewards", "needs_teacher", "token_advantages"))

STD_EPS = 1e-6
"""Added to the group's std before dividing (GRPO), so a near-constant group cannot explode."""


def _rewards_f32(rewards: Tensor) -> Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G] (prompts x samples per prompt), got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float32)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards hold NaN or inf; a verifier must return a finite score for every sample")
    return r


def _no_signal(r: Tensor) -> Tensor:
    """[P, 1] bool: True where the group's rewards are all equal (G = 1 included)."""
    return r.amax(dim=-1, keepdim=True) == r.amin(dim=-1, keepdim=True)


def _centred(r: Tensor) -> Tensor:
    """[P, G] rewards minus their group mean (normaliser: G, per group)."""
    return r - r.mean(dim=-1, keepdim=True)


@dataclass(frozen=True, kw_only=True)
class GRPOSettings:
    std_normalize: bool = True
    """Divide by the group's unbiased std (Shao et al. 2024, sec. 4.1.2); false: mean-centring only."""


@ADVANTAGES.register("grpo", settings=GRPOSettings, needs_groups=True)
def grpo(rewards: Tensor, cfg: GRPOSettings) -> Tensor:
    """GRPO outcome advantages (Shao et al. 2024, "DeepSeekMath", sec. 4.1.2).

    ``A[p, g] = (r[p, g] - mean_g r[p]) / (std_g r[p] + STD_EPS)`` when ``cfg.std_normalize``, with the
    group's UNBIASED std (normaliser G - 1); otherwise ``r[p, g] - mean_g r[p]`` (normaliser G).
    rewards: [P, G] -> advantages: [P, G] float32. Case A1: (1,1,1,0,0,0,0,0) -> +1.2076 / -0.7246.
    """
    r = _rewards_f32(rewards)
    adv = _centred(r)
    if cfg.std_normalize and r.shape[-1] > 1:
        adv = adv / (r.std(dim=-1, keepdim=True, correction=1) + STD_EPS)
    return torch.where(_no_signal(r), torch.zeros_like(adv), adv)


@ADVANTAGES.register("dr_grpo", needs_groups=True)
def dr_grpo(rewards: Tensor, cfg: NoSettings) -> Tensor:
    """Dr. GRPO advantages: mean-centring only, no std division (Liu et al. 2025, "Understanding R1-Zero-Like
    Training: A Critical Perspective", sec. 3.2); no settings.

    ``A[p, g] = r[p, g] - mean_g r[p]`` (normaliser G). Pair it with the ``seq_mean_token_sum_norm`` loss
    aggregation to remove the paper's length bias as well. rewards: [P, G] -> [P, G] float32.
    Case A1: (1,1,1,0,0,0,0,0) -> +0.625 / -0.375.
    """
    r = _rewards_f32(rewards)
    adv = _centred(r)
    return torch.where(_no_signal(r), torch.zeros_like(adv), adv)


@ADVANTAGES.register("rloo", needs_groups=True)
def rloo(rewards: Tensor, cfg: NoSettings) -> Tensor:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024, "Back to Basics", eq. 6).

    ``A[p, g] = r[p, g] - (sum_{j != g} r[p, j]) / (G - 1)``, which equals ``G / (G - 1) * (r - mean)``.
    G = 1 has no other sample to compare with: 0. rewards: [P, G] -> [P, G] float32.
    Case A1: (1,1,1,0,0,0,0,0) -> +0.7143 / -0.4286.
    """
    r = _rewards_f32(rewards)
    g = r.shape[-1]
    if g < 2:
        return torch.zeros_like(r)
    adv = _centred(r) * (g / (g - 1))
    return torch.where(_no_signal(r), torch.zeros_like(adv), adv)


# ------------------------------------------------------------------------------------------------------
# batch-normalised REINFORCE (REINFORCE++)


@ADVANTAGES.register("reinforce_pp", needs_groups=True)
def reinforce_pp(rewards: Tensor, cfg: NoSettings) -> Tensor:
    """REINFORCE++-baseline advantages (Hu 2025, "REINFORCE++", arXiv 2501.03262, sec. 3, the "-baseline"
    variant for several samples per prompt): subtract the GROUP mean, then normalise by the BATCH std.

    ``A'[p, g] = r[p, g] - mean_g r[p]`` (normaliser G, per group), then
    ``A = (A' - mean(A')) / (std(A') + STD_EPS)`` with mean and UNBIASED std over all B = P * G samples of
    the batch (normalisers B and B - 1); ``mean(A')`` is 0 up to rounding. The batch statistics are the one
    exception to "statistics per group" (case A3); they are taken over sequences, not tokens (OpenRLHF
    whitens over tokens, which weights long responses more). A group with equal rewards gets exactly 0
    (case A2), and so does every sample when B = 1 or all groups are constant.
    No settings. rewards: [P, G] -> [P, G] float32.
    Case A1 alone in the batch: +0.625 / -0.375 divided by their std 0.5175 -> +1.2076 / -0.7246.
    """
    r = _rewards_f32(rewards)
    flat_signal = _no_signal(r)
    centred = torch.where(flat_signal, torch.zeros_like(r), _centred(r))
    if centred.numel() < 2:
        return torch.zeros_like(r)
    flat = centred.reshape(-1)
    adv = (centred - flat.mean()) / (flat.std(correction=1) + STD_EPS)
    return torch.where(flat_signal, torch.zeros_like(adv), adv)


def _reinforce_pp_centred(r: Tensor) -> Tensor:
    """reinforce_pp before its batch normalisation: group-centred rewards, 0 for a group with equal rewards."""
    r = _rewards_f32(r)
    return torch.where(_no_signal(r), torch.zeros_like(r), _centred(r))


reinforce_pp.before_batch_norm = _reinforce_pp_centred  # type: ignore[attr-defined]


def normalise_token_advantages(adv: Tensor, mask: Tensor) -> Tensor:
    """REINFORCE++'s batch normalisation over tokens (Hu 2025, arXiv 2501.03262, sec. 3; OpenRLHF normalises
    ``A_t = r - beta * sum_{s>=t} KL_s`` after the KL is added): ``(A - mean) / (std + STD_EPS)`` with mean and
    UNBIASED std over the masked tokens of the whole batch (normalisers N and N - 1, N = response tokens),
    0 where masked. Fewer than 2 tokens, or all equal: 0. adv, mask: [B, T] -> [B, T] float32.
    Case (issue 9 item 3): beta 0.1, KL [[.3, .2], [0, .1]], r [1, 0] -> [[0.839, 0.893], [-0.866, -0.866]].
    """
    m = mask.float()
    n = m.sum()
    if n < 2:
        return torch.zeros_like(adv, dtype=torch.float32)
    mean = (adv * m).sum() / n
    var = (((adv - mean) * m) ** 2).sum() / (n - 1)
    if var == 0:
        return torch.zeros_like(adv, dtype=torch.float32)
    return ((adv - mean) / (var.sqrt() + STD_EPS) * m).float()


@ADVANTAGES.register("reinforce_pp_global")
def reinforce_pp_global(rewards: Tensor, cfg: NoSettings) -> Tensor:
    """REINFORCE++ advantages without a group baseline (Hu 2025, arXiv 2501.03262, sec. 3, global
    advantage normalisation; the per-token KL penalty of that section is :func:`rlvr.algos.kl.kl_as_reward`).

    ``A = (r - mean(r)) / (std(r) + STD_EPS)`` with mean and UNBIASED std over all B = P * G samples
    (normalisers B and B - 1). A solved prompt's samples are positive here: the baseline is the batch, not
    the group, so G = 1 is fine. All-equal batch (or B = 1): exactly 0. rewards: [P, G] -> [P, G] float32.
    """
    r = _rewards_f32(rewards)
    if r.numel() < 2 or bool(r.max() == r.min()):
        return torch.zeros_like(r)
    return (r - r.mean()) / (r.std(correction=1) + STD_EPS)


reinforce_pp_global.before_batch_norm = _rewards_f32  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------------
# pass@k objectives (binary rewards)


def _binary(r: Tensor, name: str) -> Tensor:
    """[P, 1] float64 count of correct samples per group; rewards must be exactly 0 or 1."""
    if not bool(((r == 0) | (r == 1)).all()):
        raise ValueError(
            f"advantage {name!r} is defined for binary rewards (0 or 1) only; got values such as "
            f"{sorted(set(r.flatten().tolist()) - {0.0, 1.0})[:3]}: use a verifier whose score is 0/1"
        )
    return r.to(torch.float64).sum(dim=-1, keepdim=True)


def _check_k(k: int, lo: int, hi: int, name: str, g: int) -> None:
    if not lo <= k <= hi:
        raise ValueError(
            f"advantage {name!r} needs {lo} <= algorithm.advantage.k <= {hi} for group size G = {g}, got k = {k}"
        )


@dataclass(frozen=True, kw_only=True)
class PassKSettings:
    k: int = 4
    """k of the pass@k objective: 1 <= k <= rollout.samples_per_prompt (k = 1 is GRPO with the population std)."""

    def min_group(self) -> int:
        """The fewest samples a group needs for this k (:func:`valid_advantages`)."""
        return self.k

    def errors(self, recipe: Recipe, where: str) -> list[str]:
        g = recipe.rollout.samples_per_prompt
        if 1 <= self.k <= g:
            return []
        return [f"{where}.k={self.k} must be in [1, rollout.samples_per_prompt={g}]: set {where}.k={min(max(self.k, 1), g)}"]


@dataclass(frozen=True, kw_only=True)
class PKPOSettings:
    k: int = 4
    """k of the pass@k objective (``loo_minus_one``: 2 <= k <= G; ``loo``: 1 <= k <= G - 1)."""
    baseline: Literal["loo_minus_one", "loo"] = "loo_minus_one"
    """Walder & Karkhanis 2025, sec. 4: ``loo_minus_one`` (their recommended k-1 estimator; needs k >= 2) or
    ``loo`` (leave-one-out pass@k of the other samples; needs k <= G - 1)."""

    def min_group(self) -> int:
        """The fewest samples a group needs for this k and baseline (:func:`valid_advantages`)."""
        return self.k + 1 if self.baseline == "loo" else self.k

    def errors(self, recipe: Recipe, where: str) -> list[str]:
        g, k = recipe.rollout.samples_per_prompt, self.k
        if self.baseline == "loo_minus_one" and not 2 <= k <= g:
            return [f"{where}: pkpo with baseline=loo_minus_one needs 2 <= k <= samples_per_prompt ({g}), got {k}: "
                    f"set {where}.k={min(max(k, 2), max(g, 2))}"
                    + (" (k = 1 has no baseline; use baseline=loo)" if k == 1 else "")]  # fmt: skip
        if self.baseline == "loo" and not 1 <= k <= g - 1:
            return [f"{where}: pkpo with baseline=loo needs 1 <= k <= samples_per_prompt - 1 ({g - 1}), got {k}: "
                    f"lower {where}.k or use baseline=loo_minus_one (allows k = G)"]  # fmt: skip
        return []


def comb_ratio(a: Tensor, b: int, k: int) -> Tensor:
    """``C(a, k) / C(b, k)`` as the product ``prod_{i=0}^{k-1} max(a - i, 0) / (b - i)`` (never a
    factorial or ``comb()`` float, so no overflow: every factor lies in [0, 1] when a <= b).

    a: any-shape float tensor of integers (a < k gives 0; k = 0 gives 1); b: int >= k. Same shape, float64.
    Errors: ``ValueError`` when b < k or k < 0.
    """
    if k < 0 or b < k:
        raise ValueError(f"comb_ratio needs 0 <= k <= b, got k = {k}, b = {b}")
    out = torch.ones_like(a, dtype=torch.float64)
    a64 = a.to(torch.float64)
    for i in range(k):
        out = out * (a64 - i).clamp(min=0.0) / (b - i)
    return out


@ADVANTAGES.register("passk", settings=PassKSettings, needs_groups=True, binary_rewards=True)
def passk(rewards: Tensor, cfg: PassKSettings) -> Tensor:
    """Analytic pass@k advantages (Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration
    and Exploitation of Large Reasoning Models", arXiv 2508.10751, sec. 3.3 "analytical derivation"), with
    k = ``cfg.k``, for binary rewards.

    Per group of N = G samples with N_neg incorrect: the mean pass@k reward over all k-subsets
    ``R = 1 - C(N_neg, k) / C(N, k)``, its std ``s = sqrt(R (1 - R))`` (population std of a 0/1 reward),
    ``A_pos = (1 - R) / s`` for correct samples and
    ``A_neg = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / s`` for incorrect ones.
    Sums to 0 over each group: N_neg * C(N_neg-1, k-1) / C(N-1, k-1) = N * C(N_neg, k) / C(N, k).
    k = 1 is GRPO with the POPULATION std (normaliser G): ``(r - mean) / sqrt(mean (1 - mean))``.
    s = 0 (no correct sample, or fewer than k incorrect so every k-subset passes): exactly 0.
    Ratios are products (:func:`comb_ratio`), computed in float64. rewards: [P, G] -> [P, G] float32.
    Case A1 (1,1,1,0,0,0,0,0): k = 2 -> +0.7454 / -0.4472; k = 4 -> +0.2774 / -0.1664.
    Errors: ``ValueError`` on non-binary rewards or k outside [1, G].
    """
    r = _rewards_f32(rewards)
    g, k = r.shape[-1], cfg.k
    _check_k(k, 1, g, "passk", g)
    n_neg = g - _binary(r, "passk")
    fail_all = comb_ratio(n_neg, g, k)  # 1 - R: share of k-subsets with no correct sample
    std = (fail_all * (1.0 - fail_all)).sqrt()
    safe = torch.where(std > 0, std, torch.ones_like(std))
    pos = fail_all / safe
    neg = (fail_all - comb_ratio(n_neg - 1, g - 1, k - 1)) / safe
    adv = torch.where(r == 1, pos, neg)
    return torch.where(std > 0, adv, torch.zeros_like(adv)).to(torch.float32)


@ADVANTAGES.register("pkpo", settings=PKPOSettings, needs_groups=True, binary_rewards=True)
def pkpo(rewards: Tensor, cfg: PKPOSettings) -> Tensor:
    """PKPO reward transform for binary rewards (Walder & Karkhanis 2025, "Pass@K Policy Optimization",
    arXiv 2505.15201), k = ``cfg.k``, with the baseline ``cfg.baseline``.

    With n = G samples, c correct and ``rho(n, c, k) = 1 - C(n - c, k) / C(n, k)`` (their unbiased pass@k,
    sec. 3 eq. 3), the unbaselined effective rewards (their Theorem 1) are ``s_i = k/n`` for a correct
    sample and ``s_i = (k/n) rho(n - 1, c, k - 1)`` for an incorrect one, i.e.
    ``s_i = (1 / C(n, k)) sum_{|I| = k, i in I} max_{j in I} r_j``. Baselines (sec. 4, variance reduction):

    ``loo_minus_one`` (their "k-1" estimator s^(loo-1), the one they recommend):
    ``s_i - (1 / C(n, k)) sum_{|I| = k, i in I} max_{j in I \\ i} r_j``. For binary rewards:
    correct ``(k/n) C(n - c, k - 1) / C(n - 1, k - 1)``, incorrect exactly 0. NOT zero-sum; needs k >= 2
    (k = 1 leaves no baseline: plain r / n).
    ``loo``: ``s_i - (k/n) rho(n - 1, c_{-i}, k)``, the pass@k estimate of the OTHER n - 1 samples on the
    scale k/n of ``s_i``. Correct ``(k/n) C(n - c, k) / C(n - 1, k)``, incorrect
    ``(k/n) (C(n - c - 1, k) / C(n - 1, k) - C(n - c - 1, k - 1) / C(n - 1, k - 1))``. Zero-sum per group
    (the mean of leave-one-out U-statistics is the U-statistic); k = 1 gives RLOO / n = (r - mean) / (G - 1).
    Needs k <= G - 1. (A published listing divides this baseline by n - 1 instead of scaling it by k/n,
    which gives non-zero advantages to a group of equal rewards; we keep the consistent scale.)

    Both are unbiased for grad pass@k (the baseline of sample i does not depend on sample i). Equal rewards
    give exactly 0. rewards: [P, G] -> [P, G] float32, computed in float64.
    Case A1 (1,1,1,0,0,0,0,0): loo_minus_one k = 2 -> +0.1786 / 0, k = 4 -> +0.1429 / 0;
    loo k = 2 -> +0.1190 / -0.0714, k = 4 -> +0.0714 / -0.0429.
    Errors: ``ValueError`` on non-binary rewards or k out of range for the baseline.
    """
    r = _rewards_f32(rewards)
    g, k = r.shape[-1], cfg.k
    n_neg = g - _binary(r, "pkpo")
    scale = k / g
    if cfg.baseline == "loo_minus_one":
        _check_k(k, 2, g, "pkpo (baseline=loo_minus_one)", g)
        pos = scale * comb_ratio(n_neg, g - 1, k - 1)
        neg = torch.zeros_like(pos)
    elif cfg.baseline == "loo":
        _check_k(k, 1, g - 1, "pkpo (baseline=loo)", g)
        pos = scale * comb_ratio(n_neg, g - 1, k)
        neg = scale * (comb_ratio(n_neg - 1, g - 1, k) - comb_ratio(n_neg - 1, g - 1, k - 1))
    else:
        raise ValueError(f"algorithm.advantage.baseline must be 'loo_minus_one' or 'loo', got {cfg.baseline!r}")
    adv = torch.where(r == 1, pos, neg)
    return torch.where(_no_signal(r), torch.zeros_like(adv), adv).to(torch.float32)


# ------------------------------------------------------------------------------------------------------
# groups with samples left out (infrastructure failures: rlvr.runtime.rollout_stage.infra_failed)


def per_valid_group(fn, rewards: Tensor, valid: Tensor, cfg, min_size: int = 1) -> Tensor:
    """``fn`` (an estimator's signature: ``[P', c] -> [P', c]``) applied to each group's VALID samples only, as if
    the invalid ones had never been drawn: the groups with c valid samples are stacked into one ``[P_c, c]`` call
    (so a per-group estimator gives exactly what it gives a group of c samples), and the results are put back in
    place. Invalid samples, and every sample of a group with fewer than ``min_size`` valid ones, get 0.
    rewards, valid: [P, G] (valid bool) -> [P, G] float32."""
    r = _rewards_f32(rewards)
    out = torch.zeros_like(r)
    counts = valid.sum(dim=-1)  # [P] valid samples per group
    for c in sorted(set(counts.tolist())):
        if c < max(min_size, 1):
            continue
        rows = (counts == c).nonzero().squeeze(-1)  # the groups with c valid samples, ascending
        pick = torch.zeros_like(valid)
        pick[rows] = valid[rows]
        out[pick] = fn(r[pick].view(len(rows), c), cfg).reshape(-1).to(torch.float32)  # row-major both ways
    return out


def valid_advantages(name: str, rewards: Tensor, valid: Tensor | None, cfg) -> Tensor:
    """The advantages of estimator ``name`` (:data:`ADVANTAGES`) for ``rewards`` [P, G] with the samples where
    ``valid`` [P, G] is False left out of every baseline and statistic, as if they had never been sampled; they get
    0 (their loss mask is zeroed too: :func:`rlvr.train.batch.pack`). ``valid`` None or all True: the estimator
    itself.

    - Per-group estimators (grpo, dr_grpo, rloo, passk, pkpo): each group over its c valid samples
      (:func:`per_valid_group`); GRPO's std has normaliser c - 1, RLOO's leave-one-out c - 1, pass@k counts over
      c. A group with fewer valid samples than the estimator needs (``cfg.min_group()``: k for passk and pkpo's
      loo_minus_one, k + 1 for pkpo's loo) gets 0: pass@k cannot be estimated from it.
    - The batch-normalised estimators (``before_batch_norm``: reinforce_pp, reinforce_pp_global): their first
      stage per group over the valid samples, then the batch normalisation (``reinforce_pp_global``'s
      ``(x - mean) / (std + STD_EPS)``, UNBIASED std) over the N valid samples of the batch (normalisers N and
      N - 1); reinforce_pp's groups whose valid rewards are all equal stay 0.

    rewards: [P, G], valid: [P, G] bool -> [P, G] float32. Errors: those of the estimator.
    Example (GRPO): rewards (1, 0, 0, 1) with the last invalid -> the group (1, 0, 0): mean 1/3, unbiased std
    0.5774 -> (+1.1547, -0.5774, -0.5774, 0).
    """
    fn = ADVANTAGES.get(name)
    if valid is None or bool(valid.all()):
        return fn(rewards, cfg)
    valid = valid.to(torch.bool)
    first = getattr(fn, "before_batch_norm", None)
    if first is None:
        min_group = getattr(cfg, "min_group", None)
        return per_valid_group(fn, rewards, valid, cfg, min_group() if callable(min_group) else 1)
    stage = per_valid_group(lambda x, _: first(x), rewards, valid, None)  # [P, G], 0 where invalid
    out = torch.zeros_like(stage)
    out[valid] = reinforce_pp_global(stage[valid].unsqueeze(0), NoSettings()).squeeze(0)  # over the N valid
    if ADVANTAGES.flag(name, "needs_groups"):  # reinforce_pp: a group whose valid rewards are equal carries nothing
        r = _rewards_f32(rewards)
        hi = torch.where(valid, r, torch.full_like(r, -torch.inf)).amax(dim=-1, keepdim=True)
        lo = torch.where(valid, r, torch.full_like(r, torch.inf)).amin(dim=-1, keepdim=True)
        out = torch.where(hi == lo, torch.zeros_like(out), out)
    return out
