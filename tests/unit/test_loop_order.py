"""The step loop's order, on fakes (tests/unit/loop_fakes.py), in well under a second of loop time: per step
generate -> score -> update -> sync, in that order and nothing else between; DAPO refills generate and score again
before the update; a critic's values come before the update and its own step beside the policy's."""

from __future__ import annotations

from pathlib import Path

from loop_fakes import FakeExecutor

from rlvr.recipe import load_recipe
from rlvr.runtime.controller import train

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
STEP = ("generate", "score", "compute_values", "train_step", "critic_step", "send_weights")


def _run(tmp_path, *overrides, all_right_calls=0, train_s=0.0):
    ex = FakeExecutor(all_right_calls, train_s=train_s)
    r = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.steps=2", "run.save_final=false",
                           "checkpoint.every_steps=0", "sync.probe_every=1", *overrides])  # fmt: skip
    train(r, executor=ex)
    return ex


def test_each_step_generates_scores_updates_then_syncs(tmp_path):
    ex = _run(tmp_path)
    assert ex.log.methods(*STEP) == ["generate", "score", "train_step", "send_weights"] * 2
    trainer = [c for c in ex.log.calls if c[0] == "trainer0"]
    assert trainer[-1] == ("trainer0", "save_state")  # the last step's checkpoint, after its sync


def test_dynamic_sampling_refills_before_the_update(tmp_path):
    """The engine's first call answers every sample right (no group carries signal): DAPO generates and scores a
    second round before the update; step 2's groups are informative at once."""
    ex = _run(tmp_path, "algorithm.dynamic_sampling=true", all_right_calls=1)
    assert ex.log.methods(*STEP) == ["generate", "score", "generate", "score", "train_step", "send_weights",
                                     "generate", "score", "train_step", "send_weights"]  # fmt: skip
    plain = _run(tmp_path / "plain", all_right_calls=1)  # without dynamic sampling: no second round
    assert plain.log.methods(*STEP) == ["generate", "score", "train_step", "send_weights"] * 2


def test_a_critic_values_the_batch_before_both_updates(tmp_path):
    """The critic's values come before the update; the critic's step and the policy's run side by side."""
    ex = _run(tmp_path, "algorithm.advantage=gae", "algorithm.advantage.lam=0.95")
    calls = ex.log.methods(*STEP)
    assert len(calls) == 12
    for step in (calls[:6], calls[6:]):
        assert step[:3] == ["generate", "score", "compute_values"] and step[5] == "send_weights"
        assert sorted(step[3:5]) == ["critic_step", "train_step"]


def test_two_engines_share_the_prompts_in_order_and_both_receive_weights(tmp_path):
    """Two engines (fakes; the recipe check that asks Ray for them is bypassed): the prompts are split between
    them, the completions come back prompt-major in input order whichever engine finishes first, and one sync
    reaches both."""
    import dataclasses

    from rlvr.runtime.roles import Roles
    from rlvr.runtime.rollout_stage import generate_and_score
    from rlvr.types import Prompt, SamplingConfig

    r = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "sync.probe_every=0"])
    r = dataclasses.replace(r, rollout=dataclasses.replace(r.rollout, num_engines=2))
    ex = FakeExecutor()
    from rlvr.models import resolve_model

    roles = Roles(r, resolve_model("tiny-random"), tmp_path, ex)  # its tokenizer builds the sync probe's prompt
    try:
        prompts = [Prompt(index=i, text="", prompt_ids=[1, 10 + i, 11], gold=str(i)) for i in range(4)]
        comps, scored, timing = generate_and_score(roles, prompts, SamplingConfig(n=3, max_new_tokens=4))
        assert [(c.prompt_index, c.sample_index) for c in comps] == [(i, j) for i in range(4) for j in range(3)]
        assert len(scored) == 12 and [s.reward for s in scored[:3]] == [1.0, 0.0, 1.0]  # gold, wrong, gold
        assert [role for role, m in ex.log.calls if m == "generate"].count("engine1") == 1
        roles.sync(version=1)
        assert roles.get([e.call("get_policy_version") for e in roles.engines], 10, "versions") == [1, 1]
    finally:
        roles.shutdown()


def _calls_from_the_stage(tmp_path, *overrides, **fakes) -> tuple[set[str], set[str]]:
    """Run the loop on fakes with a profiler on the controller's thread: (the functions of rlvr/runtime/roles.py
    that rlvr/runtime/rollout_stage.py calls, the rollout stage's functions called at all)."""
    import sys

    into_roles, in_stage = set(), set()

    def profile(frame, event, arg):
        if event != "call":
            return
        here, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename if frame.f_back else ""
        if here.endswith("runtime/rollout_stage.py"):
            in_stage.add(frame.f_code.co_name)
        elif here.endswith("runtime/roles.py") and caller.endswith("runtime/rollout_stage.py"):
            into_roles.add(frame.f_code.co_name)

    ex = FakeExecutor(**fakes)
    r = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.steps=3", "run.save_final=false",
                           "checkpoint.every_steps=0", "sync.probe_every=0", *overrides])  # fmt: skip
    sys.setprofile(profile)
    try:
        train(r, executor=ex)
    finally:
        sys.setprofile(None)
    return into_roles, in_stage


def test_a_batch_walks_through_the_rollout_stage_and_only_waits_on_the_roles(tmp_path):
    """Issue 39: a batch's way (draw, generate, score, judge, shape, refill, drop stale) is the rollout stage's
    from top to bottom; of the roles module it calls nothing but the waits on the roles' calls (``get``,
    ``as_completed``): on-policy with DAPO's refill, and at N = 1 with a stale batch regenerated."""
    into_roles, in_stage = _calls_from_the_stage(tmp_path / "dapo", "algorithm.dynamic_sampling=true",
                                                 all_right_calls=1)  # fmt: skip
    assert into_roles == {"get", "as_completed"}
    assert {"take", "start", "submit_rollout", "finish", "collect_scored", "refill_groups", "drop_stale"} <= in_stage
    into_roles, in_stage = _calls_from_the_stage(tmp_path / "async", "rollout.max_staleness=1", stale_call=2)
    assert into_roles == {"get", "as_completed"}
    assert {"fill", "take", "collect_ahead", "generate_and_score", "shaped_rewards"} <= in_stage


def test_a_checkpoint_written_in_the_background_is_committed_after_the_next_rollout(tmp_path):
    """checkpoint.async_write with a checkpoint every step, 3 steps: steps 1 and 2 ask the trainer to
    write in the background and then to say when it is done (wait_saved, queued right behind); the controller
    commits each after the next step's rollout, before its update; the last step's checkpoint is written at once.
    Every checkpoint ends complete."""
    from rlvr.runtime.checkpoint import list_complete

    ex = _run(tmp_path, "run.steps=3", "checkpoint.every_steps=1", "checkpoint.keep_last=0",
              "checkpoint.async_write=true", train_s=0.3)
    trainer = [m for role, m in ex.log.calls if role == "trainer0" and m in
               ("train_step", "save_state", "save_state background", "wait_saved")]  # fmt: skip
    assert trainer == ["train_step", "save_state background", "wait_saved"] * 2 + ["train_step", "save_state"]
    done = list_complete(tmp_path / "tiny_test")
    assert [p.name for p in done] == ["step_000001", "step_000002", "step_000003"]
    # committed only once the writing ended (the fake's writing takes 0.3 s, its rollout none)
    saved_at = ex.objects["trainer0"].result().saved_at
    assert all((p / "COMPLETE").stat().st_mtime >= t for p, t in zip(done, saved_at))
    off = _run(tmp_path / "off", "run.steps=2", "checkpoint.every_steps=1")  # the default: written in the step
    assert [m for role, m in off.log.calls if role == "trainer0" and m.startswith("save_state")] == ["save_state"] * 2
