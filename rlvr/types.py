"""Data passed between the roles of a training step.

Dimension names used in docstrings across rlvr:
    P = prompts in a step, G = samples per prompt (group size), B = P x G sequences,
    T = tokens (padded) of a response, L = tokens of a prompt, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """One training or evaluation problem after templating.

    ``prompt_ids``: [L] token ids of the fully templated prompt (chat template applied).
    ``gold``: the gold answer as text; ``row``: the other fields of the data row (given to verifiers).
    ``index``: position of the row in its data set (stable across epochs).
    """

    index: int
    text: str
    prompt_ids: list[int]
    gold: str
    row: dict[str, Any] = field(default_factory=dict)
    question: str = ""
    """The question before templating (what a person reads in sample tables); "" when unknown."""
    max_new_tokens: int | None = None
    """This prompt's own limit on new tokens (a multi-turn trajectory's remaining budget); None: the sampling's."""


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """What an engine needs to sample: ``n`` samples per prompt, at most ``max_new_tokens`` each."""

    n: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends once the text holds one (the tokens that completed it are kept)."""
    ignore_eos: bool = False
    """Generate past the eos token (only ``max_new_tokens`` and the stops above end a sample)."""


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One sampled response.

    ``token_ids``: [T_i] generated ids, ending with the eos id when ``finish_reason == "stop"``.
    ``logprobs``: [T_i] log-probabilities (nats) the sampler assigned to each generated token, after the
    temperature transform (the same transform the trainer applies), so ratios are comparable (case R1).
    ``policy_version``: the version of the weights that sampled it: the oldest such version when updates landed
    while it was generated (``token_versions``), so a staleness bound on it bounds every token.
    """

    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    policy_version: int
    loss_mask: list[int] | None = None
    """[T_i] 1 on tokens the policy sampled, 0 on tokens an environment or the chat template put between turns
    (multi-turn trajectories: :mod:`rlvr.envs.turns`); None: every token was sampled (one turn)."""
    turns: int = 1
    """Assistant turns in the trajectory (1: a single-turn sample)."""
    messages: list[dict[str, Any]] | None = None
    """The trajectory's whole conversation (chat messages), for sample tables; None for a single-turn sample."""
    opening_messages: int = 0
    """How many of ``messages`` are the opening (the prompt's conversation, few-shot turns included); the rest are
    the trajectory's own turns and the environment's and tools' answers."""
    turn_rewards: list[float | None] | None = None
    """The environment's reward after each assistant turn (None where it gave none); None without an environment."""
    end_reason: str | None = None
    """Why the trajectory ended (``done``, ``max_turns``, ``length``, ``budget``, ``env: <reason>``); None: one turn."""
    turn_info: list[dict[str, Any]] | None = None
    """The environment's ``info`` after each assistant turn it answered (JSON-able dicts); None without an
    environment."""
    token_versions: list[int] | None = None
    """[T_i] the policy version of the weights that sampled each token (in-flight weight updates,
    ``rollout.in_flight_updates``: one trajectory may hold several); -1 on tokens not sampled (``loss_mask`` 0).
    None: every token was sampled by ``policy_version``. Each token's ``logprobs`` entry is the one that version
    computed when it sampled it (the behaviour logprob of the off-policy corrections)."""
    failure: str | None = None
    """An infrastructure failure that ended the trajectory (an environment's reset or step that raised, hung, crashed
    or returned bad output; a chat-template error on its message): the whole text the runner gave, its first line
    the reason (``end_reason`` is ``env: <first line>``), a traceback after it where one was kept. Such a
    trajectory is not the policy's outcome: it is left out of the update and of its group's baseline
    (:func:`rlvr.runtime.rollout_stage.infra_failed`). None: no such failure."""

    @property
    def truncated(self) -> bool:
        """Cut by a length limit: a turn cut at the token limit, or a trajectory ended by its token budget
        (``budget``: the next turn would not fit), whatever its last turn's finish."""
        return self.finish_reason == "length" or self.end_reason == "budget"

    def versions(self) -> list[int]:
        """[T'] the policy version of each sampled token (T' = :attr:`sampled_tokens`), in order."""
        if self.token_versions is None:
            return [self.policy_version] * self.sampled_tokens
        return [v for v in self.token_versions if v >= 0]

    @property
    def sampled_tokens(self) -> int:
        """Tokens the policy sampled (those the loss counts)."""
        return len(self.token_ids) if self.loss_mask is None else sum(self.loss_mask)


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """A verifier's verdict on one completion.

    ``score`` in [0, 1] for built-ins (full marks = 1); ``parsed`` the answer it extracted (None if none);
    ``reason`` says why the score is not full marks (``None`` when it is): e.g. ``no_answer``, ``wrong``,
    ``timeout``, ``crashed``.
    """

    score: float
    parsed: str | None = None
    reason: str | None = None
