"""The Ray placement of GPU roles, on a CUDA machine with vLLM's CUDA build and Ray (markers ``gpu`` and ``gpu_full``;
skipped without CUDA, vLLM or Ray). Issue 27:

- one GPU shared as in recipes/gsm8k_qwen2.5_0.5b_gpu.yaml (engine and trainer fractions, gloo sync): the roles
  start (the engine finished before the trainer allocates, rlvr.runtime.roles.shares_devices), a role at
  ``num_gpus: 0`` (the reward worker, a critic) sees no GPU (``CUDA_VISIBLE_DEVICES=""``) while the engine and the
  trainer see one each, and a rollout and a weight sync with its probe pass;
- two GPUs, whole ones, ``sync.backend: nccl``: the weight sync runs over NCCL and its probe passes.

Not yet run on a GPU: written where no GPU was at hand (it imports and skips there).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.gpu_full,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (pytest -m gpu tests/gpu on a GPU machine)"),
]

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
COMMON = ["run.executor=ray", "rollout.engine=vllm", "model.dtype=bfloat16", "rollout.prompts_per_step=2",
          "rollout.samples_per_prompt=2", "trainer.micro_batch_size=2", "sync.probe_every=1"]  # fmt: skip


def _roles(tmp_path, *overrides):
    pytest.importorskip("vllm")
    pytest.importorskip("ray")
    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.runtime.roles import Roles
    from rlvr.runtime.rollout_stage import generate_and_score

    r = load_recipe(TINY, [f"run.output_dir={tmp_path}", *COMMON, *overrides])
    return Roles(r, resolve_model("tiny-random"), tmp_path)


def _one_step(roles) -> dict[str, float]:
    """A rollout of 2 prompts x 2 samples, then a weight sync to version 1 with its probe: the sync's metrics."""
    from rlvr.types import Prompt, SamplingConfig

    prompts = [Prompt(index=i, text="", prompt_ids=[1, 10 + i, 11], gold=str(i)) for i in range(2)]
    comps, scored, _ = generate_and_score(roles, prompts, SamplingConfig(n=2, max_new_tokens=4))
    assert len(comps) == len(scored) == 4 and all(c.logprobs for c in comps)
    return roles.sync(version=1)


def test_on_a_shared_gpu_a_zero_gpu_role_sees_none_and_a_step_runs(tmp_path):
    import ray

    from rlvr.sync.probe import tolerance

    roles = _roles(tmp_path, "rollout.num_gpus=0.4", "rollout.gpu_memory_utilization=0.3", "trainer.num_gpus=0.4",
                   "sync.backend=gloo", "algorithm.advantage=gae", "algorithm.advantage.lam=0.95", "critic.num_gpus=0")
    try:
        def seen(handle):  # (CUDA_VISIBLE_DEVICES, GPUs torch counts) inside the role's actor
            return ray.get(handle._target.__ray_call__.remote(
                lambda _self: (os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count())), timeout=120)

        assert seen(roles.reward) == ("", 0) and seen(roles.critic) == ("", 0)
        for h in (roles.engines[0], roles.trainers[0]):
            visible, count = seen(h)
            assert visible not in (None, "") and count == 1, (h.name, visible, count)
        m = _one_step(roles)
        assert roles.sync_backend == "gloo" and m["sync/policy_version"] == 1.0
        assert 0.0 <= m["sync/probe_gap_mean"] <= tolerance("bfloat16", None), m
    finally:
        roles.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (a whole one each for trainer and engine)")
def test_whole_gpus_sync_over_nccl(tmp_path):
    from rlvr.sync.probe import tolerance

    roles = _roles(tmp_path, "rollout.num_gpus=1", "rollout.gpu_memory_utilization=0.5", "trainer.num_gpus=1",
                   "sync.backend=nccl")
    try:
        m = _one_step(roles)
        assert roles.sync_backend == "nccl" and m["sync/policy_version"] == 1.0
        assert 0.0 <= m["sync/probe_gap_mean"] <= tolerance("bfloat16", None), m
    finally:
        roles.shutdown()
