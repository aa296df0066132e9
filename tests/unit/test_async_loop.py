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


def test_each_timing_means_the_same_in_both_loops(tmp_path):
    """Generation 0.5 s, the update 0.2 s (sleeps). In both loops ``timing/train_s`` is the update inside the
    trainer (0.2 s: not the next batch's generation the asynchronous controller collects meanwhile) and
    ``timing/rollout_s`` the trained batch's generation (0.5 s); ``timing/train_wait_s`` is the controller's wait:
    the whole update on-policy (~0.2 s), nothing under N = 1 (the 0.5 s generation outlasts the 0.2 s update)."""
    for n in (0, 1):
        ex = FakeExecutor(generate_s=0.5, train_s=0.2)
        rows = _metrics(train(_recipe(tmp_path / str(n), "run.steps=3", f"rollout.max_staleness={n}"),
                              executor=ex).run_dir)[1:]  # fmt: skip
        for r in rows:
            # bounds loose enough for a loaded machine (the sleeps are exact, the threads' wake-ups are not); the
            # broken readings are far outside them: train_s 0.5 (the generation), train_wait_s 0.5 under N = 1
            assert r[mn.TIMING_TRAIN_S] == pytest.approx(0.2, abs=0.06), n
            assert r[mn.TIMING_ROLLOUT_S] == pytest.approx(0.5, abs=0.25), n
            assert r[mn.TIMING_TRAIN_WAIT_S] == pytest.approx(0.2 if n == 0 else 0.0, abs=0.15), n
            # the step is made of its stages: on-policy they add up, asynchronous the update hides in the rollout
            stages = r[mn.TIMING_ROLLOUT_S] + r[mn.TIMING_REWARD_S] + r[mn.TIMING_TRAIN_WAIT_S] + r[mn.TIMING_SYNC_S]
            assert r[mn.TIMING_STEP_S] == pytest.approx(stages, abs=0.2), n


def test_dynamic_sampling_refill_rounds_are_timed(tmp_path):
    """DAPO's extra rounds: the first generate call answers all right (no signal), so a second round runs; with
    generation sleeping 0.3 s, ``timing/refill_s`` holds that round (~0.3 s) and only the batch that had one."""
    ex = FakeExecutor(all_right_calls=1, generate_s=0.3)
    rows = _metrics(train(_recipe(tmp_path, "run.steps=2", "algorithm.dynamic_sampling=true"), executor=ex).run_dir)
    assert rows[0][mn.DYNAMIC_SAMPLING_ROUNDS] == 1.0 and rows[0][mn.TIMING_REFILL_S] == pytest.approx(0.3, abs=0.1)
    assert rows[1][mn.DYNAMIC_SAMPLING_ROUNDS] == 0.0 and rows[1][mn.TIMING_REFILL_S] < 0.05


def test_a_sample_older_than_n_is_dropped_and_regenerated(tmp_path):
    """The engine's third generate call (step 3's batch at N = 1, generated during step 2) claims a version 100
    behind and answers every sample wrong: all of that batch's groups are regenerated at step 3 (16 samples counted), and what is trained
    is again within the bound, with the regeneration's rewards (half right: advantages +-1 per group, where the
    stale all-wrong groups would give 0) and its metrics (reward/mean 0.5, not the dropped batch's 0)."""
    ex = FakeExecutor(stale_call=2)
    res = train(_recipe(tmp_path, "run.steps=3", "rollout.max_staleness=1"), executor=ex)
    rows = _metrics(res.run_dir)
    assert [r[mn.ASYNC_DROPPED_STALE] for r in rows] == [0.0, 0.0, 16.0]
    assert all(r[mn.ASYNC_STALENESS_MAX] <= 1 for r in rows)
    assert _engine_calls(ex).count("generate") == 5  # 4 batches (one ahead of step 3) + 1 regeneration
    assert rows[2][mn.REWARD_MEAN] == 0.5  # samples 0 and 2 of each group right (the fake engine's rule)
    batch = ex.objects["trainer0"].result().batches[2]  # step 3's
    adv = batch.advantages if batch.advantages.dim() == 1 else batch.advantages[:, 0]
    # GRPO with std scaling on rewards [1, 0, 1, 0]: (r - 0.5) / std, std = sqrt(1/3) (unbiased) -> +-0.866
    assert adv.abs().min().item() > 0.8


def test_resume_reads_back_the_batches_generated_ahead(tmp_path):
    """4 steps at N = 1 against 2 + 2 resumed from the step-2 checkpoint: the resumed run trains on the batch the
    first run generated ahead (version 1, lag 1 at step 3) without generating it again, and every step's lag and
    reward match. The fake engine answers by each call's seed, so every batch has its own reward: a resume that
    trained another batch (regenerated with another seed, or batch 4 at step 3) would differ."""
    full = train(_recipe(tmp_path / "full", "run.steps=4", "rollout.max_staleness=1"), executor=FakeExecutor(seeded=True))
    r2 = _recipe(tmp_path / "half", "run.steps=2", "rollout.max_staleness=1", "checkpoint.every_steps=2")
    half = train(r2, executor=FakeExecutor(seeded=True))
    ex = FakeExecutor(seeded=True)
    resumed = train(_recipe(tmp_path / "half", "run.steps=4", "rollout.max_staleness=1", "run.resume=auto"),
                    executor=ex)  # fmt: skip
    assert resumed.run_dir == half.run_dir
    # the resumed engine generates batches 4 and 5 (batch 3 comes from the checkpoint), with versions 2 and 3
    assert ex.objects["engine0"].result().versions == [2, 3]
    keys = (mn.ASYNC_STALENESS_MAX, mn.REWARD_MEAN, mn.POLICY_VERSION)
    full_rows = [[r[k] for k in keys] for r in _metrics(full.run_dir)]
    assert len({row[1] for row in full_rows}) == 4  # every batch has its own reward
    assert [[r[k] for k in keys] for r in _metrics(resumed.run_dir)] == full_rows


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
    """Generation 0.3 s and the update 0.2 s (sleeps) at N = 1: each step's row of RUN/timeline.jsonl holds that
    step's calls with their lengths: one ``train_step`` of ~0.2 s and one ``generate`` of ~0.3 s (the next batch's),
    each inside the step's window; a row that lost or doubled a span, or kept another step's, fails."""
    res = train(_recipe(tmp_path, "run.steps=2", "rollout.max_staleness=1"),
                executor=FakeExecutor(generate_s=0.3, train_s=0.2))  # fmt: skip
    from rlvr.metrics.timeline import read_timeline

    rows = read_timeline(Path(res.run_dir) / "timeline.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["start"] <= r["end"]
        assert all(r["start"] <= a <= b <= r["end"] for _, _, a, b in r["spans"])
        length = lambda method: sum(b - a for _, m, a, b in r["spans"] if m == method)  # noqa: E731
        assert [m for _, m, _, _ in r["spans"]].count("train_step") == 1
        assert [m for _, m, _, _ in r["spans"]].count("generate") == 1
        assert length("train_step") == pytest.approx(0.2, abs=0.05)
        assert length("generate") == pytest.approx(0.3, abs=0.05)
    methods = {m for _, m, _, _ in rows[0]["spans"]}
    assert {"generate", "score", "train_step", "send_weights", "receive_weights"} <= methods


def test_asynchronous_rollout_is_corrected_by_default_or_refused(tmp_path):
    """The lag is never trained on uncorrected without saying so: at N = 1 the default (auto) is AReaL's
    decoupled objective under ppo_clip; on-policy it stays tis (off at tis_cap 0); an explicit tis at cap 0, or a
    loss the decoupled weight is not defined for, is refused naming the settings; none is accepted."""
    from rlvr.config import RecipeError

    assert _recipe(tmp_path, "rollout.max_staleness=1").algorithm.rollout_correction == "decoupled"
    assert _recipe(tmp_path).algorithm.rollout_correction == "tis"
    assert _recipe(tmp_path, "rollout.max_staleness=1", "algorithm.rollout_correction=none").algorithm.tis_cap == 0
    with pytest.raises(RecipeError, match=r"rollout.max_staleness=1 with algorithm.rollout_correction=tis and "
                                          r"algorithm.tis_cap=0"):
        _recipe(tmp_path, "rollout.max_staleness=1", "algorithm.rollout_correction=tis")
    for loss in ("gspo", "cispo"):  # auto resolves to tis there, uncorrected: refused, the TIS cap named
        with pytest.raises(RecipeError, match="algorithm.tis_cap"):
            _recipe(tmp_path, "rollout.max_staleness=1", f"algorithm.policy_loss={{name: {loss}}}")
        with pytest.raises(RecipeError, match=f"rollout_correction=decoupled with algorithm.policy_loss={loss}"):
            _recipe(tmp_path, f"algorithm.policy_loss={{name: {loss}}}", "algorithm.rollout_correction=decoupled")
        r = _recipe(tmp_path, "rollout.max_staleness=1", f"algorithm.policy_loss={{name: {loss}}}", "algorithm.tis_cap=2")
        assert r.algorithm.rollout_correction == "tis"


def test_uncorrected_asynchronous_rollout_on_purpose_is_said_at_start(tmp_path, caplog):
    import logging

    from rlvr.runtime.controller import preflight

    with caplog.at_level(logging.WARNING, logger="rlvr"):
        preflight(_recipe(tmp_path, "rollout.max_staleness=1", "algorithm.rollout_correction=none"))
    assert "rollout_correction=none" in caplog.text and "uncorrected" in caplog.text


@pytest.mark.parametrize(("override", "fragment"), [
    ("rollout.max_staleness=-1", "rollout.max_staleness=-1 must be >= 0"),
    ("rollout.max_staleness=2", "rollout.max_staleness=2: rlvr's asynchronous rollout keeps one generation in flight"),
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


class _Died(Exception):
    """An engine process gone (as Ray's ActorDiedError)."""


def _dying_executor(die_at_call: int, **kw):
    """The fake executor where engine0's generate call ``die_at_call`` (0-based, counted over the run) kills its
    process: that call and every later call on the same handle fail as a died actor does (``RoleError``,
    ``died=True``); ``kill`` marks a handle dead and the role is built anew."""
    from loop_fakes import FakeExecutor

    from rlvr.runtime.executors import RoleError, _timed

    class Dying(FakeExecutor):
        def __init__(self):
            super().__init__(**kw)
            self.dead, self.generates = set(), 0

        def _submit(self, target, method, args, kwargs):
            thread, obj = target

            def run():  # in the role's own thread, in call order, as LocalExecutor runs it
                if id(target) in self.dead:
                    raise _Died("actor died")
                if method == "generate" and target is self.engine_target:
                    self.generates += 1
                    if self.generates - 1 == die_at_call:
                        self.dead.add(id(target))
                        raise _Died("actor died")
                return _timed(obj.result(), method, args, kwargs)

            return thread.submit(run)

        def spawn(self, name, cls, *args, **kwargs):
            h = super().spawn(name, cls, *args, **kwargs)
            if name == "engine0":
                self.engine_target = h._target
            return h

        def get(self, calls, timeout_s, what, setting=None):
            try:
                return super().get(calls, timeout_s, what, setting)
            except RoleError as e:
                c = next((c for c in calls if c.future.done() and isinstance(c.future.exception(), _Died)), None)
                if c is None:
                    raise
                raise RoleError(f"{what}: the {c.role} actor died during {c.method}", c.role, died=True) from e

        def kill(self, handle):
            self.dead.add(id(handle._target))

    return Dying()


def test_an_engine_dead_during_the_stale_regeneration_is_restarted_once(tmp_path):
    """N = 1, batch 3 stale (the third generate call): step 3 submits batch 4's generation (call 3), then the
    regeneration of batch 3 queues behind it on the same engine. The engine dies in call 3: the regeneration fails
    as died, engine0 is replaced (restart 1) and the regeneration retried on the replacement; then collecting batch
    4, whose call went to the dead handle, retries on the replacement without replacing it again: one restart,
    not two (the healthy replacement killed by index), and the run finishes every step."""
    ex = _dying_executor(3, stale_call=2)
    res = train(_recipe(tmp_path, "run.steps=4", "rollout.max_staleness=1", "rollout.max_restarts=2"), executor=ex)
    rows = _metrics(res.run_dir)
    assert [r[mn.POLICY_VERSION] for r in rows] == [1, 2, 3, 4]
    assert rows[2][mn.ASYNC_DROPPED_STALE] == 16.0
    assert max(r[mn.TIMING_ENGINE_RESTARTS] for r in rows) == 1.0


def test_resume_with_another_engine_count_says_the_rollouts_differ(tmp_path, caplog):
    """rollout.num_engines may change on resume (scale-out), but it re-splits each batch over the engines, which
    seed their samplers alike: the resumed run is warned that its rollouts differ from an uninterrupted one's."""
    import logging

    common = ["rollout.engine=hf", "rollout.prompts_per_step=4", "checkpoint.every_steps=1"]
    train(_recipe(tmp_path, "run.steps=1", *common), executor=FakeExecutor())
    with caplog.at_level(logging.WARNING, logger="rlvr"):
        train(_recipe(tmp_path, "run.steps=2", *common, "run.resume=auto"), executor=FakeExecutor())
        assert "rollout.num_engines" not in caplog.text
        train(_recipe(tmp_path, "run.steps=3", *common, "run.resume=auto", "rollout.num_engines=2"),
              executor=FakeExecutor())  # fmt: skip
    assert "resume changes rollout.num_engines: 1 -> 2" in caplog.text and "not identical" in caplog.text


@pytest.mark.parametrize("every_ck", [0, 2])
def test_in_flight_the_sync_lands_while_batches_run_and_checkpoints_drain(tmp_path, every_ck):
    """``rollout.in_flight_updates`` at N = 2 through the real controller on the continuous-batching fake
    (:class:`loop_fakes.SlotEngine`: decode steps of 20 ms, samples 4 or 32 tokens, the update instant): every step
    trains its 16 samples, no sampled token is more than 2 versions behind (the per-token histogram over lags 0..2
    sums to 1), batches s + 1 .. s + 2 are in flight at step s's sync (the engine's calls for 4 + 2 batches all
    submitted, samples spanning an update: ``async/spanning_frac`` > 0 at some step) and the engine's loop usage is
    reported. With a checkpoint every 2 steps, the batches in flight at a checkpoint step finish before its sync:
    no sample of the batches that step drains spans that step's update."""
    ex = FakeExecutor(slot_engine=dict(slots=16, dt_s=0.02, short=4, long_mult=8, long_frac=0.25))
    res = train(_recipe(tmp_path, "run.steps=4", "rollout.max_staleness=2", "rollout.in_flight_updates=true",
                        f"checkpoint.every_steps={every_ck}"), executor=ex)  # fmt: skip
    rows = _metrics(res.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert ex.objects["trainer0"].result().updates == [16] * 4
    for r in rows:
        assert sum(r[mn.token_staleness(k)] for k in range(3)) == pytest.approx(1.0)
        assert 0.0 <= r[mn.ASYNC_ENGINE_BUSY_FRAC] <= 1.0
    assert _engine_calls(ex).count("generate") == 4 + 2
    eng = ex.objects["engine0"].result()
    if every_ck == 0:
        assert max(r[mn.ASYNC_SPANNING_FRAC] for r in rows) > 0.0
    else:  # steps 2 and 4 drain: batches 3, 4 (in flight at step 2) finish under the versions they had, below 2
        for b in eng.batches[2:4]:
            assert all(max(x.versions) < 2 for x in b.samples)


def test_train_tokens_per_s_is_the_batch_over_the_slowest_rank():
    """``train/tokens_per_s``: the tokens the update took (every rank reports the batch's) over ``timing/train_s``,
    the slowest rank's own time: 238 tokens over 3.5 s = 68 tokens/s."""
    from types import SimpleNamespace

    from rlvr.runtime.controller import _wait_update

    ranks = [{mn.TRAIN_TOKENS: 238.0, mn.TIMING_TRAIN_INNER_S: 2.0}, {mn.TRAIN_TOKENS: 238.0, mn.TIMING_TRAIN_INNER_S: 3.5}]
    roles = SimpleNamespace(get=lambda calls, *a: calls)
    out = _wait_update(roles, ranks, False, SimpleNamespace(timeouts=SimpleNamespace(train_s=1.0)))
    assert out[mn.TIMING_TRAIN_S] == 3.5 and out[mn.TRAIN_TOKENS_PER_S] == pytest.approx(68.0)
