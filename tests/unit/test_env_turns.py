"""The real turn loop (rlvr.envs.turns.run_turns) driven by a scripted engine (fixed outputs) and the in-process
environment runner, on the tiny model's character-level tokenizer, so every id is worked out by hand from its
vocabulary (rlvr.models.tiny.VOCAB: one id per character, <|im_start|> = 1, <|im_end|> = 2)."""

from __future__ import annotations

import pickle

import torch

import pytest
from transformers import AutoTokenizer

from rlvr.envs.base import EnvStep
from rlvr.envs.builtins import Guess
from rlvr.envs.runner import InlineRunner
from rlvr.envs.tokens import ChatRenderer
from rlvr.envs.turns import TurnSettings, run_turns
from rlvr.models import resolve_model
from rlvr.models.tiny import VOCAB
from rlvr.types import Completion, Prompt, SamplingConfig

HERE = "tests.unit.test_env_turns"


def ids(text: str) -> list[int]:
    """Hand tokenisation: one id per character, the two ChatML markers as one id each."""
    return hand_ids(text, VOCAB, ("<|im_start|>", "<|im_end|>"))


def hand_ids(text: str, vocab: dict[str, int], specials) -> list[int]:
    """``text`` as ids of a character-level ``vocab``: each of ``specials`` one id, every other character one id."""
    out, i = [], 0
    while i < len(text):
        for special in specials:
            if text.startswith(special, i):
                out.append(vocab[special])
                i += len(special)
                break
        else:
            out.append(vocab[text[i]])
            i += 1
    return out


class HigherLower:
    """A lowercase guessing game for this test (the tiny vocabulary has no capitals)."""

    def __init__(self, secret: int = 11) -> None:
        self.secret, self.tries = secret, 0

    def reset(self, row):
        self.secret = int(row["gold"])
        return None

    def step(self, history, reply):
        self.tries += 1
        g = int(reply["content"])
        if g == self.secret:
            return EnvStep([], reward=1.0, done=True, info={"tries": self.tries})
        word = "higher" if g < self.secret else "lower"
        return EnvStep([{"role": "user", "content": word}], reward=0.0, done=False)


class ScriptedEngine:
    """Answers round r with ``script[r]`` for every prompt; logprob of the k-th token of a turn: -(k + 1) / 10."""

    def __init__(self, tok, script: list[str], eos: int = 2) -> None:
        self.tok, self.script, self.eos, self.calls = tok, script, eos, []

    def __call__(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[Completion]:
        r = len(self.calls)
        self.calls.append(([list(p.prompt_ids) for p in prompts], [p.max_new_tokens for p in prompts], sampling.seed,
                           sampling.n))  # fmt: skip
        out = []
        for p in prompts:
            toks = ids(self.script[r]) + [self.eos]
            n = min(len(toks), p.max_new_tokens)
            out.append(Completion(prompt_index=p.index, sample_index=0, prompt_ids=list(p.prompt_ids),
                                  token_ids=toks[:n], logprobs=[-(k + 1) / 10 for k in range(n)],
                                  text=self.script[r], finish_reason="stop" if n == len(toks) else "length",
                                  policy_version=7))
        return out


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(AutoTokenizer.from_pretrained(resolve_model("tiny-random")))


def _start(renderer, question="guess a number from 1 to 16"):
    conv = [{"role": "user", "content": question}]
    return Prompt(index=0, text="", prompt_ids=renderer.opening_ids(conv), gold="11"), conv


ROW = {"gold": "11", "env": {"name": "tests/unit/test_env_turns.py:HigherLower"}}


def test_a_three_turn_trajectory_by_hand(renderer):
    start, conv = _start(renderer)
    engine = ScriptedEngine(renderer.tokenizer, ["8", "12", "11"])
    settings = TurnSettings(max_turns=5, max_tokens=200, max_new_tokens=8)
    trajs, counters = run_turns([start], [conv], 1, engine, InlineRunner(), renderer, settings,
                                SamplingConfig(n=1, max_new_tokens=8, seed=100), [ROW])
    (t,) = trajs
    prompt = ids("<|im_start|>user\nguess a number from 1 to 16<|im_end|>\n<|im_start|>assistant\n")
    assert start.prompt_ids == prompt
    between1 = ids("\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n")
    between2 = ids("\n<|im_start|>user\nlower<|im_end|>\n<|im_start|>assistant\n")
    expected = ids("8") + [2] + between1 + ids("12") + [2] + between2 + ids("11") + [2]
    seg = t.seq
    assert seg.prompt_ids == prompt and seg.ids == expected
    assert seg.mask == [1, 1] + [0] * len(between1) + [1, 1, 1] + [0] * len(between2) + [1, 1, 1]
    assert seg.logprobs == ([-0.1, -0.2] + [0.0] * len(between1) + [-0.1, -0.2, -0.3] + [0.0] * len(between2)
                            + [-0.1, -0.2, -0.3])
    assert (t.turns, t.end, t.turn_rewards, t.last_text) == (3, "done", [0.0, 0.0, 1.0], "11")
    assert t.info[-1] == {"tries": 3}  # the environment's state travelled with the trajectory (pickled each step)
    # token-in: the engine was shown exactly the trajectory's ids so far, each round
    assert [c[0][0] for c in engine.calls] == [prompt, prompt + expected[:2 + len(between1)],
                                               prompt + expected[:2 + len(between1) + 3 + len(between2)]]
    assert [c[2] for c in engine.calls] == [100, 10_000_119, 20_000_138]  # round r: seed + r * 10_000_019
    # the conversation rendered at once gives the same ids (the last turn's closing "\n" was never sampled)
    whole = renderer.encode(renderer.render(t.messages, generation_prompt=False))
    assert prompt + expected == whole[:-1]
    c = t.completion()
    assert c.loss_mask == seg.mask and c.sampled_tokens == 8 and c.turns == 3 and c.end_reason == "done"
    assert c.token_ids == expected and c.text == "11" and c.policy_version == 7


def test_turns_end_at_max_turns_the_budget_and_the_token_limit(renderer):
    start, conv = _start(renderer)
    settings = TurnSettings(max_turns=2, max_tokens=200, max_new_tokens=8)
    (t,), _ = run_turns([start], [conv], 1, ScriptedEngine(None, ["1", "2", "3"]), InlineRunner(), renderer,
                        settings, SamplingConfig(n=1, max_new_tokens=8), [ROW])
    assert (t.turns, t.end) == (2, "max_turns")
    # budget: turn 1 takes 2 tokens; the separator to turn 2 takes 26 (1 + 1 + 4 + 1 + 6 + 1 + 1 + 1 + 9 + 1 for
    # "\n", "<|im_start|>", "user", "\n", "higher", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"):
    # with a budget of 28, 2 + 26 + 1 > 28 leaves no room for a turn
    between = ids("\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n")
    assert len(between) == 26
    settings = TurnSettings(max_turns=5, max_tokens=28, max_new_tokens=8)
    (t,), _ = run_turns([start], [conv], 1, ScriptedEngine(None, ["1", "2"]), InlineRunner(), renderer,
                        settings, SamplingConfig(n=1, max_new_tokens=8), [ROW])
    assert (t.turns, t.end, t.seq.ids) == (1, "budget", ids("1") + [2])
    # room for the separator: the next turn may sample only what is left of the budget (29 - 28 = 1 token)
    settings = TurnSettings(max_turns=5, max_tokens=29, max_new_tokens=8)
    engine = ScriptedEngine(None, ["1", "12"])
    (t,), _ = run_turns([start], [conv], 1, engine, InlineRunner(), renderer, settings,
                        SamplingConfig(n=1, max_new_tokens=8), [ROW])
    assert [c[1] for c in engine.calls] == [[8], [1]]
    assert (t.turns, t.end, t.last_finish) == (2, "length", "length")


class Broken:
    def reset(self, row):
        return None

    def step(self, history, reply):
        if reply["content"] == "1":
            raise RuntimeError("boom")
        if reply["content"] == "2":
            return "not a step"
        return EnvStep([{"role": "user", "content": "again"}], reward=2.0)


def test_an_environment_that_raises_or_answers_garbage_ends_only_its_trajectory(renderer):
    start, conv = _start(renderer)
    rows = [{"gold": "11", "env": {"name": "tests/unit/test_env_turns.py:Broken"}}]
    engine = ScriptedEngine(None, ["1"])
    trajs, counters = run_turns([start], [conv], 3, engine, InlineRunner(), renderer,
                                TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8),
                                SamplingConfig(n=1, max_new_tokens=8), rows)
    assert [t.end for t in trajs] == ["env: error: RuntimeError: boom"] * 3 and counters["env_failures"] == 3
    for script, why in (("2", "env: bad output: step returned str"), ("3", "env: bad output: step returned the reward 2.0")):
        (t,), _ = run_turns([start], [conv], 1, ScriptedEngine(None, [script]), InlineRunner(), renderer,
                            TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8),
                            SamplingConfig(n=1, max_new_tokens=8), rows)
        assert t.end.startswith(why), t.end


def test_guess_answers_higher_lower_and_keeps_its_guesses():
    env = Guess(low=1, high=16)
    assert env.reset({"gold": "11"}) is None
    s = env.step([], {"role": "assistant", "content": "I guess 8"})
    assert (s.done, s.reward, s.messages[0]["content"]) == (False, 0.0, "8 is wrong: my number is higher. Guess again.")
    env = pickle.loads(pickle.dumps(env))
    s = env.step([], {"role": "assistant", "content": "maybe 12?"})
    assert "lower" in s.messages[0]["content"]
    s = env.step([], {"role": "assistant", "content": "no number"})
    assert s.info == {"guess": None} and "whole number between 1 and 16" in s.messages[0]["content"]
    s = env.step([], {"role": "assistant", "content": "11"})
    assert (s.done, s.reward, env.guesses) == (True, 1.0, [8, 12, 11])
    with pytest.raises(ValueError, match=r"gold 17 lies outside \[1, 16\]"):  # a game no guess could win
        Guess(low=1, high=16).reset({"gold": "17"})
    assert Guess(low=1, high=16).reset({"gold": "17", "high": 20}) is None  # the row's own bounds


def test_the_process_pool_ends_only_the_trajectory_whose_step_hangs_crashes_or_floods(renderer):
    from rlvr.envs.pool import EnvPool

    row = {"gold": "1", "env": {"name": "tests/unit/envs_misbehave.py:Misbehaves"}}
    with EnvPool(num_workers=2, timeout_s=2.0, memory_mb=1024) as pool:
        states = pool.reset([row] * 4)
        assert all(s is not None and op == [] for s, op in states), states
        replies = ["h", "d", "m", "fine"]
        out = pool.step([(s, [], {"role": "assistant", "content": r}) for (s, _), r in zip(states, replies)])
        assert [o[1].split("\n", 1)[0] if o[0] is None else "ok" for o in out] == [  # the reasons (then detail)
            "timeout", "crashed", "error: MemoryError: ", "ok"]
        assert out[3][1].done and pool.stats()["timeouts"] == 1 and pool.stats()["crashes"] == 1
        bad = pool.reset([{"gold": "1", "env": {"name": "nosuchenv"}}])
        assert bad[0][0] is None and "unknown environment 'nosuchenv'" in bad[0][1]


class Again:
    def reset(self, row):
        return None

    def step(self, history, reply):
        return EnvStep([{"role": "user", "content": "again"}])


def rewriting_renderer() -> ChatRenderer:
    """The tiny model's template with earlier assistant turns losing what comes before "=" (a stand-in for Qwen3's
    dropped reasoning): a second turn breaks the prefix property."""
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny-random"))
    tok.chat_template = tok.chat_template.replace(
        "message['content']", "(message['content'].split('=')[-1] if message['role'] == 'assistant' and not loop.last "
        "else message['content'])")
    return ChatRenderer(tok)


def test_a_template_that_rewrites_history_ends_the_trajectory_as_sampled(renderer):
    r = rewriting_renderer()
    start, conv = _start(r)
    rows = [{"gold": "7", "env": {"name": "tests/unit/test_env_turns.py:Again"}}]
    (t,), counters = run_turns([start], [conv], 1, ScriptedEngine(None, ["3+4=7"]), InlineRunner(), r,
                               TurnSettings(max_turns=3, max_tokens=200, max_new_tokens=8),
                               SamplingConfig(n=1, max_new_tokens=8), rows)
    assert (t.end, t.broken, counters["prefix_breaks"], t.turns) == ("prefix_broken", 1, 1.0, 1)
    assert t.seq.ids == ids("3+4=7") + [2] and t.seq.mask == [1] * 6  # nothing appended after the break
    # the same replies under the unmodified template go on to the next turn
    (t,), counters = run_turns([start], [conv], 1, ScriptedEngine(None, ["3+4=7", "7"]), InlineRunner(), renderer,
                               TurnSettings(max_turns=2, max_tokens=200, max_new_tokens=8),
                               SamplingConfig(n=1, max_new_tokens=8), rows)
    assert (t.end, counters["prefix_breaks"], t.turns) == ("max_turns", 0.0, 2)


def test_pack_keeps_the_loss_on_sampled_tokens_only():
    from rlvr.train.batch import pack

    # prompt [1, 5], then sampled [6, 2], environment [7, 8], sampled [9, 2]
    c = Completion(prompt_index=0, sample_index=0, prompt_ids=[1, 5], token_ids=[6, 2, 7, 8, 9, 2],
                   logprobs=[-0.5, -0.1, 0.0, 0.0, -0.7, -0.2], text="", finish_reason="stop", policy_version=0,
                   loss_mask=[1, 1, 0, 0, 1, 1], turns=2)
    single = Completion(prompt_index=1, sample_index=0, prompt_ids=[1], token_ids=[6, 2], logprobs=[-0.3, -0.4],
                        text="", finish_reason="stop", policy_version=0)
    b = pack([c, single], torch.zeros(2), pad_id=0, max_new_tokens=4)
    # shifted frame: position t predicts input_ids[t + 1]; the first response token sits at position len(prompt) - 1
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0]]
    assert b.rollout_logprobs[0].tolist() == pytest.approx([0, -0.5, -0.1, 0, 0, -0.7, -0.2])
    assert (c.sampled_tokens, single.sampled_tokens) == (4, 2)


def test_trajectory_rewards_follow_the_recipe():
    import types

    from rlvr.envs.rollout import trajectory_rewards
    from rlvr.reward.pool import Scored
    from rlvr.types import VerifyResult

    def comp(turns, rewards):
        return Completion(prompt_index=0, sample_index=0, prompt_ids=[1], token_ids=[2], logprobs=[0.0], text="",
                          finish_reason="stop", policy_version=0, turns=turns, turn_rewards=rewards, end_reason="done")

    cs = [comp(1, [1.0]), comp(3, [0.0, None, 0.5]), comp(2, [None, None])]
    sc = [Scored(reward=r, results={"m": VerifyResult(score=r)}, latency_s=0.0) for r in (1.0, 0.0, 1.0)]
    env = types.SimpleNamespace(reward="verifiers", turn_discount=1.0)
    assert [s.reward for s in trajectory_rewards(cs, sc, env)] == [1.0, 0.0, 1.0]
    env.reward = "environment"
    assert [s.reward for s in trajectory_rewards(cs, sc, env)] == [1.0, 0.5, 0.0]  # the last reward given; none: 0
    env.reward, env.turn_discount = "both", 0.5
    # (1 + 1) * 0.5^0, (0 + 0.5) * 0.5^2, (1 + 0) * 0.5^1
    out = trajectory_rewards(cs, sc, env)
    assert [s.reward for s in out] == [2.0, 0.125, 0.5] and out[1].results["m"].score == 0.0


def test_the_sample_table_shows_the_conversation_with_turns_marked():
    from rlvr.metrics.samples import conversation_text

    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "guess"},
            {"role": "assistant", "content": "8"}, {"role": "user", "content": "higher"},
            {"role": "assistant", "content": "11"}]
    assert conversation_text(msgs) == "[assistant 1] 8 / [user] higher / [assistant 2] 11"
    # a few-shot opening (its own user, assistant and tool turns) is not the trajectory's: only what follows it
    shot = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "<call>"},
            {"role": "tool", "content": "2"}, {"role": "assistant", "content": "2"}, {"role": "user", "content": "q"}]
    own = [{"role": "assistant", "content": "<call 2>"}, {"role": "tool", "content": "5"},
           {"role": "assistant", "content": "5"}]
    assert conversation_text(shot + own, len(shot)) == "[assistant 1] <call 2> / [tool] 5 / [assistant 2] 5"


def test_a_row_with_messages_opens_with_them_as_is(renderer):
    from rlvr.config import DataConfig
    from rlvr.data.datasets import build_prompts, row_messages

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1"},
            {"role": "assistant", "content": "3"}, {"role": "user", "content": "wrong, again"}]
    rows = [{"question": "wrong, again", "gold": "2", "row": {"messages": msgs, "answer": "2"}},
            {"question": "2+2", "gold": "4", "row": {"question": "2+2", "answer": "4"}}]
    cfg = DataConfig(system_prompt="sys", max_prompt_tokens=200)
    prompts, _ = build_prompts(rows, renderer.tokenizer, cfg)
    assert prompts[0].prompt_ids == ids("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n1+1<|im_end|>\n"
                                        "<|im_start|>assistant\n3<|im_end|>\n<|im_start|>user\nwrong, again<|im_end|>\n"
                                        "<|im_start|>assistant\n")
    assert prompts[1].prompt_ids == ids("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\n2+2<|im_end|>\n"
                                        "<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="field 'messages' must be a list"):
        row_messages({"messages": [{"role": "bot", "content": "x"}]}, "row 3")


def test_load_rows_takes_the_question_of_a_messages_row_from_its_last_user_message(tmp_path):
    import json

    from rlvr.config import DataConfig
    from rlvr.data.datasets import load_rows

    f = tmp_path / "m.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "3"},
                                          {"role": "user", "content": "again"}], "answer": "2"}) + "\n")
    (row,) = load_rows(DataConfig(source=str(f)), 0)
    assert (row["question"], row["gold"]) == ("again", "2")


def test_the_loss_and_its_gradient_ignore_environment_tokens():
    """A 2-turn trajectory packed and through the real objective (issue 25): prompt [1, 5], sampled [6, 2],
    environment/template [7, 8], sampled [9, 2]. Advantage 1.5, old = current logprobs (ratio 1), PPO-clip,
    token_mean: each of the 4 sampled tokens contributes -A * ratio = -1.5, so the loss is -1.5 * 4 / 4 = -1.5 (a
    mask counting the 2 environment tokens would give -1.5 * 6 / 6 with their ratios, or divide by 6: -1.0). The
    gradient with respect to the logits is zero at the positions that predict environment tokens and at the
    prompt, and not zero at the sampled ones."""
    from rlvr.algos.logprobs import token_logprobs
    from rlvr.algos.objective import micro_batch_loss
    from rlvr.config import AlgorithmConfig
    from rlvr.train.batch import pack

    c = Completion(prompt_index=0, sample_index=0, prompt_ids=[1, 5], token_ids=[6, 2, 7, 8, 9, 2],
                   logprobs=[-0.5, -0.1, 0.0, 0.0, -0.7, -0.2], text="", finish_reason="stop", policy_version=0,
                   loss_mask=[1, 1, 0, 0, 1, 1], turns=2)
    b = pack([c], torch.tensor([1.5]), pad_id=0, max_new_tokens=6)
    torch.manual_seed(0)
    logits = torch.randn(1, 8, 10, requires_grad=True)  # [B, L, V]: L = 2 prompt + 6 trajectory ids
    lp = token_logprobs(logits[:, :-1], b.input_ids[:, 1:], 1.0)  # [B, T = L - 1]: position t predicts id t + 1
    mask = b.loss_mask.float()
    n = float(mask.sum())
    assert n == 4.0
    cfg = AlgorithmConfig(policy_loss="ppo_clip", loss_agg="token_mean", kl_coef=0.0)
    out = micro_batch_loss(cfg, lp, lp.detach(), b.advantages, mask, rollout_logprobs=lp.detach(), num_tokens=n,
                           num_seqs=1.0, max_len=6)  # fmt: skip
    assert float(out.loss.detach()) == pytest.approx(-1.5, abs=1e-6)
    out.backward.backward()
    g = logits.grad[0].abs().sum(-1)  # [L]
    # positions 0..6 predict ids 1..7 = [5, 6, 2, 7, 8, 9, 2]: sampled at 1, 2, 5, 6; environment at 3, 4; prompt 0
    assert g[[0, 3, 4, 7]].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert all(x > 0 for x in g[[1, 2, 5, 6]].tolist())


def test_rollout_metrics_count_how_trajectories_ended_and_end_on_length_is_a_recipe_key(renderer):
    """Six trajectories in groups of 3: ends done, length, length | budget, env: timeout, done; correct
    (primary score 1): the two 'done' ones, one after 2 turns. By hand over B = 6: turns (1+1+2+3+1+2)/6 = 10/6,
    solved after turn 1 1/6, length 2/6, budget 1/6, env failures 1/6."""
    from rlvr.recipe import load_recipe
    from rlvr.reward.pool import Scored
    from rlvr.runtime.rollout_stage import rollout_metrics
    from rlvr.types import VerifyResult

    ends = [("done", 1, 1.0), ("length", 1, 0.0), ("length", 2, 0.0), ("budget", 3, 0.0), ("env: timeout", 1, 0.0),
            ("done", 2, 1.0)]  # fmt: skip
    cs = [Completion(prompt_index=i // 3, sample_index=i % 3, prompt_ids=[1], token_ids=[2], logprobs=[0.0], text="",
                     finish_reason="stop", policy_version=0, turns=t, end_reason=e) for i, (e, t, _) in enumerate(ends)]
    sc = [Scored(reward=r, results={"m": VerifyResult(score=r)}, latency_s=0.0) for _, _, r in ends]
    m = rollout_metrics(cs, sc, (1,), 3, "m")
    assert m["rollout/turns_mean"] == pytest.approx(10 / 6)
    assert m["rollout/solved_after_turn_1"] == pytest.approx(1 / 6)
    assert m["rollout/length_end_frac"] == pytest.approx(2 / 6)
    assert m["rollout/budget_end_frac"] == pytest.approx(1 / 6)
    assert m["rollout/env_failed_frac"] == pytest.approx(1 / 6)
    # the recipe key reaches the turn loop's settings
    from rlvr.envs.rollout import TurnRollouts

    for value in (True, False):
        r = load_recipe("recipes/tiny_test.yaml", ["environment.name=guess", f"environment.end_on_length={value}"])
        tr = TurnRollouts(r.environment, r.data, r.rollout.max_new_tokens, resolve_model("tiny-random"))
        try:
            assert tr.settings.end_on_length is value
        finally:
            tr.close()
