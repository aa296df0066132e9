"""A rollout engine whose process dies is replaced, given the current weights, and the rollout retried (Ray); also
mid-overlap, as under asynchronous rollout: while the trainer updates, the replacement waits for the update and
takes the weights it produced."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.recipe import load_recipe
from rlvr.models import resolve_model

pytestmark = pytest.mark.integration
TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")


@pytest.mark.slow
def test_killed_engine_is_replaced_with_current_weights(tmp_path):
    from transformers import AutoTokenizer

    from rlvr.runtime.roles import Roles
    from rlvr.runtime.rollout_stage import collect_scored, generate_and_score, submit_rollout
    from rlvr.runtime.executors import RoleError
    from rlvr.train.batch import pack
    from rlvr.types import Prompt, SamplingConfig

    recipe = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=ray", "run.num_cpus=2",
                                "trainer.backend=torch", "trainer.lr=0.01", "rollout.max_restarts=2"])  # fmt: skip
    model_dir = resolve_model("tiny-random")
    tok = AutoTokenizer.from_pretrained(model_dir)
    roles = Roles(recipe, model_dir, tmp_path)
    try:
        prompt = Prompt(index=0, text="", prompt_ids=[1, 10, 11, 12], gold="7")
        sampling = SamplingConfig(n=4, max_new_tokens=8, seed=123)
        comps = generate_and_score(roles, [prompt], sampling)[0]
        batch = pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), tok.pad_token_id, 8)
        roles.get([roles.trainers[0].call("train_step", batch)], 120, "update")
        roles.sync(version=1)
        after = roles.get([roles.trainers[0].call("compute_logprobs", batch)], 60, "t")[0]

        old_actor = roles.engines[0]._target
        import ray

        ray.kill(old_actor, no_restart=True)  # the engine's process dies
        comps2, scored2, timing = generate_and_score(roles, [prompt], sampling)
        assert roles.engines[0]._target is not old_actor
        assert timing["timing/engine_restarts"] == 1.0
        assert len(comps2) == len(scored2) == 4
        assert {c.policy_version for c in comps2} == {1}  # the new engine holds the current policy
        # ... really: its logprobs of a sampled sequence equal the trainer's current ones (fp32)
        seq = comps[0].prompt_ids + comps[0].token_ids
        fresh = roles.get([roles.engines[0].call("sequence_logprobs", [seq])], 60, "e")[0][0]
        lp, n = len(comps[0].prompt_ids), len(comps[0].token_ids)
        assert torch.allclose(torch.tensor(fresh[lp - 1 : lp - 1 + n]), after[0, lp - 1 : lp - 1 + n], atol=1e-4)
        # the sync group was formed anew with the replacement: the next sync works
        assert roles.sync(version=2)["sync/policy_version"] == 2.0
        # mid-overlap (rollout.max_staleness >= 1): an update is submitted (the engines hold version 2, the trainer
        # will hold 3), the engine dies, a rollout is submitted; the replacement waits for the update and is given
        # its weights, labelled 3 (not the engines' last version, 2)
        update = roles.trainers[0].call("train_step", batch)
        roles.trainer_version = 3
        ray.kill(roles.engines[0]._target, no_restart=True)
        comps3, _, timing3 = collect_scored(roles, submit_rollout(roles, [prompt], sampling))
        roles.get([update], 120, "update")
        assert timing3["timing/engine_restarts"] == 2.0
        assert {c.policy_version for c in comps3} == {3} and roles.version == 3
        after3 = roles.get([roles.trainers[0].call("compute_logprobs", batch)], 60, "t")[0]
        fresh3 = roles.get([roles.engines[0].call("sequence_logprobs", [seq])], 60, "e")[0][0]
        assert torch.allclose(torch.tensor(fresh3[lp - 1 : lp - 1 + n]), after3[0, lp - 1 : lp - 1 + n], atol=1e-4)
        assert not torch.allclose(after3, after, atol=1e-4)  # the update did move the weights
        # the restart budget (2) is spent: the next death stops the run with the error
        ray.kill(roles.engines[0]._target, no_restart=True)
        with pytest.raises(RoleError, match="engine0 actor died"):
            generate_and_score(roles, [prompt], sampling)
    finally:
        roles.shutdown()
