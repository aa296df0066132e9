"""The training loop on a CUDA device: ``pytest -m gpu tests/gpu`` on a machine with an NVIDIA GPU (skipped, not
errored, everywhere else, so a plain ``pytest -q`` on CPU reports it as skipped). The torch trainer's case needs
torch and transformers only (marker ``gpu``); the DeepSpeed case also ``gpu_full`` (DeepSpeed, NCCL).

recipes/tiny_test.yaml (the ``tiny-random`` model, built locally: no download) for 3 steps through the local
executor (every role in this process, so the test can see what they put on the GPU), the transformers engine
(``rollout.engine=hf``: no vLLM CUDA build needed), ``model.dtype=bfloat16``: the engine holds bf16 weights on the
GPU, the trainer fp32 master weights under bf16 autocast (rlvr/train/policy.py). Once with the torch trainer and
once with DeepSpeed ZeRO-2 (the GPU recipe's trainer).

GPU settings: ``trainer.num_gpus`` and ``rollout.num_gpus`` stay 0. They are Ray resource requests; the local
executor ignores them (both roles take ``cuda`` when ``torch.cuda.is_available()``), and ``sync.backend=auto``
would pick NCCL when both are >= 1, which refuses two ranks on one GPU. The sync is gloo (``sync.backend=gloo``):
the trainer sends from host memory, the engine receives into CUDA tensors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (pytest -m gpu tests/gpu on a GPU machine)"),
]

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny_test.yaml")
SHAPING = REPO / "tests" / "integration" / "shaping_verifiers.py"


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def _weights(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


# torch: torch + transformers only (marker gpu); DeepSpeed joins its group over NCCL on CUDA (gpu_full)
@pytest.mark.parametrize("backend", ["torch", pytest.param("deepspeed", marks=pytest.mark.gpu_full)])
def test_three_steps_on_cuda_bf16(tmp_path, backend):
    from rlvr.metrics import names as mn
    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.runtime.controller import train
    from rlvr.sync.probe import tolerance

    overrides = [
        f"run.output_dir={tmp_path}", "run.steps=3", "run.executor=local", "rollout.engine=hf",
        "model.dtype=bfloat16", f"trainer.backend={backend}", "trainer.lr=1e-2", "sync.backend=gloo",
        "trainer.num_gpus=0", "rollout.num_gpus=0",
        # math (the primary, for pass@k) and a dense digit share the random model earns some of: the policy moves
        f"reward.verifiers=[{{name: math}}, {{name: '{SHAPING}:digit_share'}}]",
    ]  # fmt: skip
    if backend == "deepspeed":
        overrides.append("trainer.zero_stage=2")
    recipe = load_recipe(TINY, overrides)
    assert recipe.model.dtype == "bfloat16" and recipe.sync.probe_every == 1
    torch.cuda.reset_peak_memory_stats()
    result = train(recipe)
    assert torch.cuda.max_memory_allocated() > 1_000_000  # the engine and the trainer held their tensors on the GPU

    rows = [json.loads(line) for line in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r[mn.POLICY_VERSION] for r in rows] == [1, 2, 3]
    assert [r[mn.SYNC_POLICY_VERSION] for r in rows] == [1, 2, 3]
    tol = tolerance("bfloat16", None)
    for r in rows:
        for k in (mn.REWARD_MEAN, mn.TRAIN_LOSS, mn.TRAIN_GRAD_NORM, mn.TRAIN_ENTROPY):
            assert r.get(k) is not None and math.isfinite(r[k]), (r["step"], k, r.get(k))
        assert r[mn.TRAIN_SKIPPED] == 0, r
        # the sync probe ran after every sync and passed: the engine computes what the trainer computes
        for k in (mn.SYNC_PROBE_GAP_MEAN, mn.SYNC_PROBE_GAP_GEN_MEAN):
            assert k in r and 0.0 <= r[k] <= tol, (r["step"], k, r.get(k))
        assert math.isfinite(r[mn.SYNC_PROBE_GAP_MAX])
    assert any(r[mn.REWARD_MEAN] > 0 for r in rows)  # the dense reward: advantages were not all zero

    # the final policy (saved in bf16) differs from the start in every tensor
    start = _weights(resolve_model("tiny-random"))
    final = _weights(result.final_dir)
    assert set(start) == set(final)
    unchanged = [k for k in start if torch.equal(start[k].to(torch.bfloat16), final[k].to(torch.bfloat16))]
    assert unchanged == [], f"tensors the update did not move: {unchanged}"
