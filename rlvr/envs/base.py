"""The environment seam: an environment speaks messages, rlvr owns the tokens.

An environment is a class built once per trajectory with the recipe's ``environment.args``; it starts from a data
row and answers each assistant message:

- ``reset(row) -> list[Message] | None``: the opening conversation (Hugging Face chat messages). None or ``[]``:
  the row's own opening (its ``messages`` field, or the recipe's templated question), as a single-turn prompt is.
- ``step(history, reply) -> EnvStep``: ``history`` is the conversation so far, ``reply`` the assistant's message
  (``{"role": "assistant", "content": text}``); the answer is the messages to append (a ``user`` or ``tool``
  message), an optional reward in [0, 1], ``done`` and ``info`` (JSON-able; shown in sample tables).

An environment class may define ``check_args(**args)`` (a staticmethod): rlvr calls it at load (preflight and
``--dry-run``) with ``environment.args`` after checking them against the constructor, to refuse values it can tell
are wrong before any worker starts (``feedback`` resolves its verifier name there). It raises with what is wrong.

rlvr runs environments in worker processes with hard time and memory limits (:mod:`rlvr.envs.pool`): a step that
hangs, crashes or returns something else than an :class:`EnvStep` ends that trajectory with a logged reason, and the
batch goes on. Between steps the environment object is pickled (its state travels with the trajectory, so any
worker can take the next step and a killed worker loses one call): keep its state picklable.

:func:`resolve_environment` resolves a name as verifiers are resolved (:mod:`rlvr.reward.base`): a built-in short
name (:data:`ENVIRONMENTS`), ``package.module:Name``, ``path/to/file.py:Name``, or an entry point in the group
``rlvr.environments``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlvr.envs.tokens import Message

ENTRY_POINT_GROUP = "rlvr.environments"


@dataclass(frozen=True)
class EnvStep:
    """An environment's answer to one assistant message.

    ``messages``: the messages to append (may be empty when ``done``); ``reward``: this turn's reward in [0, 1]
    (None: none given); ``done``: the trajectory ends here; ``info``: anything JSON-able worth showing.
    """

    messages: list[Message] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One trajectory's environment (see the module docstring)."""

    def reset(self, row: dict[str, Any]) -> list[Message] | None: ...

    def step(self, history: list[Message], reply: Message) -> EnvStep: ...


class BadEnvOutput(ValueError):
    """An environment returned something rlvr cannot use; the trajectory ends with this reason."""


_ROLES = ("system", "user", "assistant", "tool")


def check_messages(value: Any, where: str) -> list[Message]:
    """``value`` as a list of chat messages (role in system/user/assistant/tool, content a string).

    Errors: :class:`BadEnvOutput` naming ``where`` and the first bad message."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise BadEnvOutput(f"{where} returned {type(value).__name__}, not a list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise BadEnvOutput(f"{where}: message {i} is {str(m)[:120]!r}; a message is a dict with a role "
                               f"({'/'.join(_ROLES)}) and a string content")
        out.append(dict(m))
    return out


def check_step(value: Any, where: str = "step") -> EnvStep:
    """An environment's ``step`` result checked: an :class:`EnvStep` (or a ``(messages, reward, done, info)``
    tuple) with valid messages and a finite reward in [0, 1] or None.

    Errors: :class:`BadEnvOutput` naming what is wrong."""
    if isinstance(value, tuple) and len(value) == 4:
        value = EnvStep(*value)
    if not isinstance(value, EnvStep):
        raise BadEnvOutput(f"{where} returned {type(value).__name__}; return rlvr.envs.EnvStep(messages, reward, "
                           "done, info)")
    msgs = check_messages(value.messages, where)
    reward = value.reward
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward) \
                or not 0.0 <= reward <= 1.0:
            raise BadEnvOutput(f"{where} returned the reward {reward!r}; a reward is a number in [0, 1] or None")
        reward = float(reward)
    if not isinstance(value.done, bool):
        raise BadEnvOutput(f"{where} returned done={value.done!r}; done is True or False")
    if not msgs and not value.done:
        raise BadEnvOutput(f"{where} returned no messages and done=False: the model would have nothing to answer")
    info = value.info if isinstance(value.info, dict) else {"info": str(value.info)}
    return EnvStep(msgs, reward, value.done, info)
