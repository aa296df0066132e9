"""One conformance suite for every environment adapter (issue 42): the same cases, run through the real turn loop
(:func:`rlvr.envs.turns.run_turns`: tiny model's renderer, a scripted engine) and the real environment process
pool (:class:`rlvr.envs.pool.EnvPool`: 2 workers, a 2 s limit per call), against each adapter with what it wraps
misbehaving on purpose (tests/unit/conformance_envs.py, tests/unit/conformance_vf.py):

- ``ok``: reset, a wrong reply answered, a right one ends the trajectory with reward 1 (``done``);
- ``reset_raises``, ``step_raises``, ``step_hangs``, ``dies`` (what serves the environment goes away mid-trajectory),
  ``malformed`` (garbage where a reward or an answer should be): the trajectory ends with an ``env: ...`` reason and
  its failure text (:func:`rlvr.runtime.rollout_stage.infra_failed`: left out of the update and the group baseline,
  never trained as the policy's 0), within the limits, and the batch goes on;
- ``pathological``: the model's reply is 4,000 characters of brackets, control characters and mixed scripts: the
  environment answers it (an invalid move is the game's business), nothing fails;
- ``long_obs``: a 200,000-character observation is cut to ``max_observation_tokens`` and play goes on;
- ``close``: an adapter whose environment holds something (``close()``) is closed exactly once after each way a
  trajectory ends (done, max_turns, the token limit, the budget, a step that raised, hung or crashed).

The table these tests fill is in docs/environments.md ("Conformance").
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rlvr.envs.pool import EnvPool, env_preload
from rlvr.envs.turns import TurnSettings, run_turns
from rlvr.runtime.rollout_stage import infra_failed
from rlvr.types import Completion, SamplingConfig
from tests.unit.conformance_envs import LONG_CHARS, OPENING, OpenEnvServer, OpenEnvWsServer
from tests.unit.test_env_turns import _start, renderer  # noqa: F401 - a fixture

HERE = "tests/unit/conformance_envs.py"
POOL_TIMEOUT_S = 2.0
PATHOLOGICAL = ("[[[]]]\x00\x07 ]][[ 七 \u202e" * 200)[:4000]


class Engine:
    """Answers round r with ``script[r]`` (its ids from the tiny tokenizer, characters it lacks as ``<unk>``; the
    reply's text is the script's, as an engine's detokenised text is), then the eos id; cut at the turn's limit."""

    def __init__(self, tok, script: list[str], eos: int) -> None:
        self.tok, self.script, self.eos, self.rounds = tok, script, eos, 0

    def __call__(self, prompts, sampling):
        text = self.script[self.rounds]
        self.rounds += 1
        toks = self.tok.encode(text, add_special_tokens=False) + [self.eos]
        out = []
        for p in prompts:
            n = min(len(toks), p.max_new_tokens)
            out.append(Completion(prompt_index=p.index, sample_index=0, prompt_ids=list(p.prompt_ids),
                                  token_ids=toks[:n], logprobs=[-0.1] * n, text=text,
                                  finish_reason="stop" if n == len(toks) else "length", policy_version=0))
        return out


class Adapter:
    """How the suite reaches one adapter: ``env(mode, closes_to)`` -> (environment name, args, row fields);
    ``win``/``lose``: replies that win and that are answered "again"; ``closes``: its environment has ``close()``."""

    name = ""
    win, lose = "7", "3"
    closes = False

    def env(self, mode: str, closes_to: str) -> tuple[str, dict, dict]:
        raise NotImplementedError

    def stop(self) -> None:
        pass


class Plain(Adapter):
    name, closes = "plain rlvr environment", True

    def env(self, mode, closes_to):
        return f"{HERE}:PlainEnv", {"mode": mode, "closes_to": closes_to}, {}


class Arena(Adapter):
    name, win, lose = "TextArena", "[7]", "[3]"

    def env(self, mode, closes_to):
        return "textarena", {"game": f"{HERE}:ArenaGame", "game_args": {"mode": mode}, "reward_range": [-1, 1]}, \
            {"seed": 5}


class OpenEnvHTTP(Adapter):
    name = "OpenEnv (HTTP)"

    def __init__(self) -> None:
        self.server: OpenEnvServer | None = None

    def env(self, mode, closes_to):
        if self.server is None or mode == "dies":  # a server that dies is one of its own
            self.server = OpenEnvServer()
        return "openenv", {"url": self.server.url, "timeout_s": 1.0, "observation_field": "text",
                           "reset_args": {"mode": mode}}, {}  # fmt: skip

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class OpenEnvWS(OpenEnvHTTP):
    name, closes = "OpenEnv (WebSocket sessions)", True

    def env(self, mode, closes_to):
        if self.server is None or mode == "dies":
            self.server = OpenEnvWsServer()
        return "openenv_ws", {"url": self.server.url, "timeout_s": 1.0, "observation_field": "text",
                              "reset_args": {"mode": mode, "closes_to": closes_to}}, {}  # fmt: skip


class Verifiers(Adapter):
    name = "verifiers 0.4.0"

    def env(self, mode, closes_to):
        from rlvr.envs.verifiers_env import VerifiersEnv

        armed = f"{closes_to}.armed"
        args = {"taskset": "tests/unit/conformance_vf.py", "taskset_args": {"mode": mode, "armed": armed},
                "max_turns": 4, "reward_range": [0, 1]}
        row = VerifiersEnv.rows(size=1, seed=0, **args)[0]  # rows replay each opening: a reset raising here fails
        Path(armed).touch()  # the load; armed after it, the reset fails in the worker
        return "verifiers", args, row


ADAPTERS = [Plain, Arena, OpenEnvHTTP, OpenEnvWS, Verifiers]


@pytest.fixture(scope="module")
def pool():
    with EnvPool(2, POOL_TIMEOUT_S, preload=env_preload(["textarena", "verifiers"])) as p:
        yield p


@pytest.fixture(params=ADAPTERS, ids=lambda a: a.__name__)
def adapter(request):
    a = request.param()
    yield a
    a.stop()


def play(adapter, pool, renderer, mode, script, tmp_path, *, max_turns=4, max_tokens=400, max_new_tokens=4000,
         max_obs_tokens=32, end_on_length=True):  # noqa: F811 - renderer is the fixture
    """One trajectory of ``adapter`` in ``mode`` with the replies ``script``: (its completion, the turn loop's
    counters, the closes counted, seconds)."""
    closes_to = str(tmp_path / f"closes-{mode}-{time.monotonic_ns()}")
    name, args, fields = adapter.env(mode, closes_to)
    start, conv = _start(renderer, "play")
    engine = Engine(renderer.tokenizer, script, renderer.eos_id)
    t0 = time.monotonic()
    trajs, counters = run_turns([start], [conv], 1, engine, pool, renderer,
                                TurnSettings(max_turns=max_turns, max_tokens=max_tokens, max_new_tokens=max_new_tokens,
                                             max_observation_tokens=max_obs_tokens, end_on_length=end_on_length,
                                             max_prompt_tokens=1000),
                                SamplingConfig(n=1, max_new_tokens=max_new_tokens),
                                [{"gold": "7", "env": {"name": name, "args": args}, **fields}])  # fmt: skip
    seconds = time.monotonic() - t0
    closed = Path(closes_to).read_text().splitlines() if Path(closes_to).exists() else []
    return trajs[0].completion(), counters, closed, seconds


def test_ok_reset_step_and_score(adapter, pool, renderer, tmp_path):  # noqa: F811
    c, _, closed, _ = play(adapter, pool, renderer, "ok", [adapter.lose, adapter.win], tmp_path)
    assert (c.end_reason, c.turns, c.failure) == ("done", 2, None)
    assert c.turn_rewards[-1] == 1.0  # the win, on [0, 1]
    assert OPENING in renderer.tokenizer.decode(c.prompt_ids)  # the environment's own opening
    assert "again" in c.text or any("again" in str(m.get("content")) for m in (c.messages or []))
    assert infra_failed([c]) == [False]
    assert len(closed) == (1 if adapter.closes else 0)


FAILURES = {
    "reset_raises": {Plain: "env: error: RuntimeError: reset broke", Arena: "env: error: RuntimeError: reset broke",
                     OpenEnvHTTP: "env: error: OpenEnvError: openenv: POST",
                     Verifiers: "env: error: RuntimeError: reset broke", OpenEnvWS: "env: error: OpenEnvError: openenv: ws://"},
    "step_raises": {Plain: "env: error: RuntimeError: step broke", Arena: "env: error: RuntimeError: step broke",
                    OpenEnvHTTP: "env: error: OpenEnvError: openenv: POST",
                    Verifiers: "env: error: RuntimeError: step broke", OpenEnvWS: "env: error: OpenEnvError: openenv: ws://"},
    "step_hangs": {Plain: "env: timeout", Arena: "env: timeout", OpenEnvHTTP: "env: error: OpenEnvError: openenv: POST",
                   Verifiers: "env: timeout", OpenEnvWS: "env: error: OpenEnvError: openenv: ws://"},
    "dies": {Plain: "env: crashed", Arena: "env: crashed", OpenEnvHTTP: "env: error: OpenEnvError: openenv: POST",
             Verifiers: "env: crashed", OpenEnvWS: "env: error: OpenEnvError: openenv: ws://"},
    "malformed": {Plain: "env: bad output: step returned the reward 5.0", Arena: "env: bad output: textarena:",
                  OpenEnvHTTP: "env: error: OpenEnvError: openenv: POST", Verifiers: "env: error:",
                  OpenEnvWS: "env: error: OpenEnvError: openenv: ws://"},
}
"""What each failure ends a trajectory with, per adapter (the start of ``end_reason``)."""

DETAIL = {("reset_raises", OpenEnvHTTP): "HTTP 500", ("step_raises", OpenEnvHTTP): "HTTP 500",
          ("step_hangs", OpenEnvHTTP): "no answer within timeout_s=1s", ("malformed", OpenEnvHTTP): "not JSON",
          ("dies", OpenEnvHTTP): "", ("step_hangs", Plain): "environment.timeout_s=2", ("dies", Plain): "died",
          ("step_hangs", Arena): "environment.timeout_s=2", ("dies", Arena): "died",
          ("step_hangs", Verifiers): "environment.timeout_s=2", ("dies", Verifiers): "died",
          ("malformed", Verifiers): "reward_range"}
"""A part of the whole failure text worth checking beyond the reason."""


@pytest.mark.parametrize("mode", list(FAILURES))
def test_a_failure_ends_the_trajectory_as_an_infrastructure_failure(adapter, pool, renderer, tmp_path, mode):  # noqa: F811
    c, _, closed, seconds = play(adapter, pool, renderer, mode, [adapter.lose, adapter.win], tmp_path)
    want = FAILURES[mode][type(adapter)]
    assert c.end_reason.startswith(want), c.end_reason
    assert DETAIL.get((mode, type(adapter)), "") in c.failure
    assert infra_failed([c]) == [True]  # never the policy's 0: out of the update and the baseline
    assert seconds < POOL_TIMEOUT_S + 8  # bounded by the limits, not by the 60 s hang
    if adapter.closes and mode != "reset_raises":
        # closed once, on the last state that came back; a WebSocket session ends at the failure itself (politely,
        # with a close, after the server's error answer; otherwise by dropping the socket, whose next answer is
        # unknown), so its trajectory's close has nothing left to send
        want_closes = 1 if not isinstance(adapter, OpenEnvWS) or mode == "step_raises" else 0
        assert len(closed) == want_closes
    if mode == "reset_raises":
        assert c.turns == 0


def test_a_pathological_reply_is_answered_not_failed(adapter, pool, renderer, tmp_path):  # noqa: F811
    c, _, _, _ = play(adapter, pool, renderer, "ok", [PATHOLOGICAL, adapter.win], tmp_path, max_tokens=20000,
                      max_new_tokens=8000)
    assert (c.end_reason, c.turns, c.failure) == ("done", 2, None)
    assert c.turn_rewards[-1] == 1.0


def test_a_long_observation_is_cut_and_play_goes_on(adapter, pool, renderer, tmp_path):  # noqa: F811
    c, counters, _, seconds = play(adapter, pool, renderer, "long_obs", [adapter.lose, adapter.win], tmp_path)
    assert (c.end_reason, c.turns, c.failure) == ("done", 2, None)
    assert counters["obs_tokens_cut"] == LONG_CHARS - 32  # one token a character in the tiny vocabulary; 32 kept
    assert "about 199968 tokens cut" in renderer.tokenizer.decode(c.token_ids)  # the marker (brackets are <unk>)
    assert len(renderer.tokenizer.decode(c.token_ids)) < LONG_CHARS / 10
    assert seconds < 10


ENDINGS = {
    # ending: (script, play() settings, expected end_reason)
    "done": (["3", "7"], {}, "done"),
    "max_turns": (["3", "3"], {"max_turns": 2}, "max_turns"),
    "length": (["3" * 50], {"max_new_tokens": 10}, "length"),
    "budget": (["3", "3", "3"], {"max_tokens": 14, "max_new_tokens": 4}, "budget"),
    "step_raises": (["3"], {}, "env: error: RuntimeError: step broke"),
    "step_hangs": (["3"], {}, "env: timeout"),
    "dies": (["3"], {}, "env: crashed"),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_close_runs_once_after_every_way_a_trajectory_ends(pool, renderer, tmp_path, ending):  # noqa: F811
    script, settings, want = ENDINGS[ending]
    mode = ending if ending in ("step_raises", "step_hangs", "dies") else "ok"
    c, _, closed, _ = play(Plain(), pool, renderer, mode, script, tmp_path, **settings)
    assert c.end_reason == want
    assert len(closed) == 1, closed
    steps_before = {"done": 2, "max_turns": 1, "length": 0, "budget": 1}.get(ending, 0)
    assert closed == [f"closed after {steps_before} steps"]  # the last state that came back
