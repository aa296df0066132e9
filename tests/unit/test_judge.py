"""The judge verifier (rlvr/reward/judge.py) and FAPO's flawed-positive penalty: the parse rules on hand-made
verdicts, the prompt, the batch with a fake engine (per-sample failures), the penalty and the judge metrics by
hand, the recipe checks, and one fake loop (the judge's place in the step; not in the weight sync; not in
validation). The real model is in tests/integration/test_judge_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlvr.config import RecipeError
from rlvr.recipe import load_recipe
from rlvr.reward.judge import (JudgeItem, JudgeSettings, flawed_penalties, format_steps, judge_batch, judge_metrics,
                               last_boxed, merge_judged, parse_boxed_score, parse_boxed_step, parse_verdict,
                               parse_yes_no, render_prompt, split_steps)  # fmt: skip
from rlvr.reward.pool import Scored
from rlvr.types import Completion, VerifyResult

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "recipes" / "tiny_test.yaml")
JUDGE_VERIFIERS = "reward.verifiers=[{name: numeric}, {name: judge, weight: 0.0, args: {parse: boxed_step}}]"
WITH_JUDGE = [JUDGE_VERIFIERS, "judge.model=tiny-random"]


# -- parse rules ---------------------------------------------------------------------------------------------------
def test_boxed_step_sound_flawed_and_unparseable():
    assert parse_boxed_step("All steps check out. \\boxed{-1}") == VerifyResult(score=1.0, parsed="-1", reason=None)
    assert parse_boxed_step("Step 2 adds wrongly: \\boxed{2}") == VerifyResult(score=0.0, parsed="2", reason="flawed")
    assert parse_boxed_step("\\boxed{ 0 }").parsed == "0"  # spaces inside the box
    assert parse_boxed_step("first \\boxed{3}, then on reflection \\boxed{-1}").score == 1.0  # the last box wins
    assert parse_boxed_step("first \\boxed{-1}, then \\boxed{1}").parsed == "1"
    for bad in ("no box at all", "\\boxed{-2}", "\\boxed{two}", "\\boxed{1.5}", "\\boxed{1", "\\boxed{}"):
        assert parse_boxed_step(bad) is None, bad


def test_yes_no_takes_the_last_standalone_word():
    assert parse_yes_no("Is it sound? Yes.") == VerifyResult(score=1.0, parsed="yes", reason=None)
    assert parse_yes_no("yes at first, but NO") == VerifyResult(score=0.0, parsed="no", reason="flawed")
    assert parse_yes_no("nobody says yesterday") is None  # not standalone words
    assert parse_yes_no("") is None


def test_boxed_score_in_range_only():
    assert parse_boxed_score("\\boxed{0.25}") == VerifyResult(score=0.25, parsed="0.25", reason="flawed")
    assert parse_boxed_score("\\boxed{1}") == VerifyResult(score=1.0, parsed="1", reason=None)
    assert parse_boxed_score("\\boxed{ 0 } then \\boxed{.5}").score == 0.5
    for bad in ("\\boxed{1.5}", "\\boxed{-0.1}", "\\boxed{high}", "0.5"):
        assert parse_boxed_score(bad) is None, bad


def test_last_boxed_matches_nested_braces():
    assert last_boxed("\\boxed{\\frac{1}{2}} and \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("nothing") is None


def test_unparseable_verdicts_are_scored_zero_with_an_excerpt():
    r = parse_verdict("I think the answer is fine " * 10, "boxed_step")
    assert (r.score, r.parsed) == (0.0, None)
    assert r.reason.startswith("judge_unparseable: 'I think the answer is fine") and len(r.reason) <= 100
    assert parse_verdict("   ", "yes_no").reason == "judge_unparseable: empty verdict"
    assert parse_verdict("\\boxed{7}", "boxed_score").reason.startswith("judge_unparseable")  # out of range


# -- prompt ----------------------------------------------------------------------------------------------------------
def test_steps_split_on_blank_lines_else_lines():
    assert split_steps("a = 1\n\nb = 2\n  \n\nc = 3") == ["a = 1", "b = 2", "c = 3"]
    assert split_steps("a = 1\nb = 2\n") == ["a = 1", "b = 2"]
    assert split_steps("para one\nstill one\n\npara two") == ["para one\nstill one", "para two"]
    assert format_steps("x\ny") == "Step 0: x\nStep 1: y"
    assert format_steps("") == "Step 0: "


def test_template_fields_are_replaced_once_and_other_braces_kept():
    item = JudgeItem(question="What is 2 plus 3?", response="2+3=5\n\\boxed{5}", gold="5")
    out = render_prompt("Q: {question} gold {gold}\n{steps}\nR: {response} put it in \\boxed{}.", item)
    assert out == ("Q: What is 2 plus 3? gold 5\nStep 0: 2+3=5\nStep 1: \\boxed{5}\nR: 2+3=5\n\\boxed{5} "
                   "put it in \\boxed{}.")
    sneaky = JudgeItem(question="{gold}", response="r", gold="G")  # text from the item is not substituted again
    assert render_prompt("{question}|{response}", sneaky) == "{gold}|r"


# -- the batch, with a fake engine -----------------------------------------------------------------------------------
class _Tok:
    """Character-level ids, no chat template (``chat_ids`` then uses the plain text)."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 50 for c in text]}


class _Engine:
    """Answers each prompt by the table ``verdicts`` (keyed by prompt length); raises on the whole batch when a
    prompt of length ``poison`` is in it, and on that prompt alone."""

    def __init__(self, verdicts, poison=None):
        self.verdicts, self.poison, self.calls = verdicts, poison, 0

    def generate(self, prompts, sampling):
        self.calls += 1
        assert (sampling.n, sampling.temperature) == (1, 0.0)
        if any(len(p.prompt_ids) == self.poison for p in prompts):
            raise RuntimeError("engine fell over")
        return [Completion(prompt_index=p.index, sample_index=0, prompt_ids=p.prompt_ids, token_ids=[1], logprobs=[0.0],
                           text=self.verdicts[len(p.prompt_ids)], finish_reason="stop", policy_version=0)
                for p in prompts]  # fmt: skip


def test_batch_in_order_with_per_sample_failures():
    items = [JudgeItem(question="q", response="r" * n, gold="g") for n in (1, 2, 3, 40)]
    st = JudgeSettings(template="{response}", parse="boxed_step", max_new_tokens=8)
    eng = _Engine({1: "\\boxed{-1}", 2: "\\boxed{0}", 3: "no idea"})
    results, texts = judge_batch(eng, _Tok(), items, st, max_model_len=30)  # 40 + 8 tokens > 30: too long
    assert [r.score for r in results] == [1.0, 0.0, 0.0, 0.0]
    assert [r.parsed for r in results] == ["-1", "0", None, None]
    assert results[1].reason == "flawed" and results[2].reason == "judge_unparseable: 'no idea'"
    assert results[3].reason.startswith("judge_unparseable: prompt of 40 tokens")
    assert texts == ["\\boxed{-1}", "\\boxed{0}", "no idea", ""] and eng.calls == 1  # one call for the batch


def test_a_sample_whose_generate_raises_fails_alone():
    items = [JudgeItem(question="q", response="r" * n, gold="g") for n in (1, 2)]
    eng = _Engine({1: "\\boxed{-1}"}, poison=2)
    results, _ = judge_batch(eng, _Tok(), items, JudgeSettings(template="{response}"), max_model_len=200)
    assert results[0] == VerifyResult(score=1.0, parsed="-1", reason=None)
    assert results[1].reason == "judge_unparseable: generate raised RuntimeError: engine fell over"
    assert eng.calls == 3  # the batch, then each alone


# -- FAPO's penalty and the judge metrics, by hand ------------------------------------------------------------------
def _scored(rule, judge=None):
    """Scored samples: the rule verifier ``numeric``'s scores and the judge's verdicts ('ok', 'flawed', 'bad': unparseable,
    '-': not judged)."""
    verdicts = {"ok": VerifyResult(score=1.0, parsed="-1"), "flawed": VerifyResult(score=0.0, parsed="1", reason="flawed"),
                "bad": VerifyResult(score=0.0, reason="judge_unparseable: 'x'"),
                "-": VerifyResult(score=0.0, reason="not_judged")}  # fmt: skip
    out = []
    for i, s in enumerate(rule):
        results = {"numeric": VerifyResult(score=float(s))}
        if judge is not None:
            results["judge"] = verdicts[judge[i]]
        out.append(Scored(reward=float(s), results=results, latency_s=0.0))
    return out


def _completions(n):
    return [Completion(prompt_index=i // 4, sample_index=i % 4, prompt_ids=[1], token_ids=[1, 2], logprobs=[0.0, 0.0],
                       text="", finish_reason="stop", policy_version=0) for i in range(n)]  # fmt: skip


def test_fapo_shaped_rewards_and_grpo_advantages_by_hand():
    from rlvr.algos.advantages import GRPOSettings, grpo
    from rlvr.runtime.rollout_stage import shaped_rewards

    r = load_recipe(TINY, WITH_JUDGE + ["algorithm.flawed_penalty=0.5"])
    scored = _scored([1, 1, 0, 1], ["ok", "flawed", "-", "ok"])
    rewards = shaped_rewards(_completions(4), scored, r)
    assert rewards.tolist() == [[1.0, 0.5, 0.0, 1.0]]  # the flawed positive lands halfway
    # mean 0.625; deviations .375, -.125, -.625, .375; unbiased std sqrt(.6875 / 3) = 0.478714
    adv = grpo(rewards, GRPOSettings())
    assert adv[0].tolist() == pytest.approx([0.78335, -0.26112, -1.30558, 0.78335], abs=1e-5)
    # the paper's scale: correct +1, wrong -1, flawed positive +1 - lambda (1) = 0 -> the same advantages
    paper = grpo(torch.tensor([[1.0, 0.0, -1.0, 1.0]]), GRPOSettings())
    assert torch.allclose(adv, paper, atol=1e-5)
    off = load_recipe(TINY, WITH_JUDGE)  # flawed_penalty 0: the judge's weight-0 verdict changes nothing
    assert shaped_rewards(_completions(4), scored, off).tolist() == [[1.0, 1.0, 0.0, 1.0]]


def test_unparseable_and_wrong_samples_are_not_penalised():
    scored = _scored([1, 0, 1, 1], ["bad", "flawed", "flawed", "ok"])  # sample 1: flawed but wrong: not a positive
    assert flawed_penalties(scored, "numeric", 0.5) == [0.0, 0.0, -0.5, 0.0]
    graded = [Scored(reward=1.0, results={"numeric": VerifyResult(score=1.0),
                                          "judge": VerifyResult(score=0.25, parsed="0.25", reason="flawed")},
                     latency_s=0.0)]  # fmt: skip
    assert flawed_penalties(graded, "numeric", 0.5) == [-0.375]  # boxed_score: -lambda x (1 - 0.25)


def test_judge_metrics_by_hand():
    from rlvr.metrics import names as mn

    scored = _scored([1, 1, 1, 0, 0, 1], ["flawed", "ok", "bad", "-", "-", "flawed"])
    # correct 4 (0, 1, 2, 5), flawed positives 2 (0, 5); judged 4 of 6; unparseable 1 of the 4 judged
    assert judge_metrics(scored, "numeric") == {mn.REWARD_FLAWED_POSITIVE_FRAC: 0.5,
                                                mn.REWARD_JUDGED_FRAC: 4 / 6, mn.REWARD_JUDGE_UNPARSEABLE_FRAC: 0.25}
    none = judge_metrics(_scored([0, 0], ["-", "-"]), "numeric")
    assert none == {mn.REWARD_FLAWED_POSITIVE_FRAC: 0.0, mn.REWARD_JUDGED_FRAC: 0.0, mn.REWARD_JUDGE_UNPARSEABLE_FRAC: 0.0}
    assert judge_metrics(_scored([1]), "numeric") == {}  # no judge ran (validation)


def test_merge_puts_the_judge_after_the_rule_verifiers_and_reweights():
    scored = _scored([1, 0])
    merged = merge_judged(scored, {"judge": [VerifyResult(score=1.0), VerifyResult(score=0.0)]},
                          {"numeric": 1.0, "judge": 0.5})
    assert [list(s.results) for s in merged] == [["numeric", "judge"]] * 2
    assert [s.reward for s in merged] == [1.5, 0.0]
    with pytest.raises(ValueError, match="1 verdicts for 2 samples"):
        merge_judged(scored, {"judge": [VerifyResult(score=1.0)]}, {"numeric": 1.0, "judge": 0.5})


# -- recipe checks ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    ([JUDGE_VERIFIERS], "reward.verifiers[1] is a judge verifier but judge.model is not set"),
    (["algorithm.flawed_penalty=0.5"], "algorithm.flawed_penalty=0.5 needs a judge verifier"),
    ([*WITH_JUDGE, "algorithm.flawed_penalty=-1"], "algorithm.flawed_penalty=-1.0 must be >= 0"),
    (["reward.verifiers=[{name: numeric}, {name: judge, args: {parse: boxed_stp}}]", "judge.model=tiny-random"],
     "'reward.verifiers[1].args.parse' must be one of ['boxed_step', 'yes_no', 'boxed_score'], got 'boxed_stp' "
     "(did you mean 'boxed_step'?)"),
    (["reward.verifiers=[{name: numeric}, {name: judge, args: {prase: yes_no}}]", "judge.model=tiny-random"],
     "unknown key 'reward.verifiers[1].args.prase': did you mean 'reward.verifiers[1].args.parse'?"),
    (["reward.verifiers=[{name: judge}, {name: numeric}]", "judge.model=tiny-random"],
     "reward.verifiers[0] is the judge, but the primary (first) verifier must be a rule verifier"),
    (["reward.verifiers=[{name: numeric}, {name: judge, args: {template: 'Is {gold} right?'}}]", "judge.model=tiny-random"],
     "reward.verifiers[1].args.template must contain {response} or {steps}"),
    ([*WITH_JUDGE, "judge.max_model_len=64"], "reward.verifiers[1].args.max_new_tokens=128 leaves no room"),
    ([*WITH_JUDGE, "algorithm.flawed_penalty=0.5", "algorithm.advantage=passk"], "FAPO's flawed-positive penalty"),
])  # fmt: skip
def test_recipe_checks_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(RecipeError) as e:
        load_recipe(TINY, overrides)
    assert message in str(e.value)


def test_the_judge_role_has_its_own_group_only_with_a_judge_verifier():
    from rlvr.runtime.roles import placement_groups, role_resources

    with_judge = role_resources(load_recipe(TINY, [*WITH_JUDGE, "judge.kv_cache_gib=3", "judge.threads=2"]), {})
    assert "VLLM_CPU_KVCACHE_SPACE" not in with_judge["judge"][0].env and with_judge["judge"][0].group == "judge"
    assert with_judge["judge"][0].env["OMP_NUM_THREADS"] == "2"
    assert "judge" in [g.name for g in placement_groups(with_judge)]
    assert "judge" not in role_resources(load_recipe(TINY, ["judge.model=tiny-random"]), {})  # no judge verifier


def test_judge_is_a_timeline_group():
    from rlvr.metrics.timeline import GROUPS, group_order, role_group

    assert role_group("judge") == "judge" and "judge" in GROUPS
    assert sorted(["trainer0", "judge", "reward", "engine0"], key=group_order) == ["engine0", "reward", "judge", "trainer0"]


# -- one fake loop: the judge's place in the step ---------------------------------------------------------------------
def test_the_loop_judges_after_scoring_outside_sync_and_validation(tmp_path):
    from loop_fakes import FakeExecutor

    from rlvr.metrics import names as mn
    from rlvr.runtime.controller import train

    ex = FakeExecutor()
    r = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.steps=2", "run.save_final=false",
                           "checkpoint.every_steps=0", *WITH_JUDGE, "algorithm.flawed_penalty=0.5",
                           "data.generated.holdout=8", "validation.every_steps=1", "validation.at_start=true",
                           "validation.limit=4", "validation.samples=2", "metrics.samples_every=1",
                           "metrics.samples_rows=2"])  # fmt: skip
    result = train(r, executor=ex)
    calls = [c for c in ex.log.calls if c[1] in ("generate", "score", "judge_with_text", "train_step", "receive_weights")]
    step = [("engine0", "generate"), ("reward", "score"), ("judge", "judge_with_text"), ("trainer0", "train_step"),
            ("engine0", "receive_weights")]  # fmt: skip
    val = [("engine0", "generate"), ("reward", "score")]  # validation: no judge
    assert calls == val + (step + val) * 2
    assert all(s.name != "judge" for s in ex.objects["reward"].result().verifiers)  # the pool never sees the judge
    judge = ex.objects["judge"].result()
    # the fake engine answers even samples right: 2 of G = 4 per prompt, P = 4 -> 8 items per step, all correct
    assert len(judge.items) == 16 and {i.response for i in judge.items} == {i.gold for i in judge.items}
    rows = [json.loads(x) for x in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row["step"] > 0 and mn.TIMING_JUDGE_S in row]
    assert len(steps) == 2
    for row in steps:  # every correct sample judged flawed
        assert (row[mn.REWARD_FLAWED_POSITIVE_FRAC], row[mn.REWARD_JUDGED_FRAC], row[mn.REWARD_JUDGE_UNPARSEABLE_FRAC]) == (1.0, 0.5, 0.0)
        assert row[mn.TIMING_JUDGE_S] >= 0.0 and row[mn.reward_score("judge")] == 0.0
        assert mn.role_busy("judge") in row
    cells = {json.loads(x)["judge"] for x in Path(result.run_dir, "samples.jsonl").read_text().splitlines()}
    assert cells == {"flawed (0)", "not_judged"}  # a right sample (judged) and a wrong one in each table
