"""Built-in environments (:data:`rlvr.envs.base` protocol).

- :class:`Feedback` (``feedback``): a verifier judges each answer; a wrong one gets a message back ("incorrect, try
  again", or the verifier's own reason with ``hint: true``) until it is right or rlvr's ``max_turns`` is reached.
  The trajectory's reward is the recipe verifiers' score of the final answer (optionally discounted by turns:
  ``environment.turn_discount``).
- :class:`Guess` (``guess``): a number-guessing game with state across turns: the row's gold is a whole number in
  ``[low, high]``; each reply's last integer is a guess, answered "higher", "lower" or "correct". Bisection solves
  it in ceil(log2(high - low + 1)) guesses; a model that reads the replies does better than guessing anew.

Each environment is given the data row with two more keys: ``gold`` (the row's gold answer as text) and
``question`` (its question before templating).
"""

from __future__ import annotations

import re
from typing import Any

from rlvr.envs.base import EnvStep
from rlvr.envs.tokens import Message

_INT = re.compile(r"-?\d+")


class Feedback:
    """Answers a wrong reply with ``message`` (or the verifier's reason when ``hint``), ends on a right one.

    ``verifier``/``args``: the verifier that judges each turn (a built-in name, ``module:attr`` or
    ``file.py:attr``, as in ``reward.verifiers``); ``threshold``: the score that counts as right.
    Errors: those of :func:`rlvr.reward.base.build_verifier` for a verifier that does not resolve.
    """

    def __init__(self, verifier: str = "math", args: dict[str, Any] | None = None, threshold: float = 1.0,
                 message: str = "Your answer is incorrect. Try again.", hint: bool = False) -> None:
        self.verifier_name, self.args, self.threshold = verifier, dict(args or {}), threshold
        self.message, self.hint = message, hint
        self._verifier: Any = None
        self.gold = ""

    @staticmethod
    def check_args(verifier: str = "math", args: dict[str, Any] | None = None, **_: Any) -> None:
        """Load-time check (:mod:`rlvr.envs.base`): the verifier name resolves and takes ``args``, without building
        it. Errors: those of :func:`rlvr.reward.base.resolve_verifier` (an unknown name with the nearest) and
        :func:`rlvr.reward.base.check_verifier_args`."""
        from rlvr.config import VerifierSpec
        from rlvr.reward.base import check_verifier_args

        check_verifier_args(VerifierSpec(name=verifier, args=dict(args or {})), "environment.args.args")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_verifier": None}  # rebuilt in the worker (a verifier need not pickle)

    def _verify(self, text: str, row: dict[str, Any]) -> Any:
        if self._verifier is None:
            from rlvr.config import VerifierSpec
            from rlvr.reward.base import build_verifier

            self._verifier = build_verifier(VerifierSpec(name=self.verifier_name, args=self.args))
        return self._verifier.verify(text, self.gold, **row)

    def reset(self, row: dict[str, Any]) -> list[Message] | None:
        self.gold = str(row.get("gold", ""))
        return None

    def step(self, history: list[Message], reply: Message) -> EnvStep:
        result = self._verify(reply["content"], {})
        score = float(result.score)
        if score >= self.threshold:
            return EnvStep([], reward=score, done=True, info={"verdict": "right"})
        text = self.message
        if self.hint and result.reason:
            text = f"{self.message} ({result.reason})"
        return EnvStep([{"role": "user", "content": text}], reward=score, done=False,
                       info={"verdict": result.reason or "wrong"})


class Guess:
    """The number-guessing game of the module docstring. The gold (a whole number) is the secret; ``low``/``high``
    bound it (the row's ``low``/``high`` fields override them; a gold outside them fails the row's reset, which ends
    its trajectories with the reason). A reply without an integer is answered with
    ``"Reply with a whole number between {low} and {high}."`` and costs a turn."""

    def __init__(self, low: int = 1, high: int = 16) -> None:
        if low > high:
            raise ValueError(f"guess: low={low} > high={high}; set environment.args.low <= high")
        self.low, self.high = low, high
        self.secret: int | None = None
        self.guesses: list[int] = []

    def reset(self, row: dict[str, Any]) -> list[Message] | None:
        self.low, self.high = int(row.get("low", self.low)), int(row.get("high", self.high))
        self.secret = int(str(row["gold"]).strip())
        if not self.low <= self.secret <= self.high:  # a game no guess in bounds can win: this row's data is wrong
            raise ValueError(f"guess: the row's gold {self.secret} lies outside [{self.low}, {self.high}]; fix the "
                             "row or environment.args low/high (or the row's own low/high fields)")
        self.guesses = []
        return None

    def step(self, history: list[Message], reply: Message) -> EnvStep:
        found = _INT.findall(reply["content"])
        if not found:
            return EnvStep([{"role": "user", "content": f"Reply with a whole number between {self.low} and "
                                                         f"{self.high}."}], reward=0.0, info={"guess": None})
        g = int(found[-1])
        self.guesses.append(g)
        if g == self.secret:
            return EnvStep([], reward=1.0, done=True, info={"guess": g})
        word = "higher" if g < self.secret else "lower"
        return EnvStep([{"role": "user", "content": f"{g} is wrong: my number is {word}. Guess again."}],
                       reward=0.0, info={"guess": g, "reply": word})
