"""On-policy distillation through the real loop (issue 29): the tiny model (`tiny-random`) as the student, 2 steps,
a real vLLM teacher role beside the rollout engine, the torch trainer, gloo weight sync; local executor.

Two teachers, two checks worked out independently of the code under test:
- the teacher is the student's own weights (a copy of tiny-random in a folder): at step 1 the student has not moved,
  so the teacher's prompt logprobs of each sampled token must equal the engine's sampled logprobs (both fp32 vLLM,
  temperature 1) and the reverse KL is ~0 -- an alignment off by one position would read ~1 nat here (the tiny
  model is near-uniform over 50 tokens, so two neighbouring tokens' logprobs differ by tenths of a nat);
  with ``verifier_weight: 1`` the GRPO part moves the student in step 1, so at step 2 the KL is no longer 0;
- the teacher is another tiny model (same tokenizer, weights drawn with another seed): the KL is not 0 at step 1.
Measured (2026-12-03, 2 shared cores): teacher = student, reverse KL 0.0 exactly at step 1, 0.0108 nats per token
at step 2; seed-7 teacher 0.093 then -0.013 (k1, a one-sample estimate: negative is possible); the teacher's
call 0.017-0.022 s, 1-13 % of these tiny steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlvr.metrics import names as mn
from rlvr.recipe import load_recipe

pytestmark = pytest.mark.integration  # the first test runs in CI (~35 s); the others are slow
ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "recipes" / "tiny_test.yaml")
VERIFIER = f"{Path(__file__).parent / 'shaping_verifiers.py'}:digit_share"


def _run(tmp_path: Path, teacher_seed: int, *extra: str) -> list[dict]:
    from rlvr.models.tiny import write_tiny_random
    from rlvr.runtime.controller import train

    teacher = tmp_path / f"teacher_seed{teacher_seed}"
    write_tiny_random(teacher, seed=teacher_seed)  # seed 0 is tiny-random's own weights
    recipe = load_recipe(TINY, [
        f"run.output_dir={tmp_path}", "run.steps=2", "run.executor=local", "run.save_final=false",
        "checkpoint.every_steps=0", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
        "rollout.max_new_tokens=16", f"reward.verifiers=[{{name: '{VERIFIER}'}}]",
        "algorithm.advantage=distill", f"teacher.model={teacher}", "teacher.dtype=float32", *extra,
    ])  # fmt: skip
    result = train(recipe)
    return [json.loads(x) for x in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]


def test_teacher_equal_to_the_student_reads_zero_kl_then_the_student_moves(tmp_path):
    rows = _run(tmp_path, 0, "algorithm.advantage.verifier_weight=1")
    assert [r["step"] for r in rows] == [1, 2]
    first, second = rows
    assert abs(first[mn.DISTILL_REVERSE_KL_MEAN]) < 1e-4, first  # vLLM fp32 vs itself: the same logprobs
    assert abs(second[mn.DISTILL_REVERSE_KL_MEAN]) > 1e-3, second  # the GRPO part moved the student in step 1
    for r in rows:
        assert math.isfinite(r["train/loss"]) and r["train/skipped"] == 0.0
        assert r[mn.TIMING_TEACHER_S] > 0 and 0 < r[mn.TIMING_TEACHER_SHARE] < 1
        assert 0.0 <= r[mn.REWARD_MEAN] <= 1.0  # the verifiers still score and log


@pytest.mark.slow
def test_another_teacher_gives_a_nonzero_kl(tmp_path):
    rows = _run(tmp_path, 7)
    for r in rows:
        assert abs(r[mn.DISTILL_REVERSE_KL_MEAN]) > 1e-3 and math.isfinite(r[mn.DISTILL_REVERSE_KL_SEQ_MEAN]), r
        assert math.isfinite(r["train/loss"]) and r["train/skipped"] == 0.0
        assert r[mn.ADV_TOKEN_ABS_MEAN] > 0


@pytest.mark.slow
def test_through_ray_the_teacher_is_an_actor_of_its_own(tmp_path):
    """The same check as the first test with every role a Ray actor: the teacher in its own placement group."""
    rows = _run(tmp_path, 0, "run.executor=ray", "run.num_cpus=2", "algorithm.advantage.verifier_weight=1")
    first, second = rows
    assert abs(first[mn.DISTILL_REVERSE_KL_MEAN]) < 1e-4, first
    assert abs(second[mn.DISTILL_REVERSE_KL_MEAN]) > 1e-3, second
    for r in rows:
        assert r[mn.role_busy("teacher")] > 0 and r[mn.TIMING_TEACHER_S] > 0
        assert math.isfinite(r["train/loss"]) and r["train/skipped"] == 0.0


@pytest.mark.slow
def test_asynchronous_rollout_scores_the_policy_that_sampled(tmp_path):
    """max_staleness 1: step 2 trains on a batch the engine sampled from policy version 0 while step 1's update
    ran, so with the teacher = the starting student its reverse KL is ~0 again (the student's logprobs are the
    rollout's, version 0's: synchronous rollout reads > 1e-3 there, the first test), and the lag is 1 version."""
    rows = _run(tmp_path, 0, "rollout.max_staleness=1", "algorithm.advantage.verifier_weight=1")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert abs(r[mn.DISTILL_REVERSE_KL_MEAN]) < 1e-4, r
        assert math.isfinite(r["train/loss"]) and r["train/skipped"] == 0.0
    assert rows[1][mn.ASYNC_STALENESS_MEAN] == 1.0
