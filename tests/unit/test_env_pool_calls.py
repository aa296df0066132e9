"""What the environment pool (:class:`rlvr.envs.pool.EnvPool`) hands an environment in its worker and what it ends:
the constructor's args, the row, the history and the reply each call carries, the state between calls, the workers
at ``close``; the names :func:`rlvr.envs.runner.resolve_environment` resolves (each kind) and refuses (issue 38,
item 20: breaks a mutation run over ``rlvr/envs/pool.py`` and ``rlvr/envs/runner.py`` left uncaught)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import multiprocessing as mp
import re

import pytest

from rlvr.envs.pool import EnvPool
from rlvr.envs.runner import InlineRunner, resolve_environment

HELPERS = "tests/unit/envs_echo.py"
ECHO = f"{HELPERS}:Echoes"


def _runner(where: str):
    """The environment pool (2 workers) or the in-process runner, as a context manager."""
    if where == "pool":
        return EnvPool(num_workers=2, timeout_s=30.0, memory_mb=2048)
    return contextlib.nullcontext(InlineRunner())


@pytest.mark.parametrize("where", ["pool", "inline"])
def test_the_runner_hands_the_environment_its_args_row_history_and_reply(where):
    """The same calls through the worker pool and through the in-process runner (tests, debugging)."""
    row = {"gold": "7", "env": {"name": ECHO, "args": {"tag": "t1"}}}
    with _runner(where) as pool:
        ((state, opening),) = pool.reset([row])
        assert opening == [{"role": "user", "content": "opening for 7"}]
        history, reply = [{"role": "user", "content": "opening for 7"}], {"role": "assistant", "content": "five"}
        ((state, step),) = pool.step([(state, history, reply)])
        assert (step.messages, step.reward, step.done) == ([{"role": "user", "content": "more"}], 0.5, False)
        assert step.info == {"tag": "t1", "gold": "7", "history": ["opening for 7"], "reply": "five", "steps": 1}
        # the state the first step returned carries its count: the second call is the environment's second step
        history = [*history, reply, {"role": "user", "content": "more"}]
        ((_, step),) = pool.step([(state, history, {"role": "assistant", "content": "six"})])
        assert step.done and step.info == {"tag": "t1", "gold": "7", "history": ["opening for 7", "five", "more"],
                                           "reply": "six", "steps": 2}  # fmt: skip


def _env_workers() -> set:
    return {p for p in mp.active_children() if p.name == "rlvr-environment"}


def test_closing_the_pool_ends_its_workers_and_refuses_later_calls():
    before = _env_workers()
    with EnvPool(num_workers=2, timeout_s=30.0) as pool:
        mine = _env_workers() - before
        assert len(mine) == 2 and all(p.is_alive() for p in mine)
    assert not any(p.is_alive() for p in mine)  # leaving the block closed the pool
    with pytest.raises(RuntimeError, match=r"the environment pool was used after close\(\)"):
        pool.reset([{"gold": "7", "env": {"name": ECHO}}])
    pool = EnvPool(num_workers=1, timeout_s=30.0)
    mine = _env_workers() - before
    pool.close()
    assert len(mine) == 1 and not any(p.is_alive() for p in mine)


@pytest.mark.parametrize("attr", ["NOT_A_CLASS", "OnlyReset"])
def test_a_name_that_points_at_no_environment_class_is_refused(attr):
    why = "is not a class with reset(row) and step(history, reply) methods"
    with pytest.raises(TypeError, match=re.escape(f"environment '{HELPERS}:{attr}' {why}")):
        resolve_environment(f"{HELPERS}:{attr}")
    # in a run it ends the trajectory at reset, with the reason
    ((state, reason),) = InlineRunner().reset([{"gold": "7", "env": {"name": f"{HELPERS}:{attr}"}}])
    assert state is None and reason.startswith(f"error: TypeError: environment '{HELPERS}:{attr}' {why}")


def test_resolve_environment_finds_each_kind_of_name(monkeypatch):
    from rlvr.envs.builtins import Feedback, Guess
    from rlvr.envs.openenv import OpenEnv

    assert [resolve_environment(n) for n in ("feedback", "guess", "openenv")] == [Feedback, Guess, OpenEnv]
    assert resolve_environment("rlvr.envs.builtins:Guess") is Guess  # package.module:Name
    assert resolve_environment(ECHO).__name__ == "Echoes"  # path/file.py:Name
    # an entry point of an installed package, in the group rlvr.environments
    ep = importlib.metadata.EntryPoint(name="my-guess", value="rlvr.envs.builtins:Guess", group="rlvr.environments")
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [ep] if kw.get("group") == "rlvr.environments" else real(**kw))  # fmt: skip
    assert resolve_environment("my-guess") is Guess
    # an unknown name: the nearest known one when there is one (difflib ratio 0.57 for the words swapped)
    with pytest.raises(KeyError, match=r"unknown environment 'envopen'\. Did you mean 'openenv'\? Built-in: "
                                       r"feedback, guess, openenv, openenv_ws, textarena, verifiers; entry points \(rlvr\.environments\): my-guess;"):
        resolve_environment("envopen")
    with pytest.raises(KeyError) as e:
        resolve_environment("quiz")
    assert "unknown environment 'quiz'. Built-in:" in str(e.value)


def test_an_opening_that_is_not_messages_ends_the_trajectory_at_reset():
    ((state, reason),) = InlineRunner().reset([{"gold": "7", "env": {"name": f"{HELPERS}:BadOpening"}}])
    assert (state, reason) == (None, "bad output: reset returned str, not a list of messages")


def test_what_the_pool_says_of_a_crash_without_a_memory_limit_and_of_a_row_that_does_not_pickle():
    crash = "tests/unit/envs_misbehave.py:Misbehaves"  # os._exit(3) on the reply "d"
    with EnvPool(num_workers=1, timeout_s=30.0) as pool:
        ((state, _),) = pool.reset([{"gold": "1", "env": {"name": crash}}])
        ((dead, text),) = pool.step([(state, [], {"role": "assistant", "content": "d"})])
        assert dead is None and text.startswith("crashed\n") and "the OOM killer)" in text and "memory_mb" not in text
        # a job that cannot be sent (a row holding a function): its reason alone, no second line
        ((dead, text),) = pool.reset([{"gold": "1", "f": lambda: 0, "env": {"name": ECHO}}])
        assert dead is None and text.startswith("error: ") and "\n" not in text


def _raised(msg: str) -> ValueError:
    try:
        raise ValueError(msg)
    except ValueError as e:
        return e


def test_the_failure_text_cuts_a_traceback_only_past_its_limit_and_caps_a_bad_output_reason():
    import traceback

    from rlvr.envs.base import BadEnvOutput
    from rlvr.envs.runner import TRACEBACK_CHARS, failure

    one = len("".join(traceback.format_exception(_raised("x"))).rstrip("\n"))  # the traceback of a 1-character message
    for extra, cut in ((0, 0), (1, 1)):  # a traceback of exactly TRACEBACK_CHARS characters is kept whole
        e = _raised("x" * (TRACEBACK_CHARS - one + 1 + extra))
        tb = "".join(traceback.format_exception(e)).rstrip("\n")
        assert len(tb) == TRACEBACK_CHARS + extra
        head = f"error: ValueError: {'x' * (TRACEBACK_CHARS - one + 1 + extra)}"[:300]
        kept = tb if not cut else f"[traceback: its first {cut} characters cut]\n" + tb[-TRACEBACK_CHARS:]
        assert failure(e) == f"{head}\n{kept}"
    assert failure(BadEnvOutput("y" * 400)) == "bad output: " + "y" * (300 - len("bad output: "))
