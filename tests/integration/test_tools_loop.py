"""Tool use through the real loop (issue 26): recipes/tools_cpu.yaml's model, data and tool, made small (1 prompt x 4
samples, 2 steps), under Ray and under the local executor. The embedded SmolLM2-135M-Instruct with the data's two
worked examples calls the calculator in most trajectories (measured: 60% of 128 with rlvr eval --tools), so the
calls here are the model's own: parsed, run in the tool pool, answered with the product, trained on.

The tiny random model cannot stand in: its character-level tokenizer makes the tools listing ~940 tokens, more than
its 512-token context (the load check refuses it, counting the listing)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlvr.recipe import load_recipe

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "tools_cpu.yaml")


def _small(tmp_path: Path, executor: str) -> list[str]:
    return [f"run.executor={executor}", f"run.name={executor}", f"run.output_dir={tmp_path}", "run.steps=2",
            "run.save_final=false", "rollout.prompts_per_step=1", "rollout.samples_per_prompt=4",
            "rollout.max_new_tokens=40", "trainer.micro_batch_size=4", "trainer.lr=1e-5", "metrics.samples_every=1",
            "checkpoint.every_steps=0", "tools.num_workers=1", "reward.num_workers=1",
            "environment.max_tokens=128", "rollout.kv_cache_gib=0.5",
            # fp32 on every CPU: what the model samples (and so whether it writes a well-formed call) is then the
            # same on AVX2-only machines and on those with AVX512-BF16, where auto picks bf16
            "model.dtype=float32"]  # fmt: skip


def _check(run_dir: Path) -> None:
    rows = [json.loads(x) for x in Path(run_dir, "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) >= 1]
    assert [r["step"] for r in rows] == [1, 2]
    calls = sum(r["tools/calls_per_traj"] for r in rows)
    ok = sum(r.get("tools/calculator/ok", 0.0) for r in rows)
    assert calls > 0 and ok > 0, rows  # the model's own calls were run (8 trajectories, ~60% call)
    assert all(0.0 < r["tools/time_frac"] < 1.0 for r in rows), rows  # (each sync was probed by the run itself)
    assert max(r["rollout/turns_mean"] for r in rows) > 1.0  # a call's result came back and the model went on
    samples = [json.loads(x) for x in Path(run_dir, "samples.jsonl").read_text().splitlines()]
    assert any(c["name"] == "calculator" for s in samples for c in s["tool_calls"]), [s["messages"] for s in samples]
    # each well-formed call of "A * B" shown is answered (the next message, the tool's) with the product
    pattern = re.compile(r'"name": "calculator", "arguments": \{"expression": "(\d+) \* (\d+)"\}\}\s*</tool_call>')
    found = [(*m.groups(), after["content"]) for s in samples for msg, after in zip(s["messages"], s["messages"][1:])
             if msg["role"] == "assistant" and after["role"] == "tool" and (m := pattern.search(msg["content"]))]
    assert found, [s["messages"] for s in samples]
    assert all(int(a) * int(b) == int(got) for a, b, got in found), found
    # train.log shows the first prompt once, as the model sees it: the chat template's markup and the tools listing
    log = Path(run_dir, "train.log").read_text()
    assert log.count("the first prompt (data row ") == 1
    first = log.split("the first prompt (data row ", 1)[1][:6000]
    assert "<|im_start|>" in first and '"name": "calculator"' in first, first


@pytest.mark.slow  # ~2 min alone; the multi-turn loop under Ray is test_multiturn's, the tools the same code
def test_tools_recipe_two_steps_under_ray(tmp_path):
    from rlvr.runtime.controller import train

    res = train(load_recipe(RECIPE, _small(tmp_path, "ray")))
    _check(res.run_dir)


def test_tools_recipe_two_steps_under_the_local_executor(tmp_path):
    """In-process engine: the turn loop's thread calls it (the OpenMP thread match of rlvr.rollout.vllm_engine)."""
    from rlvr.runtime.controller import train

    res = train(load_recipe(RECIPE, _small(tmp_path, "local")))
    _check(res.run_dir)
