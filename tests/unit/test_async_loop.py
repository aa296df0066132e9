"""Asynchronous rollout (``rollout.max_staleness`` = N) on fakes (tests/unit/loop_fakes.py): the order of each role's
calls, the policy version of every batch trained on, the overlap of generation with training, the drop of samples
staler than N, and resume with batches generated ahead.

The schedule worked out by hand (sync after every update; an engine runs its calls in order): batch s is
generated with the weights of version max(0, s - 1 - N) and trained at step s, where the trainer updates version
s - 1, so its lag is s - 1 - max(0, s - 1 - N) = min(s - 1, N).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from loop_fakes import FakeExecutor

from rlvr.metrics import names as mn
from rlvr.recipe import load_recipe
from rlvr.runtime.controller import train
from rlvr.sync.weights import WeightSyncError

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")


def _recipe(tmp_path, *overrides):
    return load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.save_final=false",
                              "checkpoint.every_steps=0", "sync.probe_every=0", *overrides])  # fmt: skip


def _metrics(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _engine_calls(ex) -> list[str]:
    return [m for role, m in ex.log.calls if role == "engine0" and m in ("generate", "receive_weights")]


@pytest.mark.parametrize(("n", "steps", "engine", "versions", "lags"), [
    # N = 0: generate and train take turns; every batch is on-policy
    (0, 3, ["generate", "receive_weights"] * 3, [0, 1, 2], [0, 0, 0]),
    # N = 1: batch 1 before the loop, batch s + 1 during step s (also past the last step: it goes to the final
    # checkpoint); the sync waits for it
    (1, 3, ["generate", "generate", "receive_weights", "generate", "receive_weights", "generate", "receive_weights"],
     [0, 0, 1, 2], [0, 1, 1]),
    # N = 2: two batches ahead; the lag reaches 2 at step 3 and stays there
    (2, 4, ["generate", "generate", "generate", "receive_weights", "generate", "receive_weights", "generate",
            "receive_weights", "generate", "receive_weights"], [0, 0, 0, 1, 2, 3], [0, 1, 2, 2]),
])  # fmt: skip
def test_each_batch_is_trained_n_versions_behind_never_more(tmp_path, n, steps, engine, versions, lags):
    ex = FakeExecutor()
    res = train(_recipe(tmp_path, f"run.steps={steps}", f"rollout.max_staleness={n}"), executor=ex)
    assert _engine_calls(ex) == engine
    assert ex.objects["engine0"].result().versions == versions  # the weights each batch was generated with
    rows = _metrics(res.run_dir)
    assert [r[mn.ASYNC_STALENESS_MAX] for r in rows] == lags
    assert [r[mn.ASYNC_STALENESS_MEAN] for r in rows] == lags
    for row, lag in zip(rows, lags):  # the histogram: every sample at the batch's lag
        assert row[mn.staleness(lag)] == 1.0 and row[mn.ASYNC_DROPPED_STALE] == 0.0
    trainer = [m for role, m in ex.log.calls if role == "trainer0" and m in ("train_step", "send_weights")]
    assert trainer == ["train_step", "send_weights"] * steps
    assert ex.objects["trainer0"].result().updates == [16] * steps  # P x G of tiny_test, every step


def test_generation_overlaps_the_update_only_when_asynchronous(tmp_path):
    """Generation 0.3 s and the update 0.3 s, both sleeping: the on-policy step takes ~0.6 s with no overlap; at
    N = 1 the next batch's generation runs beside the update (overlap share well above 0, step ~0.3 s)."""
    out = {}
    for n in (0, 1):
        ex = FakeExecutor(generate_s=0.3, train_s=0.3)
        res = train(_recipe(tmp_path / str(n), "run.steps=4", f"rollout.max_staleness={n}"), executor=ex)
        out[n] = _metrics(res.run_dir)
    sync_rows, async_rows = out[0][1:], out[1][1:]  # steady-state steps
    # bounds loose enough for a loaded machine: the sleeps are exact, the controller's own work is not
    assert all(r[mn.ROLES_OVERLAP_FRAC] < 0.05 for r in sync_rows)
    assert all(r[mn.ROLES_OVERLAP_FRAC] > 0.35 for r in async_rows)
    assert all(r[mn.TIMING_STEP_S] > 0.58 for r in sync_rows)  # at least generate + train, in turn
    med = lambda rows: sorted(r[mn.TIMING_STEP_S] for r in rows)[len(rows) // 2]  # noqa: E731
    assert med(async_rows) < 0.8 * med(sync_rows)  # ~0.3 against ~0.6
    for r in sync_rows:  # busy + idle = the step, per role
        assert r[mn.role_busy("engines")] == pytest.approx(0.3, abs=0.1)
        assert r[mn.role_busy("trainer")] + r[mn.role_idle("trainer")] == pytest.approx(r[mn.TIMING_STEP_S], abs=0.05)


def test_a_sample_older_than_n_is_dropped_and_regenerated(tmp_path):
    """The engine's third generate call (step 2's batch at N = 1) claims a version 100 behind: all of that batch's
    groups are regenerated at step 2 (16 samples counted), and what is trained is again within the bound."""
    ex = FakeExecutor(stale_call=2)
    res = train(_recipe(tmp_path, "run.steps=3", "rollout.max_staleness=1"), executor=ex)
    rows = _metrics(res.run_dir)
    assert [r[mn.ASYNC_DROPPED_STALE] for r in rows] == [0.0, 0.0, 16.0]
    assert all(r[mn.ASYNC_STALENESS_MAX] <= 1 for r in rows)
    assert _engine_calls(ex).count("generate") == 5  # 4 batches (one ahead of step 3) + 1 regeneration


def test_resume_reads_back_the_batches_generated_ahead(tmp_path):
    """4 steps at N = 1 against 2 + 2 resumed from the step-2 checkpoint: the resumed run trains on the batch the
    first run generated ahead (version 1, lag 1 at step 3) without generating it again, and every step's lag and
    reward match."""
    full = train(_recipe(tmp_path / "full", "run.steps=4", "rollout.max_staleness=1"), executor=FakeExecutor())
    r2 = _recipe(tmp_path / "half", "run.steps=2", "rollout.max_staleness=1", "checkpoint.every_steps=2")
    half = train(r2, executor=FakeExecutor())
    ex = FakeExecutor()
    resumed = train(_recipe(tmp_path / "half", "run.steps=4", "rollout.max_staleness=1", "run.resume=auto"),
                    executor=ex)  # fmt: skip
    assert resumed.run_dir == half.run_dir
    # the resumed engine generates batches 4 and 5 (batch 3 comes from the checkpoint), with versions 2 and 3
    assert ex.objects["engine0"].result().versions == [2, 3]
    keys = (mn.ASYNC_STALENESS_MAX, mn.REWARD_MEAN, mn.POLICY_VERSION)
    assert [[r[k] for k in keys] for r in _metrics(resumed.run_dir)] == [[r[k] for k in keys] for r in _metrics(full.run_dir)]


def test_resume_refuses_a_checkpoint_of_another_lag(tmp_path):
    from rlvr.config import RecipeError

    train(_recipe(tmp_path, "run.steps=2", "checkpoint.every_steps=2"), executor=FakeExecutor())
    with pytest.raises(RecipeError, match="max_staleness"):
        train(_recipe(tmp_path, "run.steps=4", "rollout.max_staleness=1", "run.resume=auto"), executor=FakeExecutor())


def test_a_failed_sync_stops_the_asynchronous_loop(tmp_path, monkeypatch):
    """An engine that cannot take the weights stops the run with WeightSyncError, as on-policy."""
    import loop_fakes

    def broken(self, specs, version, bucket_mb=0.0):
        raise RuntimeError("reload failed")

    monkeypatch.setattr(loop_fakes.FakeEngine, "receive_weights", broken)
    with pytest.raises(WeightSyncError, match="policy version 1"):
        train(_recipe(tmp_path, "run.steps=3", "rollout.max_staleness=1"), executor=FakeExecutor())


def test_the_timeline_file_holds_each_steps_calls(tmp_path):
    res = train(_recipe(tmp_path, "run.steps=2", "rollout.max_staleness=1"), executor=FakeExecutor())
    from rlvr.metrics.timeline import read_timeline

    rows = read_timeline(Path(res.run_dir) / "timeline.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["start"] <= r["end"]
        assert all(r["start"] <= a <= b <= r["end"] for _, _, a, b in r["spans"])
    methods = {m for _, m, _, _ in rows[0]["spans"]}
    assert {"generate", "score", "train_step", "send_weights", "receive_weights"} <= methods


@pytest.mark.parametrize(("override", "fragment"), [
    ("rollout.max_staleness=-1", "rollout.max_staleness=-1 must be >= 0"),
    ("rollout.cpus=[0,0]", "rollout.cpus=[0, 0] must list distinct core numbers"),
    ("trainer.cpus=[-1]", "trainer.cpus=[-1] must list distinct core numbers"),
])  # fmt: skip
def test_bad_async_settings_are_refused_at_load(tmp_path, override, fragment):
    from rlvr.config import RecipeError

    with pytest.raises(RecipeError, match=re.escape(fragment)):
        _recipe(tmp_path, override)


def test_cores_this_machine_lacks_are_named():
    import os

    from rlvr.hardware import bind_cpus

    before = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match=r"cores \[4096\] are not available"):
        bind_cpus((4096,))
    assert os.sched_getaffinity(0) == before


def test_async_on_shared_cpu_cores_warns(tmp_path, caplog):
    """On CPU, overlap with the engines and the trainer on the same cores made steps slower (measured): say so."""
    import logging

    from rlvr.runtime.controller import preflight

    with caplog.at_level(logging.WARNING, logger="rlvr"):
        preflight(_recipe(tmp_path, "rollout.max_staleness=1"))
        assert "compete for them" in caplog.text
        caplog.clear()
        preflight(_recipe(tmp_path, "rollout.max_staleness=1", "rollout.cpus=[0]", "trainer.cpus=[0]"))
        preflight(_recipe(tmp_path))
        assert "compete" not in caplog.text
