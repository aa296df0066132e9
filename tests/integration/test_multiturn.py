"""Multi-turn rollouts through the real loop (tiny model, vLLM engine, environment and verifier pools, trainer on
CPU): the guessing game under the local executor with asynchronous rollout at N = 1, exact resume (4 steps = 2 + 2
resumed), and under Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlvr.recipe import load_recipe

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny_test.yaml")
SHAPING = Path(__file__).parent / "shaping_verifiers.py"


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "guess.jsonl"
    data.write_text("".join(json.dumps({"question": "guess a number from 1 to 4", "answer": str(i % 4 + 1)}) + "\n"
                            for i in range(8)))
    return data


def _common(tmp_path: Path) -> list[str]:
    # a dense reward the random model earns some of (digit share), so every update moves the weights
    return ["model.dtype=float32", f"data.source={_data(tmp_path)}", "rollout.prompts_per_step=4",
            "trainer.lr=1e-2", "run.save_final=false", "checkpoint.keep_last=5", f"run.output_dir={tmp_path}",
            f"reward.verifiers=[{{name: '{SHAPING}:digit_share'}}]", "environment.name=guess",
            "environment.args={low: 1, high: 4}", "environment.max_turns=3", "environment.max_tokens=96",
            "environment.num_workers=1", "metrics.samples_every=1"]  # fmt: skip


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in Path(run_dir, "metrics.jsonl").read_text().splitlines()]


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted((ckpt / "trainer" / "hf").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_multiturn_async_and_resume_under_the_local_executor(tmp_path):
    from rlvr.runtime.controller import prepare_run_dir, train

    common = [*_common(tmp_path), "run.executor=local", "rollout.max_staleness=1"]
    full = train(load_recipe(TINY, [*common, "run.name=full", "run.steps=4"]))
    a = _rows(full.run_dir)
    assert [r["step"] for r in a] == [1, 2, 3, 4]
    for r in a:
        assert 1.0 <= r["rollout/turns_mean"] <= 3.0 and r["rollout/env_failed_frac"] == 0.0
        assert r["rollout/prefix_broken_frac"] == 0.0 and r["sync/probe_gap_mean"] < 2e-4
    assert max(r["rollout/turns_mean"] for r in a) > 1.0  # the environment answered and the model went on
    samples = [json.loads(x) for x in Path(full.run_dir, "samples.jsonl").read_text().splitlines()]
    assert any(s["turns"] >= 2 and [m["role"] for m in s["messages"][s["opening_messages"]:]][:3] ==
               ["assistant", "user", "assistant"] for s in samples)  # the trajectory's structure, turn by turn
    half = train(load_recipe(TINY, [*common, "run.name=half", "run.steps=2"]))
    resumed_recipe = load_recipe(TINY, [*common, "run.name=half", "run.steps=4", "run.resume=auto"])
    resumed = train(resumed_recipe, prepare_run_dir(resumed_recipe))
    b = _rows(resumed.run_dir)
    for ra, rb in zip(a, b):  # the same trajectories: same rewards, turns and lengths, step by step
        for k in ("reward/mean", "rollout/turns_mean", "response/length_mean"):
            assert ra[k] == rb[k], (ra["step"], k)
    wa = _weights(Path(full.run_dir, "checkpoints", "step_000004"))
    wb = _weights(Path(resumed.run_dir, "checkpoints", "step_000004"))
    w2 = _weights(Path(half.run_dir, "checkpoints", "step_000002"))
    assert all(float((wa[n] - w2[n]).abs().max()) > 1e-4 for n in wa)
    for n in wa:
        assert torch.allclose(wa[n], wb[n], atol=1e-5), (n, float((wa[n] - wb[n]).abs().max()))


def test_multiturn_under_ray(tmp_path):
    from rlvr.runtime.controller import train

    # with DAPO's dynamic sampling (refill rounds are trajectories too) and validation on trajectories
    res = train(load_recipe(TINY, [*_common(tmp_path), "run.executor=ray", "run.name=ray", "run.steps=2",
                                   "algorithm.dynamic_sampling=true", "algorithm.dynamic_sampling_filter=reward",
                                   "validation.every_steps=2", f"validation.source={_data(tmp_path)}",
                                   "validation.limit=4", "validation.samples=2"]))  # fmt: skip
    logged = _rows(res.run_dir)
    rows = [r for r in logged if r["step"] >= 1]
    assert [r["step"] for r in rows] == [1, 2] and all(r["rollout/turns_mean"] >= 1.0 for r in rows)
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in rows)
    assert all("dynamic_sampling/informative_frac" in r for r in rows)
    val = [r for r in logged if "val/pass@2" in r]
    assert [r["step"] for r in val] == [0, 2] and all(0.0 <= r["val/pass@2"] <= 1.0 for r in val)


def test_multiturn_in_flight_updates(tmp_path):
    """Multi-turn trajectories with in-flight updates (N = 2): the turn loop's rounds go to engines that keep their
    requests across syncs, so a trajectory continues across an update between turns and within a turn. Every step
    trains, each sampled token is at most N versions behind (the per-token histogram sums to 1 over lags 0..2), the
    environment's tokens carry no version (the token histogram counts sampled tokens only: its lag-weighted mean
    matches async/token_staleness_mean), the sync is checked as ever."""
    from rlvr.metrics import names as mn
    from rlvr.runtime.controller import train

    common = [*_common(tmp_path), "run.executor=local", "rollout.max_staleness=2", "rollout.in_flight_updates=true",
              "environment.max_tokens=160", "rollout.max_new_tokens=48"]  # fmt: skip
    a = _rows(train(load_recipe(TINY, [*common, "run.name=inflight", "run.steps=5"])).run_dir)
    assert [r["step"] for r in a] == [1, 2, 3, 4, 5]
    for r in a:
        hist = [r[mn.token_staleness(k)] for k in range(3)]
        assert sum(hist) == pytest.approx(1.0)
        assert r[mn.ASYNC_TOKEN_STALENESS_MEAN] == pytest.approx(sum(k * h for k, h in enumerate(hist)))
        assert r["rollout/env_failed_frac"] == 0.0 and r["sync/probe_gap_mean"] < 2e-4
    assert max(r["rollout/turns_mean"] for r in a) > 1.0
    # within the bound; the turn loop runs one batch's turns at a time (one thread), so a batch submitted behind
    # another starts its first turn when that one's turns end, under newer weights: lag 1 here, never more than 2
    assert all(1.0 <= r[mn.ASYNC_STALENESS_MAX] <= 2.0 for r in a[2:])
