"""Building environments by name, and running their calls: :class:`InlineRunner` runs them in this process (tests,
debugging); :class:`rlvr.envs.pool.EnvPool` in worker processes with hard limits (training).

Both keep an environment's state as its pickle between calls (:mod:`rlvr.envs.base`), so a call can go to any
worker and a failed call loses one trajectory, never a batch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import pickle
import traceback
from typing import Any

from rlvr.envs.base import ENTRY_POINT_GROUP, BadEnvOutput, check_messages, check_step
from rlvr.envs.tokens import Message

log = logging.getLogger(__name__)

BUILTINS = {"feedback": "rlvr.envs.builtins:Feedback", "guess": "rlvr.envs.builtins:Guess",
            "openenv": "rlvr.envs.openenv:OpenEnv", "openenv_ws": "rlvr.envs.openenv:OpenEnvSession",
            "textarena": "rlvr.envs.textarena:TextArena", "verifiers": "rlvr.envs.verifiers_env:VerifiersEnv"}
"""Built-in environments by short name."""


def resolve_environment(name: str) -> Any:
    """The class a name points at: a built-in short name (:data:`BUILTINS`), ``package.module:Name``,
    ``path/to/file.py:Name`` or an entry point in the group ``rlvr.environments``.

    Errors: ``KeyError`` for an unknown short name (naming the nearest), ``FileNotFoundError``/``ImportError``/
    ``AttributeError`` for a target that does not resolve, ``TypeError`` when it is not a class."""
    import difflib

    from rlvr.userfiles import is_file_target, load_file, missing_attribute

    if name in BUILTINS:
        module, attr = BUILTINS[name].split(":")
        obj = getattr(importlib.import_module(module), attr)
    elif ":" in name:
        target, _, attr = name.rpartition(":")
        module_obj = load_file(target, "environment") if is_file_target(name) else importlib.import_module(target)
        if not hasattr(module_obj, attr):
            raise missing_attribute("environment", name, target, module_obj, attr)
        obj = getattr(module_obj, attr)
    else:
        eps = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
        if name not in eps:
            known = sorted(BUILTINS) + sorted(eps)
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.3)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise KeyError(f"unknown environment {name!r}.{hint} Built-in: {', '.join(sorted(BUILTINS))}; entry "
                           f"points ({ENTRY_POINT_GROUP}): {', '.join(sorted(eps)) or 'none'}; or give "
                           "'package.module:Name' or 'path/to/file.py:Name'.")
        obj = eps[name].load()
    if not inspect.isclass(obj) or not callable(getattr(obj, "step", None)) or not callable(getattr(obj, "reset", None)):
        raise TypeError(f"environment {name!r} is not a class with reset(row) and step(history, reply) methods")
    return obj


State = tuple[str, bytes, bool, "int | None"]
"""An environment's state between calls: ``(name, pickle of the object, whether its class has close(), pin)``.
``pin`` is None for an environment any worker may step; for one whose class sets ``sticky = True`` (it keeps
something alive in the process that ran its reset: :class:`rlvr.envs.openenv.OpenEnvSession`'s connection) it is
:data:`UNPINNED` from :func:`env_reset`, which :class:`rlvr.envs.pool.EnvPool` replaces with the worker slot that
ran the reset, so its steps and close run there (:meth:`rlvr.workers.ProcessPool.run` ``slots``). A 3-tuple (from
before ``pin``) reads as pin None."""

UNPINNED = -1
"""The pin of a sticky environment's state before a pool has pinned it (:data:`State`)."""


def _closes(env: Any) -> bool:
    return callable(getattr(type(env), "close", None))


def _pin(env: Any) -> int | None:
    return UNPINNED if getattr(type(env), "sticky", False) is True else None


def state_pin(state: Any) -> int | None:
    """The ``pin`` of a :data:`State` (None for a 3-tuple)."""
    return state[3] if len(state) > 3 else None


def env_reset(name: str, args: dict[str, Any], row: dict[str, Any]) -> tuple[State, list[Message]]:
    """Build ``name`` with ``args``, reset it on ``row``; returns (its :data:`State`, the opening messages
    checked). An environment whose ``reset`` raises is closed first (when it has ``close``), so what it opened is
    freed; the exception is then raised."""
    env = resolve_environment(name)(**args)
    try:
        opening = check_messages(env.reset(row), "reset")
    except BaseException:
        if _closes(env):
            _close_quietly(env, name)
        raise
    return (name, pickle.dumps(env), _closes(env), _pin(env)), opening


def env_step(state: State, history: list[Message], reply: Message) -> tuple[State, Any]:
    """One step of the environment whose state is ``state`` (:data:`State`); returns (its new state, the checked
    :class:`EnvStep`). The name is resolved first: a worker that never built this environment (a replacement)
    imports its module before unpickling."""
    name, blob, closes = state[:3]
    resolve_environment(name)
    env = pickle.loads(blob)
    step = check_step(env.step(history, reply))
    return (name, pickle.dumps(env), closes, state_pin(state)), step


def env_close(state: State) -> None:
    """Call ``close()`` on the environment whose last state is ``state`` (once per trajectory, after it ended,
    however it ended: :func:`rlvr.envs.turns.run_turns` releases it). Errors: whatever ``close`` raises."""
    name, blob, closes = state[:3]
    if closes:
        resolve_environment(name)
        pickle.loads(blob).close()


def _close_quietly(env: Any, name: str) -> None:
    try:
        env.close()
    except Exception as e:  # noqa: BLE001 - the reset's own error is the one to report
        log.warning("environment %s: close() after a failed reset raised %s: %s", name, type(e).__name__, e)


TRACEBACK_CHARS = 3000
"""The most of a failure's traceback kept (its end: the innermost frames and the exception)."""


def failure(exc: BaseException) -> str:
    """Why a call failed, as the turn loop keeps it (:attr:`rlvr.types.Completion.failure`): a first line, the
    reason the trajectory's end reason shows (``bad output: ...`` for an environment's output that breaks the
    protocol, else ``error: <ExcType>: msg``; on one line, at most 300 characters), then, for an exception the
    environment raised, a newline and its formatted traceback (the last :data:`TRACEBACK_CHARS` characters, the cut
    said). ``bad output`` has no traceback: it is rlvr's check that raised, the reason says what was wrong."""
    msg = " ".join(str(exc).split())  # one line: the first line is the reason
    if isinstance(exc, BadEnvOutput):
        return f"bad output: {msg}"[:300]
    reason = f"error: {type(exc).__name__}: {msg}"[:300]
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip("\n")
    if len(tb) > TRACEBACK_CHARS:
        tb = f"[traceback: its first {len(tb) - TRACEBACK_CHARS} characters cut]\n" + tb[-TRACEBACK_CHARS:]
    return f"{reason}\n{tb}"


def release_failures(states: list[Any], whys: list[str | None]) -> int:
    """Log each failed ``close()`` (a warning with the environment's name and why); the number that failed."""
    failed = 0
    for state, why in zip(states, whys):
        if why is not None:
            failed += 1
            log.warning("environment %s: close() failed: %s", state[0], why.splitlines()[0])
    return failed


class InlineRunner:
    """Runs environment calls in this process, one after another (no time limit: tests and debugging only).

    ``rows`` given to :meth:`reset` carry the environment's name and args under ``env`` (``{"name", "args"}``)."""

    def reset(self, rows: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
        out = []
        for row in rows:
            try:
                out.append(env_reset(row["env"]["name"], row["env"].get("args", {}), row))
            except Exception as e:  # noqa: BLE001 - an environment's bug ends its trajectory
                out.append((None, failure(e)))
        return out

    def step(self, items: list[tuple[Any, list[Message], Message]]) -> list[tuple[Any, Any]]:
        out = []
        for state, history, reply in items:
            try:
                out.append(env_step(state, history, reply))
            except Exception as e:  # noqa: BLE001
                out.append((None, failure(e)))
        return out

    def release(self, states: list[Any]) -> None:
        """``close()`` each ended trajectory's environment that has one (:func:`env_close`); a failure is logged,
        never raised."""
        todo = [s for s in states if s[2]]
        whys: list[str | None] = []
        for state in todo:
            try:
                env_close(state)
                whys.append(None)
            except Exception as e:  # noqa: BLE001 - a trajectory's end must not fail a rollout
                whys.append(failure(e))
        release_failures(todo, whys)
