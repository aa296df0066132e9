"""Issue 38, item 16: an environment's failure keeps its traceback (rlvr.envs.runner.failure, rlvr.envs.pool.EnvPool),
and a step whose trajectories fail often warns, every failure's text going to train.log (rlvr.envs.watch)."""

from __future__ import annotations

import logging
import traceback

import pytest

from rlvr.console import ConsoleFilter
from rlvr.envs.base import BadEnvOutput, EnvStep
from rlvr.envs.runner import TRACEBACK_CHARS, InlineRunner, failure
from rlvr.envs.watch import TrajectoryWatch, trajectory_failures
from rlvr.types import Completion

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
    assert texts[0].split("\n", 1)[1] == (
        "the call ran past environment.timeout_s=2 s: its worker was killed (SIGKILL) and replaced; no traceback (the "
        "process was killed mid-call)")
    assert texts[1].split("\n", 1)[1] == (
        "the environment's worker process died during the call (a segfault, os._exit, the OOM killer, "
        "environment.memory_mb=1024 MiB exceeded) and was replaced; no traceback (the process ended before it could "
        "send one)")
    assert "_ = bytearray(2**31)" in texts[2] and texts[2].endswith("MemoryError")  # the worker's own traceback


# -- the watch: a warning past environment.warn_failure_frac, every failure's text in train.log ---------------------
TB = ("error: ZeroDivisionError: division by zero\nTraceback (most recent call last):\n"
      '  File "env.py", line 9, in step\n    return 1 / 0\nZeroDivisionError: division by zero')


def _traj(i: int, end: str = "done", failure: str | None = None, info: list | None = None) -> Completion:
    return Completion(prompt_index=i // 2, sample_index=i % 2, prompt_ids=[1], token_ids=[5], logprobs=[-0.1],
                      text="7", finish_reason="stop", policy_version=0, turns=1, end_reason=end, failure=failure,
                      turn_info=info or [])  # fmt: skip


def _calls(*statuses: str) -> list[dict]:
    return [{"tool_calls": [{"name": "calculator", "call": f"<tool_call>{k}</tool_call>", "status": s,
                             "result": "ok" if s == "ok" else f"error: {s} {k}"} for k, s in enumerate(statuses)]}]


def test_trajectory_failures_reads_each_kind_by_hand() -> None:
    assert trajectory_failures(_traj(0)) == []
    assert trajectory_failures(_traj(0, end=None)) == []  # a single-turn sample
    (f,) = trajectory_failures(_traj(1, end="env: error: ZeroDivisionError: division by zero", failure=TB))
    assert (f.kind, f.reason, f.text) == ("environment", "error: ZeroDivisionError: division by zero", TB)
    (f,) = trajectory_failures(_traj(2, end="prefix_broken", info=[{"x": 1}, {"prefix_broken": "turn 1 re-rendered"}]))
    assert (f.kind, f.reason) == ("prefix_broken", "turn 1 re-rendered")
    fs = trajectory_failures(_traj(3, info=_calls("ok", "error", "malformed", "timeout")))
    assert [(f.kind, f.status, f.reason) for f in fs] == [("tool calculator", "error", "error: error 1"),
                                                         ("tool calculator", "timeout", "error: timeout 3")]
    assert fs[0].text == "error: <tool_call>1</tool_call>\n-> error: error 1"


def _step(env_failed: int, broken: int = 0, tools: dict[int, list[str]] | None = None, b: int = 8) -> list:
    out = []
    for i in range(b):
        if i < env_failed:
            out.append(_traj(i, end="env: error: ZeroDivisionError: division by zero", failure=TB))
        elif i < env_failed + broken:
            out.append(_traj(i, end="prefix_broken", info=[{"prefix_broken": "the template dropped <think>"}]))
        else:
            out.append(_traj(i, info=_calls(*(tools or {}).get(i, []))))
    return out


def test_the_watch_warns_past_the_share_once_then_only_when_worse(caplog) -> None:
    """Threshold 0.25 over 8 trajectories. Step 1: 1 environment failure (12.5%: quiet), 1 break (quiet). Step 2: 2
    failures (25%: warns). Step 3: 2 (quiet). Step 4: 3 (37.5%, 12.5 points above 25%: warns); tool calculator
    fails in trajectories 6 and 7 (2 errors, 1 timeout: 25%: warns)."""
    watch = TrajectoryWatch(0.25)
    steps = {1: _step(1, broken=1), 2: _step(2), 3: _step(2),
             4: _step(3, tools={6: ["error", "ok"], 7: ["timeout", "error"]})}
    with caplog.at_level(logging.INFO, logger="rlvr"):
        said = {s: watch.check(s, comps) for s, comps in steps.items()}
    assert [s for s, m in said.items() if m] == [2, 4]
    assert said[2] == [
        "step 2: 25% of the step's trajectories (2 of 8) ended on an environment failure, not the policy's doing; e.g. "
        "prompt 0 sample 0: 'error: ZeroDivisionError: division by zero' (the commonest reason in 2 of 2). Fix the "
        "environment (a hang: environment.timeout_s; a crash: environment.memory_mb); each failure's whole text, its "
        "traceback where one was kept, is in train.log. (environment.warn_failure_frac=0.25; next warning for it "
        "only at 35% or more)"]
    assert said[4][0].startswith("step 4: 38% of the step's trajectories (3 of 8) ended on an environment failure")
    assert said[4][1] == (
        "step 4: tool 'calculator' failed in 25% of the step's trajectories (2 of 8; 2 errors, 1 timeout among its "
        "calls): the model is shown the error and the trajectory goes on; e.g. prompt 3 sample 0: 'error: error 0' "
        "(the commonest reason in 1 of 3). A tool that fails whatever the model asks has a bug or too tight a limit "
        "(tools.timeout_s, tools.memory_mb); each failed call is in train.log. (environment.warn_failure_frac=0.25; "
        "next warning for it only at 35% or more)")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == said[2] + said[4]
    # train.log: the traceback in full the first time, then named by the step that wrote it; off the console
    kept = [r for r in caplog.records if r.levelno == logging.INFO]
    assert all(getattr(r, "console", True) is False and not ConsoleFilter().filter(r) for r in kept)
    texts = [r.getMessage() for r in kept]
    assert texts[0] == f"step 1: environment failure in 1 trajectory (prompt/sample 0/0):\n{TB}"
    assert texts[1] == ("step 1: prefix_broken failure in 1 trajectory (prompt/sample 0/1):\n"
                        "the template dropped <think>")
    assert texts[2] == ("step 2: environment failure in 2 trajectories (prompt/sample 0/0, 0/1): "
                        "'error: ZeroDivisionError: division by zero', the text written at step 1")
    assert sum(TB in t for t in texts) == 1
    assert ("step 4: tool calculator failure in 1 trajectory (prompt/sample 3/1):\n"
            "timeout: <tool_call>0</tool_call>\n-> error: timeout 0") in texts
    # null: never warns, the texts still kept
    quiet = TrajectoryWatch(None)
    assert quiet.check(1, _step(8)) == [] and quiet.seen
    with pytest.raises(ValueError, match=r"environment.warn_failure_frac=1.5 must be in \(0, 1\]"):
        TrajectoryWatch(1.5)


class CrashesSometimes:
    """Answers done, except when built with ``crash=True``: then its step divides by zero."""

    def __init__(self, crash: bool = False) -> None:
        self.crash = crash

    def reset(self, row):
        return None

    def step(self, history, reply):
        if self.crash:
            return EnvStep([], reward=1.0 / 0, done=True)
        return EnvStep([], reward=1.0, done=True)


def test_a_quarter_of_trajectories_crashing_in_the_real_turn_loop_warns_with_the_traceback(caplog) -> None:
    """4 prompts x 2 trajectories through run_turns; the environment of prompt 3 crashes: 2 of 8 (25%) warn, and the
    traceback of the environment's own line reaches train.log."""
    from transformers import AutoTokenizer

    from rlvr.envs.tokens import ChatRenderer
    from rlvr.envs.turns import TurnSettings, run_turns
    from rlvr.models import resolve_model
    from rlvr.types import Prompt, SamplingConfig

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model("tiny-random")))
    conv = [{"role": "user", "content": "one plus six"}]
    starts = [Prompt(index=i, text="", prompt_ids=renderer.opening_ids(conv), gold="7") for i in range(4)]
    answer = renderer.tokenizer.encode("7", add_special_tokens=False) + [renderer.eos_id]

    def engine(prompts, sampling):
        return [Completion(prompt_index=p.index, sample_index=0, prompt_ids=list(p.prompt_ids), token_ids=answer,
                           logprobs=[-0.1] * len(answer), text="7", finish_reason="stop", policy_version=0)
                for p in prompts]  # fmt: skip

    env = "tests/unit/test_env_failures.py:CrashesSometimes"
    rows = [{"gold": "7", "env": {"name": env, "args": {"crash": i == 3}}} for i in range(4)]
    trajs, _ = run_turns(starts, [conv] * 4, 2, engine, InlineRunner(), renderer,
                         TurnSettings(max_turns=2, max_tokens=200, max_new_tokens=8),
                         SamplingConfig(n=2, max_new_tokens=8), rows)  # fmt: skip
    comps = [t.completion() for t in trajs]
    assert [c.end_reason for c in comps] == ["done"] * 6 + ["env: error: ZeroDivisionError: float division by zero"] * 2
    with caplog.at_level(logging.INFO, logger="rlvr"):
        (msg,) = TrajectoryWatch(0.25).check(3, comps)
    assert msg.startswith("step 3: 25% of the step's trajectories (2 of 8) ended on an environment failure, not the "
                          "policy's doing; e.g. prompt 3 sample 0: 'error: ZeroDivisionError: float division by zero'")
    (kept,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert kept.startswith("step 3: environment failure in 2 trajectories (prompt/sample 3/0, 3/1):\n"
                           "error: ZeroDivisionError: float division by zero\nTraceback (most recent call last):")
    assert "return EnvStep([], reward=1.0 / 0, done=True)" in kept


def test_the_key_is_checked_at_load_and_the_step_loop_hands_each_rollout_to_the_watch(caplog, monkeypatch) -> None:
    """``environment.warn_failure_frac`` outside (0, 1] is refused at load, naming the key; the rollout stage's
    ``finish`` (every training batch) hands the trajectories to its TrajectoryWatch: 1 of 2 failing warns, naming
    the step."""
    from pathlib import Path

    from rlvr.config import RecipeError
    from rlvr.recipe import load_recipe
    from rlvr.reward.pool import Scored
    from rlvr.runtime import rollout_stage
    from rlvr.types import Prompt, VerifyResult

    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "multiturn_cpu.yaml")
    with pytest.raises(RecipeError, match=r"environment.warn_failure_frac=1.5 must be in \(0, 1\]"):
        load_recipe(recipe, ["environment.warn_failure_frac=1.5"])
    r = load_recipe(recipe, ["rollout.prompts_per_step=1", "rollout.samples_per_prompt=2"])
    comps = [_traj(0, end="env: timeout", failure="timeout\nthe call ran past environment.timeout_s=10 s"), _traj(1)]
    scored = [Scored(reward=0.0, results={"math": VerifyResult(score=0.0, reason="wrong")}, latency_s=0.1)] * 2
    monkeypatch.setattr(rollout_stage, "collect_scored", lambda roles, pending: (comps, scored, {}))
    prompts = [Prompt(index=0, text="q", prompt_ids=[1], gold="g")]
    stage = rollout_stage.RolloutStage(None, prompts, None, None, r, "math", lambda step: 0)
    with caplog.at_level(logging.INFO, logger="rlvr"):
        stage.finish(rollout_stage.Started(7, prompts, None))
    warned = [m.getMessage() for m in caplog.records if m.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("step 7: 50% of the step's trajectories (1 of 2) ended on an "
                                                     "environment failure, not the policy's doing; e.g. prompt 0 "
                                                     "sample 0: 'timeout'")  # fmt: skip
    assert "step 7: environment failure in 1 trajectory (prompt/sample 0/0):\ntimeout\nthe call ran past" in caplog.text
