"""Issue 38, item 16: an environment's failure keeps its traceback (rlvr.envs.runner.failure, rlvr.envs.pool.EnvPool),
and a step whose trajectories fail often warns, every failure's text going to train.log (rlvr.envs.watch)."""

from __future__ import annotations

import traceback

from rlvr.envs.base import BadEnvOutput
from rlvr.envs.runner import TRACEBACK_CHARS, InlineRunner, failure

ROW = {"gold": "1", "env": {"name": "tests/unit/envs_misbehave.py:Misbehaves"}}


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001
        return e


def test_failure_is_the_reason_then_the_traceback() -> None:
    text = failure(_raise(RuntimeError("boom")))
    first, rest = text.split("\n", 1)
    assert first == "error: RuntimeError: boom"
    assert rest.startswith("Traceback (most recent call last):\n")
    assert '  File "' in rest and __file__ in rest and "raise exc" in rest  # the frame that raised, its source line
    assert rest.endswith("RuntimeError: boom")


def test_failure_keeps_the_reason_on_one_line_and_the_traceback_end() -> None:
    exc = _raise(ValueError("line one\nline two " + "x" * 5000))
    first, rest = failure(exc).split("\n", 1)
    assert first.startswith("error: ValueError: line one line two xxx") and len(first) == 300
    head, kept = rest.split("\n", 1)
    whole = len("".join(traceback.format_exception(exc)).rstrip("\n"))  # about 5100 characters
    assert whole > TRACEBACK_CHARS and head == f"[traceback: its first {whole - TRACEBACK_CHARS} characters cut]"
    assert len(kept) == TRACEBACK_CHARS and kept.endswith("x" * 100)  # the end kept: the exception's own line
    # an environment's output that breaks the protocol: rlvr's check raised, the reason says it all
    assert failure(_raise(BadEnvOutput("step returned str"))) == "bad output: step returned str"


class Raises:
    def reset(self, row):
        return None

    def step(self, history, reply):
        return {}["missing"]


def test_the_inline_runner_returns_the_traceback_of_the_environments_own_code() -> None:
    (state, opening), = InlineRunner().reset([{"env": {"name": "tests/unit/test_env_failures.py:Raises"}}])
    (none, why), = InlineRunner().step([(state, [], {"role": "assistant", "content": "1"})])
    assert none is None and why.splitlines()[0] == "error: KeyError: 'missing'"
    assert 'return {}["missing"]' in why and why.endswith("KeyError: 'missing'")
    (none, why), = InlineRunner().reset([{"env": {"name": "tests/unit/test_env_failures.py:Nowhere"}}])
    assert none is None and why.startswith("error: AttributeError: environment") and "Traceback" in why


def test_the_pool_says_what_it_knows_of_a_timeout_a_crash_and_an_error() -> None:
    from rlvr.envs.pool import EnvPool

    with EnvPool(num_workers=2, timeout_s=2.0, memory_mb=1024) as pool:
        states = pool.reset([ROW] * 3)
        out = pool.step([(s, [], {"role": "assistant", "content": r}) for (s, _), r in zip(states, ["h", "d", "m"])])
    texts = [why for _, why in out]
    assert [t.split("\n", 1)[0] for t in texts] == ["timeout", "crashed", "error: MemoryError: "]
    assert texts[0].split("\n", 1)[1] == ("the call ran past environment.timeout_s=2 s: its worker was killed (SIGKILL) "
                                          "and replaced; no traceback (the process was killed mid-call)")
    assert texts[1].split("\n", 1)[1] == (
        "the environment's worker process died during the call (a segfault, os._exit, the OOM killer, "
        "environment.memory_mb=1024 MiB exceeded) and was replaced; no traceback (the process ended before it could "
        "send one)")
    assert "_ = bytearray(2**31)" in texts[2] and texts[2].endswith("MemoryError")  # the worker's own traceback
