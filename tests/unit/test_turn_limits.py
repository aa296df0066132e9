"""The turn loop at its limits (issue 38, items 1, 7, 9, 10 and 20): the last reply scored by the environment when its
reward is used, a turn that stops on another end id, the conversation showing only what the model saw, budget ends
counted as truncated, template errors and over-long openings ending only their trajectory, floods cut before they
are tokenised, and every field of the Completion a trajectory hands on.

Driven like tests/unit/test_env_turns.py: a scripted engine, the in-process runner, the tiny model's character-level
tokenizer (one id per character; <|im_start|> = 1, <|im_end|> = 2), so every id and count is worked out by hand."""

from __future__ import annotations

import types

import pytest
from transformers import AutoTokenizer

from rlvr.envs.base import EnvStep
from rlvr.envs.runner import InlineRunner
from rlvr.envs.tokens import ChatRenderer
from rlvr.envs.turns import TurnSettings, cap_observation, run_turns
from rlvr.models import resolve_model
from rlvr.types import Completion, SamplingConfig
from tests.unit.test_env_turns import (ROW, ScriptedEngine, _start, ids, renderer,  # noqa: F401 - the fixture
                                       rewriting_renderer)

HERE = "tests/unit/test_turn_limits.py"
SAMPLING = SamplingConfig(n=1, max_new_tokens=8, seed=3)


def _run(renderer, script, settings, rows=(ROW,), g=1, engine=None):
    start, conv = _start(renderer)
    engine = engine or ScriptedEngine(None, script)
    trajs, counters = run_turns([start], [conv], g, engine, InlineRunner(), renderer, settings, SAMPLING,
                                [rows[0]])  # fmt: skip
    return trajs, counters, engine


# -- item 1: the environment scores the reply that ends a trajectory ---------------------------------------------


def test_the_right_answer_on_the_last_allowed_turn_is_scored_by_the_environment(renderer):
    """HigherLower (gold 11): replies 8, 12, 11 with max_turns 3. The third reply ends the trajectory at max_turns;
    with step_last (reward: environment or both) the environment scores it 1, without it (reward: verifiers) it is
    not stepped and the environment's last reward is turn 2's 0."""
    settings = TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8, step_last=True)
    (t,), counters, _ = _run(renderer, ["8", "12", "11"], settings)
    assert (t.end, t.turns, t.turn_rewards) == ("max_turns", 3, [0.0, 0.0, 1.0])
    assert t.info[-1] == {"tries": 3}  # the environment saw three replies
    # its messages are dropped: the conversation ends with the scored reply
    assert t.messages[-1] == {"role": "assistant", "content": "11"}
    # and the reward mode reads it: environment -> 1.0, both -> verifier 0 + 1.0 (no discount)
    from rlvr.envs.rollout import trajectory_rewards
    from rlvr.reward.pool import Scored
    from rlvr.types import VerifyResult

    c = t.completion()
    sc = [Scored(reward=0.0, results={"m": VerifyResult(score=0.0)}, latency_s=0.0)]
    for mode, want in (("environment", 1.0), ("both", 1.0), ("verifiers", 0.0)):
        env = types.SimpleNamespace(reward=mode, turn_discount=1.0)
        assert trajectory_rewards([c], sc, env)[0].reward == want
    settings = TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8, step_last=False)
    (t,), _, _ = _run(renderer, ["8", "12", "11"], settings)
    assert (t.end, t.turn_rewards) == ("max_turns", [0.0, 0.0])


def test_a_reply_cut_at_the_token_limit_is_scored_and_a_failure_scoring_it_is_an_infrastructure_failure(renderer):
    """A 3-character reply with max_new_tokens 2 is cut ("length"); with step_last the environment still sees it
    (HigherLower parses "12" from the cut "12"): reward 0, "lower". An environment that raises on the last reply
    makes the trajectory an infrastructure failure (its reward cannot be known)."""
    settings = TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=2, step_last=True)
    (t,), _, _ = _run(renderer, ["12"], settings)  # "12" + eos = 3 tokens, 2 kept
    assert (t.end, t.last_finish, t.turn_rewards, t.seq.ids) == ("length", "length", [0.0], ids("12"))
    rows = ({"gold": "11", "env": {"name": f"{HERE}:FailsOnTurn2"}},)
    settings = TurnSettings(max_turns=2, max_tokens=200, max_new_tokens=8, step_last=True)
    (t,), counters, _ = _run(renderer, ["1", "2"], settings, rows=rows)
    assert t.end == "env: error: RuntimeError: scorer down" and counters["env_failures"] == 1
    assert t.completion().failure.startswith("error: RuntimeError: scorer down\n") and "Traceback" in t.failure


class FailsOnTurn2:
    def reset(self, row):
        self.n = 0

    def step(self, history, reply):
        self.n += 1
        if self.n == 2:
            raise RuntimeError("scorer down")
        return EnvStep([{"role": "user", "content": "more"}], reward=0.0)


# -- item 7: a second end id, messages the model never saw, budget ends truncated ---------------------------------


def test_a_turn_that_stops_on_another_end_id_ends_the_trajectory_with_nothing_appended(renderer):
    """The engine stops on id 1 (standing in for Qwen2.5's <|endoftext|>) instead of the template's turn end 2:
    the trajectory ends there (``stop_id``); nothing follows the sampled id, so the model is never trained to emit
    it mid-conversation. Before, the template's closing "<|im_end|>\\n..." was appended after it."""
    settings = TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8)
    (t,), _, engine = _run(renderer, ["8", "12"], settings, engine=ScriptedEngine(None, ["8", "12"], eos=1))
    assert (t.end, t.turns, t.seq.ids, t.seq.mask) == ("stop_id", 1, ids("8") + [1], [1, 1])
    assert len(engine.calls) == 1 and t.turn_rewards == []
    # with the environment's reward in use, it scores that reply all the same
    settings = TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8, step_last=True)
    (t,), _, _ = _run(renderer, ["11"], settings, engine=ScriptedEngine(None, ["11"], eos=1))
    assert (t.end, t.turn_rewards) == ("stop_id", [1.0])


def test_the_conversation_shows_only_messages_the_model_saw_and_a_budget_end_is_truncated(renderer):
    """Budget 28: turn 1 takes 2 tokens ("1" + eos) and the separator with "higher" 26, 2 + 26 + 1 > 28: the
    trajectory ends at the budget and "higher" never reached the model, so it is not in ``messages``."""
    settings = TurnSettings(max_turns=5, max_tokens=28, max_new_tokens=8)
    (t,), _, _ = _run(renderer, ["1", "2"], settings)
    assert t.end == "budget" and t.last_finish == "stop"
    assert t.messages == [{"role": "user", "content": "guess a number from 1 to 16"},
                          {"role": "assistant", "content": "1"}]  # fmt: skip
    c = t.completion()
    assert c.truncated and c.finish_reason == "stop"  # cut by a length limit, though its last turn stopped
    assert c.turn_info == [{"not_shown": "the environment's answer takes 26 tokens with the template's; 25 left of "
                                         "environment.max_tokens"}]  # fmt: skip
    # one token more of budget: "higher" is appended with its ids and shown
    (t,), _, _ = _run(renderer, ["1", "2"], TurnSettings(max_turns=5, max_tokens=29, max_new_tokens=8))
    assert [m["content"] for m in t.messages] == ["guess a number from 1 to 16", "1", "higher", "2"]
    assert (t.end, t.completion().truncated) == ("length", True)  # its last turn had 1 token of room


def test_a_message_after_a_prefix_break_is_not_shown(renderer):
    r = rewriting_renderer()
    rows = ({"gold": "7", "env": {"name": "tests/unit/test_env_turns.py:Again"}},)
    (t,), _, _ = _run(r, ["3+4=7"], TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8), rows=rows)
    assert t.end == "prefix_broken" and [m["role"] for m in t.messages] == ["user", "assistant"]


# -- item 9: a template error on an environment's message ends that trajectory only --------------------------------


class SaysSystem:
    """Answers with a system message mid-conversation (which the template below refuses)."""

    def reset(self, row):
        return None

    def step(self, history, reply):
        return EnvStep([{"role": "system" if reply["content"] == "1" else "user", "content": "try again"}])


def _strict_renderer():
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny-random"))
    tok.chat_template = ("{% for message in messages %}{% if message['role'] == 'system' and not loop.first %}"
                         "{{ raise_exception('System messages are only allowed first') }}{% endif %}"
                         + tok.chat_template.split("{% for message in messages %}", 1)[1])  # fmt: skip
    return ChatRenderer(tok)


def test_a_template_error_on_an_environment_message_ends_only_that_trajectory(renderer):
    r = _strict_renderer()
    start, conv = _start(r)
    rows = [{"gold": "1", "env": {"name": f"{HERE}:SaysSystem"}}]
    # two trajectories in one round: the first reply draws a system message, the second a user message

    def generate(prompts, sampling):  # trajectory 0 answers "1", trajectory 1 answers "2" in round 0
        out = ScriptedEngine(None, ["x"])(prompts, sampling)
        return [Completion(**{**c.__dict__, "token_ids": ids(txt) + [2], "logprobs": [-0.1, -0.2], "text": txt})
                for c, txt in zip(out, ["1", "2"] if len(prompts) == 2 else ["3"])]

    trajs, counters = run_turns([start], [conv], 2, generate, InlineRunner(), r,
                                TurnSettings(max_turns=2, max_tokens=200, max_new_tokens=8), SAMPLING, rows)
    a, b = trajs
    assert a.end.startswith("env: template error on the environment's answer: TemplateError: System messages")
    assert "Traceback" in a.failure and a.completion().failure == a.failure
    assert (b.end, b.turns) == ("max_turns", 2) and counters["env_failures"] == 1


# -- item 10: an opening over data.max_prompt_tokens; floods not tokenised ----------------------------------------


class LongOpening:
    def __init__(self, chars: int = 100) -> None:
        self.chars = chars

    def reset(self, row):
        return [{"role": "user", "content": "a" * self.chars}]

    def step(self, history, reply):
        return EnvStep([], reward=1.0, done=True)


class Floods:
    def reset(self, row):
        return None

    def step(self, history, reply):
        return EnvStep([{"role": "user", "content": "b" * 1_000_000}])


class CountingRenderer(ChatRenderer):
    """Records the longest text it was asked to tokenise."""

    longest = 0

    def encode(self, text):
        self.longest = max(self.longest, len(text))
        return super().encode(text)


def test_an_environment_opening_over_max_prompt_tokens_ends_that_trajectory(renderer):
    """The opening "<|im_start|>user\\n" + 100 x "a" + "<|im_end|>\\n<|im_start|>assistant\\n" renders to
    1 + 4 + 1 + 100 + 1 + 1 + 1 + 9 + 1 = 119 tokens: over a limit of 118, at 119 it starts."""
    rows = ({"gold": "1", "env": {"name": f"{HERE}:LongOpening", "args": {"chars": 100}}},)
    settings = TurnSettings(max_turns=1, max_tokens=50, max_new_tokens=8, max_prompt_tokens=118)
    (t,), counters, engine = _run(renderer, ["1"], settings, rows=rows)
    assert t.end == ("env: reset's opening renders to 119 tokens, over data.max_prompt_tokens=118: shorten the "
                     "environment's opening or raise data.max_prompt_tokens")
    assert engine.calls == [] and counters["env_failures"] == 1 and t.seq.ids == []
    settings = TurnSettings(max_turns=1, max_tokens=50, max_new_tokens=8, max_prompt_tokens=119)
    (t,), _, engine = _run(renderer, ["1"], settings, rows=rows)
    assert t.end == "max_turns" and len(engine.calls[0][0][0]) == 119
    # a 1 MB opening is refused on its characters, never tokenised (the tiny vocabulary's longest string,
    # "<|im_start|>", has 12 characters: 1_000_000 > 119 * 12)
    r = CountingRenderer(renderer.tokenizer)
    start, conv = _start(r)
    big = {"gold": "1", "env": {"name": f"{HERE}:LongOpening", "args": {"chars": 1_000_000}}}
    (t,), _ = run_turns([start], [conv], 1, ScriptedEngine(None, ["1"]), InlineRunner(), r, settings, SAMPLING, [big])
    assert t.end.startswith("env: reset's opening has 1000000 characters, over data.max_prompt_tokens=119")
    assert r.longest < 1000


def test_a_flooding_observation_is_cut_or_ended_before_it_is_tokenised(renderer):
    """1 MB of "b": with a cap of 5 tokens only its head of 5 x 12 = 60 characters is tokenised and the marker
    estimates the rest at the head's rate (1 token per character: 1_000_000 - 5 = 999_995 tokens cut); with no cap
    the budget (200 tokens) cannot hold it, so the trajectory ends at the budget without tokenising it."""
    rows = ({"gold": "1", "env": {"name": f"{HERE}:Floods"}},)
    r = CountingRenderer(renderer.tokenizer)
    start, conv = _start(r)
    settings = TurnSettings(max_turns=2, max_tokens=200, max_new_tokens=8, max_observation_tokens=5)
    (t,), counters = run_turns([start], [conv], 1, ScriptedEngine(None, ["1", "2"]), InlineRunner(), r, settings,
                               SAMPLING, list(rows))  # fmt: skip
    assert t.messages[2]["content"] == "bbbbb... [about 999995 tokens cut]"
    assert counters["obs_tokens_cut"] == 999_995 and r.longest < 1000 and counters["render_s"] > 0
    r.longest = 0
    settings = TurnSettings(max_turns=2, max_tokens=200, max_new_tokens=8)
    (t,), _ = run_turns([start], [conv], 1, ScriptedEngine(None, ["1", "2"]), InlineRunner(), r, settings,
                        SAMPLING, list(rows))  # fmt: skip
    assert (t.end, t.turns) == ("budget", 1) and r.longest < 1000


def test_cap_observation_counts_exactly_below_the_head_and_leaves_short_messages(renderer):
    """Cap 3 on "abcdefg" (7 characters < 3 x 12): tokenised whole, 4 tokens cut, exact count; "ab" is kept."""
    msgs = [{"role": "user", "content": "abcdefg"}, {"role": "tool", "content": "ab"}]
    out, cut = cap_observation(msgs, renderer, 3)
    assert out == [{"role": "user", "content": "abc... [4 tokens cut]"}, {"role": "tool", "content": "ab"}]
    assert cut == 4 and cap_observation(msgs, renderer, 0) == (msgs, 0)
    assert renderer.max_token_chars == len("<|im_start|>")


# -- item 20: every field of the Completion a trajectory hands on ---------------------------------------------------


class VersionedEngine(ScriptedEngine):
    """ScriptedEngine whose round r samples with policy version 7 - r (an engine restarted on older weights)."""

    def __call__(self, prompts, sampling):
        r = len(self.calls)
        return [Completion(**{**c.__dict__, "policy_version": 7 - r}) for c in super().__call__(prompts, sampling)]


def test_the_completion_carries_every_field_of_the_trajectory(renderer):
    start, conv = _start(renderer)
    engine = VersionedEngine(None, ["8", "12", "11"])
    (t,), _ = run_turns([start], [conv], 1, engine, InlineRunner(), renderer,
                        TurnSettings(max_turns=5, max_tokens=200, max_new_tokens=8), SAMPLING, [ROW])
    c = t.completion()
    between1 = ids("\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n")
    between2 = ids("\n<|im_start|>user\nlower<|im_end|>\n<|im_start|>assistant\n")
    assert c.prompt_ids == start.prompt_ids == ids(
        "<|im_start|>user\nguess a number from 1 to 16<|im_end|>\n<|im_start|>assistant\n")
    assert c.token_ids == ids("8") + [2] + between1 + ids("12") + [2] + between2 + ids("11") + [2]
    assert c.logprobs == ([-0.1, -0.2] + [0.0] * len(between1) + [-0.1, -0.2, -0.3] + [0.0] * len(between2)
                          + [-0.1, -0.2, -0.3])
    assert c.loss_mask == [1, 1] + [0] * 26 + [1, 1, 1] + [0] * 25 + [1, 1, 1]
    assert (c.text, c.finish_reason, c.turns, c.end_reason, c.failure) == ("11", "stop", 3, "done", None)
    assert c.policy_version == 5  # the oldest turn's: rounds sampled with versions 7, 6, 5
    assert c.messages == [{"role": "user", "content": "guess a number from 1 to 16"},
                          {"role": "assistant", "content": "8"}, {"role": "user", "content": "higher"},
                          {"role": "assistant", "content": "12"}, {"role": "user", "content": "lower"},
                          {"role": "assistant", "content": "11"}]  # fmt: skip
    assert c.messages is not t.messages and c.messages[0] is not t.messages[0]  # copies: a sample table may edit
    assert c.opening_messages == 1 and c.turn_rewards == [0.0, 0.0, 1.0]
    assert c.turn_info == [{}, {}, {"tries": 3}]
    assert (c.prompt_index, c.sample_index) == (0, 0)
    # an environment's own opening counts as the opening
    rows = [{"gold": "1", "env": {"name": f"{HERE}:LongOpening", "args": {"chars": 3}}}]
    (_, t), _ = run_turns([start], [conv], 2, ScriptedEngine(None, ["1"]), InlineRunner(), renderer,
                          TurnSettings(max_turns=1, max_tokens=50, max_new_tokens=8), SAMPLING, rows)
    c = t.completion()
    assert c.opening_messages == 1 and c.messages[0] == {"role": "user", "content": "aaa"}
    assert c.prompt_ids == ids("<|im_start|>user\naaa<|im_end|>\n<|im_start|>assistant\n") and c.sample_index == 1
    assert c.finish_reason == "stop" and c.turn_info == []


# -- mutation survivors of rlvr/envs/turns.py (benchmarks/mutation_score.py --module turns) ------------------------


class Recorder:
    """Records the (history, reply) each step is given; answers "again" until the third reply."""

    def reset(self, row):
        return None

    def step(self, history, reply):
        done = len(history) >= 4
        return EnvStep([] if done else [{"role": "user", "content": "again"}], reward=0.5, done=done,
                       info={"history": [m["content"] for m in history], "reply": reply["content"]})


class CountingEncodes(ChatRenderer):
    """Counts its encode calls and their longest text."""

    calls = 0
    longest = 0

    def encode(self, text):
        self.calls += 1
        self.longest = max(self.longest, len(text))
        return super().encode(text)


def test_each_step_gets_the_whole_history_and_the_reply_and_the_counters_are_exact(renderer):
    start, conv = _start(renderer)
    engine = ScriptedEngine(None, ["1", "2", "3"])
    rows = [{"gold": "1", "env": {"name": f"{HERE}:Recorder"}}]
    (t,), counters = run_turns([start], [conv], 1, engine, InlineRunner(), renderer,
                               TurnSettings(max_turns=5, max_tokens=200, max_new_tokens=8), SAMPLING, rows)
    q = "guess a number from 1 to 16"
    assert [i["history"] for i in t.info] == [[q], [q, "1", "again"], [q, "1", "again", "2", "again"]]
    assert [i["reply"] for i in t.info] == ["1", "2", "3"]
    assert counters["turns"] == 3 and counters["env_failures"] == 0 and counters["prefix_breaks"] == 0
    assert counters["obs_tokens_cut"] == 0 and 0 < counters["render_s"] < 60
    assert [c[3] for c in engine.calls] == [1, 1, 1]  # one sample per trajectory each round, whatever sampling.n says
    # nothing rendered when the environment ends at once: render_s stays exactly 0
    (t,), counters = run_turns([start], [conv], 1, ScriptedEngine(None, ["11"]), InlineRunner(), renderer,
                               TurnSettings(max_turns=5, max_tokens=200, max_new_tokens=8), SAMPLING, [ROW])
    assert t.end == "done" and counters == {"turns": 1.0, "env_failures": 0.0, "prefix_breaks": 0.0,
                                            "obs_tokens_cut": 0.0, "render_s": 0.0}  # fmt: skip


def test_end_on_length_false_closes_a_cut_turn_and_the_environment_answers_it(renderer):
    """max_new_tokens 1: "8" + eos is cut to "8" (finish length). end_on_length true ends there; false closes it
    with the whole closing ("<|im_end|>" included, the model never sampled it) and HigherLower answers "higher"; a
    finish other than stop and length (an engine's abort) ends the trajectory with that reason either way."""
    settings = TurnSettings(max_turns=2, max_tokens=200, max_new_tokens=1, end_on_length=True)
    (t,), _, _ = _run(renderer, ["8", "12"], settings)
    assert (t.end, t.turns) == ("length", 1)
    settings = TurnSettings(max_turns=2, max_tokens=200, max_new_tokens=1, end_on_length=False)
    (t,), _, _ = _run(renderer, ["8", "12"], settings)
    between = ids("<|im_end|>\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n")
    assert (t.end, t.turns, t.seq.ids) == ("max_turns", 2, ids("8") + between + ids("1"))
    assert t.seq.mask == [1] + [0] * len(between) + [1]

    class Aborts(ScriptedEngine):
        def __call__(self, prompts, sampling):
            return [Completion(**{**c.__dict__, "finish_reason": "abort"}) for c in super().__call__(prompts, sampling)]

    (t,), _, _ = _run(renderer, ["8"], settings, engine=Aborts(None, ["8"]))
    assert t.end == "abort"


def test_the_budget_pre_check_on_characters_sits_exactly_at_the_bound(renderer):
    """After turn 1 ("1" + eos) 2 tokens are used of 200: room 200 - 2 - 1 = 197 tokens, 197 x 12 = 2364
    characters. A message of 2364 characters is tokenised (it might fit); one of 2365 cannot hold fewer than 198
    tokens and ends the trajectory at the budget untokenised."""
    for chars, tokenised in ((2364, True), (2365, False)):
        r = CountingEncodes(renderer.tokenizer)
        start, conv = _start(r)
        rows = [{"gold": "1", "env": {"name": f"{HERE}:Sized", "args": {"chars": chars}}}]
        (t,), _ = run_turns([start], [conv], 1, ScriptedEngine(None, ["1", "2"]), InlineRunner(), r,
                            TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8), SAMPLING, rows)
        assert t.end == "budget" and (r.longest >= chars) is tokenised
        assert ("cannot fit the 197 tokens left" in t.info[-1]["not_shown"]) is not tokenised
    # a turn that filled the budget (end_on_length false): no room at all, nothing tokenised
    r = CountingEncodes(renderer.tokenizer)
    start, conv = _start(r)
    rows = [{"gold": "1", "env": {"name": f"{HERE}:Sized", "args": {"chars": 5}}}]
    before = r.calls
    (t,), _ = run_turns([start], [conv], 1, ScriptedEngine(None, ["123"]), InlineRunner(), r,
                        TurnSettings(max_turns=3, max_tokens=3, max_new_tokens=8, end_on_length=False), SAMPLING, rows)
    assert (t.end, t.used, r.calls - before) == ("budget", 3, 0)


class Sized:
    def __init__(self, chars: int = 10) -> None:
        self.chars = chars

    def reset(self, row):
        return None

    def step(self, history, reply):
        return EnvStep([{"role": "user", "content": "b" * self.chars}])


def test_an_opening_at_the_character_bound_is_tokenised_and_a_template_error_on_it_is_named(renderer):
    """Limit 100 tokens x 12 = 1200 characters: an opening of 1200 is tokenised (and refused on its 1210 tokens);
    one of 1201 is refused on its characters. An opening the template refuses ends its trajectory."""
    settings = TurnSettings(max_turns=1, max_tokens=50, max_new_tokens=8, max_prompt_tokens=100)
    for chars, why in ((1200, "renders to 1219 tokens"), (1201, "has 1201 characters")):
        rows = ({"gold": "1", "env": {"name": f"{HERE}:LongOpening", "args": {"chars": chars}}},)
        (t,), _, _ = _run(renderer, ["1"], settings, rows=rows)
        assert t.end.startswith(f"env: reset's opening {why}"), t.end
    r = _strict_renderer()
    start, conv = _start(r)
    rows = [{"gold": "1", "env": {"name": f"{HERE}:OpensWithSystemSecond"}}]
    (t,), counters = run_turns([start], [conv], 1, ScriptedEngine(None, ["1"]), InlineRunner(), r, settings,
                               SAMPLING, rows)  # fmt: skip
    assert t.end.startswith("env: template error on reset's opening: TemplateError: System messages")
    assert counters["render_s"] >= 0 and counters["render_s"] < 60 and t.completion().policy_version == 0


class OpensWithSystemSecond:
    def reset(self, row):
        return [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]

    def step(self, history, reply):
        return EnvStep([], reward=1.0, done=True)


def test_a_failure_text_is_its_reason_line_then_the_traceback_trimmed():
    from rlvr.envs.turns import Segment, Trajectory, _fail, _template_failure

    try:
        raise ValueError("x" * 2950)
    except ValueError as e:
        text = _template_failure("here", e)
        import traceback

        tb = "".join(traceback.format_exception(e))
    head, rest = text.split("\n", 1)
    assert head == ("template error on here: ValueError: " + "x" * 2950)[:300] and len(head) == 300
    assert rest == tb[-3000:] and len(tb) > 3000
    t = Trajectory(start=None, sample_index=0, messages=[], seq=Segment(prompt_ids=[]))
    counters = {"env_failures": 0.0}
    _fail(t, "", counters)
    assert (t.end, t.failure, counters["env_failures"]) == ("env: unknown failure", "", 1.0)


def test_cap_observation_at_its_edges(renderer):
    """Cap 1 cuts ("abc" -> "a", 2 cut); a message of exactly the cap's tokens is left as is; a short message
    before a long one does not stop the long one being cut."""
    msgs = [{"role": "user", "content": "abc"}]
    assert cap_observation(msgs, renderer, 1) == ([{"role": "user", "content": "a... [2 tokens cut]"}], 2)
    assert cap_observation(msgs, renderer, 3) == (msgs, 0)
    out, cut = cap_observation([{"role": "tool", "content": "ab"}, {"role": "user", "content": "abcdef"}], renderer, 3)
    assert out == [{"role": "tool", "content": "ab"}, {"role": "user", "content": "abc... [3 tokens cut]"}]
    assert cut == 3


def test_a_prefix_break_records_its_reason_and_a_reset_failure_has_policy_version_0(renderer):
    rows = ({"gold": "7", "env": {"name": "tests/unit/test_env_turns.py:Again"}},)
    (t,), _, _ = _run(rewriting_renderer(), ["3+4=7"], TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8),
                      rows=rows)  # fmt: skip
    assert list(t.info[-1]) == ["prefix_broken"] and "rewrites" in t.info[-1]["prefix_broken"]
    rows = ({"gold": "1", "env": {"name": "nosuchenv"}},)
    (t,), _, _ = _run(renderer, ["1"], TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8), rows=rows)
    c = t.completion()
    assert c.end_reason.startswith("env: error: KeyError") and c.policy_version == 0 and c.token_ids == []


class RecordsBetween(ChatRenderer):
    """Records the (history, assistant text) each boundary is rendered from."""

    seen: list

    def between(self, history, assistant, ended_with_eos, new):
        self.seen = [*getattr(self, "seen", []), ([m["content"] for m in history], assistant, ended_with_eos)]
        return super().between(history, assistant, ended_with_eos, new)


def test_each_boundary_is_rendered_from_the_whole_conversation_before_the_reply(renderer):
    r = RecordsBetween(renderer.tokenizer)
    start, conv = _start(r)
    (t,), _ = run_turns([start], [conv], 1, ScriptedEngine(None, ["8", "12", "11"]), InlineRunner(), r,
                        TurnSettings(max_turns=5, max_tokens=200, max_new_tokens=8), SAMPLING, [ROW])
    q = "guess a number from 1 to 16"
    assert r.seen == [([q], "8", True), ([q, "8", "higher"], "12", True)] and t.end == "done"
