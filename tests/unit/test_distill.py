"""On-policy distillation (rlvr.algos.distill, issue 29): the per-token teacher advantage by hand, teacher = student,
the loss mask of multi-turn trajectories, the clip, and the recipe's refusals (teacher without the estimator and the
reverse, a teacher of another tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.algos import ADVANTAGES, LOSS_AGGREGATIONS, POLICY_LOSSES
from rlvr.algos.distill import DistillSettings, teacher_term
from rlvr.config import RecipeError
from rlvr.metrics import names as mn
from rlvr.recipe import load_recipe
from rlvr.runtime.advantage_stage import form_advantages, uses_teacher
from rlvr.train.batch import TrainBatch

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
DISTILL = ["algorithm.advantage=distill", "teacher.model=tiny-random", "rollout.samples_per_prompt=2"]

# two sequences (one group of G = 2), T = 4 positions of the shifted frame. Position 0 scores the last prompt token
# (off the mask); sequence 1's position 2 is an environment token of a multi-turn trajectory (off the mask, where
# pack() leaves the student's logprob at 0 and the teacher's value is whatever the teacher said)
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]])
STUDENT = torch.tensor([[0.0, -1.0, -0.5, -2.0], [0.0, -0.2, 0.0, -3.0]])
TEACHER = torch.tensor([[-9.0, -0.4, -0.5, -14.0], [-7.0, -1.2, -5.0, -0.5]])


def _batch(student: torch.Tensor, mask: torch.Tensor) -> TrainBatch:
    b, t = student.shape
    return TrainBatch(input_ids=torch.zeros(b, t + 1, dtype=torch.long), attention_mask=torch.ones(b, t + 1, dtype=torch.long),
                      loss_mask=mask, rollout_logprobs=student, advantages=torch.zeros(b), max_new_tokens=t)  # fmt: skip


def test_the_advantage_by_hand_on_two_sequences():
    """coef 0.5, clip 10, verifier_weight 2 (base grpo), rewards (1, 0):
    log p_T - log p_S on the mask: row 0 [., 0.6, 0.0, -12.0 -> clipped to -10.0]; row 1 [., -1.0, (env), 2.5];
    times coef 0.5: row 0 [0, 0.3, 0, -5.0]; row 1 [0, -0.5, 0, 1.25].
    GRPO of (1, 0): mean 0.5, unbiased std sqrt(0.5) = 0.70711 -> +-0.5 / (0.70711 + 1e-6) = +-0.707106;
    times verifier_weight 2: +-1.414212, on the mask only.
    A = row 0 [0, 1.714212, 1.414212, -3.585788]; row 1 [0, -1.914212, 0, -0.164212].
    Reverse KL log p_S - log p_T on the 5 masked tokens: -0.6, 0, 12, 1.0, -2.5: sum 9.9; per token 9.9 / 5 = 1.98;
    per sequence (11.4 + -1.5) / 2 = 4.95; clipped 1 of 5 tokens = 0.2."""
    r = load_recipe(None, DISTILL + ["algorithm.advantage.coef=0.5", "algorithm.advantage.clip=10",
                                     "algorithm.advantage.verifier_weight=2"])  # fmt: skip
    assert uses_teacher(r) and isinstance(r.algorithm.advantage.settings, DistillSettings)
    out, critic, m = form_advantages(_batch(STUDENT, MASK), torch.tensor([[1.0, 0.0]]), r, teacher_logprobs=TEACHER)
    expect = torch.tensor([[0.0, 1.714212, 1.414212, -3.585788], [0.0, -1.914212, 0.0, -0.164212]])
    assert critic is None
    assert torch.allclose(out.advantages, expect, atol=1e-5), out.advantages
    assert m[mn.DISTILL_REVERSE_KL_MEAN] == pytest.approx(1.98, abs=1e-6)
    assert m[mn.DISTILL_REVERSE_KL_SEQ_MEAN] == pytest.approx(4.95, abs=1e-6)
    assert m[mn.DISTILL_CLIPPED_FRAC] == pytest.approx(0.2, abs=1e-6)


def test_pure_distillation_ignores_the_rewards():
    """verifier_weight 0 (the default), coef 1, clip 10: A = clip(T - S) on the mask whatever the rewards:
    row 0 [0, 0.6, 0, -10]; row 1 [0, -1.0, 0, 2.5]."""
    r = load_recipe(None, DISTILL)
    for rewards in ([[1.0, 0.0]], [[0.0, 0.0]], [[0.3, 7.0]]):
        out, _, _ = form_advantages(_batch(STUDENT, MASK), torch.tensor(rewards), r, teacher_logprobs=TEACHER)
        assert torch.allclose(out.advantages, torch.tensor([[0.0, 0.6, 0.0, -10.0], [0.0, -1.0, 0.0, 2.5]]), atol=1e-6)


def test_teacher_equal_to_student_gives_zero_advantage_loss_and_gradient():
    r = load_recipe(None, DISTILL)
    out, _, m = form_advantages(_batch(STUDENT, MASK), torch.tensor([[0.0, 0.0]]), r, teacher_logprobs=STUDENT.clone())
    assert torch.equal(out.advantages, torch.zeros_like(MASK))
    assert m[mn.DISTILL_REVERSE_KL_MEAN] == 0.0 and m[mn.DISTILL_REVERSE_KL_SEQ_MEAN] == 0.0
    # the policy-gradient loss of those advantages: zero, and so is its gradient (the trainer's pi_old = the sampler)
    logprobs = STUDENT.clone().requires_grad_(True)
    loss_name = r.algorithm.policy_loss.name
    token_loss, _ = POLICY_LOSSES.get(loss_name)(logprobs, STUDENT.clone(), out.advantages, MASK,
                                                 POLICY_LOSSES.settings_of(r.algorithm.policy_loss))  # fmt: skip
    loss = LOSS_AGGREGATIONS.get(r.algorithm.loss_agg)(token_loss, MASK, num_tokens=float(MASK.sum()), num_seqs=2.0,
                                                       max_len=4)  # fmt: skip
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(logprobs.grad, torch.zeros_like(MASK))


def test_the_mask_excludes_environment_and_prompt_tokens():
    """Whatever the teacher says off the mask (NaN, -1e9 at sequence 1's environment token and the prompt
    position), the term and the KL metrics are those of the masked tokens alone."""
    teacher = TEACHER.clone()
    teacher[1, 2] = float("nan")
    teacher[0, 0] = -1e9
    term, st = teacher_term(teacher, STUDENT, MASK, DistillSettings(clip=0.0))
    assert term[1, 2] == 0.0 and term[0, 0] == 0.0 and term[1, 0] == 0.0
    assert torch.allclose(term, torch.tensor([[0.0, 0.6, 0.0, -12.0], [0.0, -1.0, 0.0, 2.5]]), atol=1e-6)
    assert st["reverse_kl_mean"] == pytest.approx((-0.6 + 0 + 12 + 1.0 - 2.5) / 5, abs=1e-6)
    # an environment token turned into a sampled one changes the answer: the mask is what excludes it
    mask = MASK.clone()
    mask[1, 2] = 1.0
    with pytest.raises(ValueError, match="NaN"):
        teacher_term(teacher, STUDENT, mask, DistillSettings())


def test_the_clip_bounds_each_token_and_0_turns_it_off():
    t = torch.tensor([[-20.0, 0.0, -1.5]])
    s = torch.tensor([[-1.0, -30.0, -1.0]])
    m = torch.ones(1, 3)
    # T - S = [-19, 30, -0.5]
    clipped, st = teacher_term(t, s, m, DistillSettings(clip=2.0, coef=3.0))
    assert clipped.tolist() == [[-6.0, 6.0, -1.5]]
    assert st["clipped_frac"] == pytest.approx(2 / 3)
    free, st = teacher_term(t, s, m, DistillSettings(clip=0.0, coef=1.0))
    assert free.tolist() == [[-19.0, 30.0, -0.5]] and st["clipped_frac"] == 0.0
    assert st["reverse_kl_mean"] == pytest.approx((19 - 30 + 0.5) / 3)


def test_a_missing_teacher_logprobs_is_named():
    r = load_recipe(None, DISTILL)
    with pytest.raises(ValueError, match="teacher's logprobs"):
        form_advantages(_batch(STUDENT, MASK), torch.tensor([[1.0, 0.0]]), r)


def test_the_entry_is_registered_with_its_flags():
    assert ADVANTAGES.flag("distill", "needs_teacher") and ADVANTAGES.flag("distill", "token_advantages")
    assert not ADVANTAGES.flag("grpo", "needs_teacher")


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.advantage=distill"], "teacher.model is not set"),
    (["teacher.model=tiny-random"], "does not use a teacher"),
    (DISTILL + ["algorithm.advantage.coef=-1"], "must all be >= 0"),
    (DISTILL + ["algorithm.advantage.coef=0"], "both 0"),
    (DISTILL + ["algorithm.advantage.base=distill"], "another advantage estimator"),
    (["algorithm.advantage=distill", "teacher.model=tiny-random", "rollout.samples_per_prompt=1",
      "algorithm.advantage.verifier_weight=1"], "compares samples within a group"),
    (DISTILL + ["algorithm.policy_loss=gspo"], "one advantage per sequence"),
    (DISTILL + ["teacher.threads=0"], "teacher.threads"),
])
def test_recipe_refusals(overrides, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(None, overrides)


def test_pure_distillation_needs_no_group():
    r = load_recipe(None, ["algorithm.advantage=distill", "teacher.model=tiny-random", "rollout.samples_per_prompt=1"])
    assert r.teacher.dtype in ("float32", "bfloat16")  # auto resolved at load


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(tmp_path):
    from rlvr.models.tiny import write_tiny_random
    from rlvr.runtime.checks import check_teacher_tokenizer

    with pytest.raises(RecipeError, match=r"teacher.model='smollm2-135m-instruct' and model.path='tiny-random'"):
        check_teacher_tokenizer("tiny-random", "smollm2-135m-instruct")
    # a perturbed copy (other weights, same tokenizer) passes
    write_tiny_random(tmp_path / "teacher", seed=7)
    assert "shares the student's tokenizer" in check_teacher_tokenizer("tiny-random", str(tmp_path / "teacher"))
    # the same vocabulary with one token's id moved is refused
    import json

    path = tmp_path / "teacher" / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    a, b = "7", "8"  # two digits of the tiny WordLevel vocabulary (50 tokens)
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(tok))
    with pytest.raises(RecipeError, match="another id"):
        check_teacher_tokenizer("tiny-random", str(tmp_path / "teacher"))


# -- the teacher role: its group, its alignment, its place in the step (fakes) ---------------------------------------
def test_align_puts_each_row_in_the_shifted_frame():
    from rlvr.rollout.teacher import align, teacher_sequences

    # row 0: 4 tokens, row 1: 2 tokens + 2 padding (pad id 0)
    ids = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])
    am = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    batch = TrainBatch(input_ids=ids, attention_mask=am, loss_mask=torch.zeros(2, 3), rollout_logprobs=torch.zeros(2, 3),
                       advantages=torch.zeros(2), max_new_tokens=3)  # fmt: skip
    assert teacher_sequences(batch) == [[3, 4, 5, 6], [7, 8]]
    assert align(batch, [[-1.0, -2.0, -3.0], [-4.0]]).tolist() == [[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="row 1 of 2 tokens"):
        align(batch, [[-1.0, -2.0, -3.0], [-4.0, -5.0]])


def test_the_teacher_role_has_its_own_group_only_with_distill():
    from rlvr.metrics.timeline import GROUPS
    from rlvr.runtime.roles import placement_groups, role_resources

    res = role_resources(load_recipe(TINY, [*DISTILL, "teacher.threads=2"]), {})
    assert res["teacher"][0].group == "teacher" and res["teacher"][0].env["OMP_NUM_THREADS"] == "2"
    assert "teacher" in [g.name for g in placement_groups(res)] and "teacher" in GROUPS
    assert "teacher" not in role_resources(load_recipe(TINY, []), {})


def test_the_loop_asks_the_teacher_once_per_step_before_the_update(tmp_path):
    """The fake engine samples 2 tokens at logprob -1.0 each, the fake teacher says -0.5 for every token: pure
    distillation (coef 1) gives A = -0.5 - (-1.0) = +0.5 on both sampled tokens of every sequence, 0 elsewhere;
    reverse KL -0.5 nats per token, -1.0 per sequence. The verifiers still score (reward/mean logged)."""
    import json

    from loop_fakes import FakeExecutor

    from rlvr.runtime.controller import train

    ex = FakeExecutor()
    r = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.steps=2", "run.save_final=false",
                           "checkpoint.every_steps=0", *DISTILL])  # fmt: skip
    result = train(r, executor=ex)
    calls = [c for c in ex.log.calls if c[1] in ("generate", "score", "train_step", "receive_weights")]
    step = [("engine0", "generate"), ("reward", "score"), ("teacher", "score"), ("trainer0", "train_step"),
            ("engine0", "receive_weights")]  # fmt: skip
    assert calls == step * 2
    teacher, trainer = ex.objects["teacher"].result(), ex.objects["trainer0"].result()
    assert len(teacher.calls) == 2 and all(len(c) == r.samples_per_step for c in teacher.calls)  # one call per step
    for batch in trainer.batches:
        assert torch.equal(batch.advantages, 0.5 * batch.loss_mask) and batch.loss_mask.sum() == 2 * len(batch)
    rows = [json.loads(x) for x in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert row[mn.DISTILL_REVERSE_KL_MEAN] == pytest.approx(-0.5) and row[mn.DISTILL_REVERSE_KL_SEQ_MEAN] == pytest.approx(-1.0)
        assert row[mn.TIMING_TEACHER_S] >= 0 and 0 <= row[mn.TIMING_TEACHER_SHARE] <= 1
        assert mn.REWARD_MEAN in row and mn.role_busy("teacher") in row
