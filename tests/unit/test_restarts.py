"""A run that restarts itself (issue 41, run.max_restarts; rlvr.runtime.restarts) on the fake loop: which failures
are restarted, from which checkpoint, and that the run folder keeps each step once."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from loop_fakes import FakeExecutor, FakeTrainer

from rlvr.recipe import load_recipe
from rlvr.runtime.controller import prepare_run_dir
from rlvr.runtime.executors import RoleError
from rlvr.runtime.restarts import backoff_s, restart_cause, train_with_restarts
from rlvr.sync.weights import WeightSyncError

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")


def _recipe(tmp_path, *overrides):
    return load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.save_final=false",
                              "sync.probe_every=0", "run.restart_backoff_s=1.5", "timeouts.train_s=0.3", *overrides])  # fmt: skip


def _steps(run_dir) -> list[int]:
    return [json.loads(x)["step"] for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _swap_class(ex, role: str, cls):
    """``ex`` (a fake executor) with the role ``role`` made an instance of ``cls`` once spawned (a fake that fails
    on purpose). Returns ``ex``."""
    spawn = ex.spawn

    def spawn_swapped(name, kind, *args, **kwargs):
        h = spawn(name, kind, *args, **kwargs)
        if name == role:
            h._target[1].result().__class__ = cls
        return h

    ex.spawn = spawn_swapped
    return ex


def _failing(at_call: int, error: Exception | None):
    """Executors for each attempt: the first one's trainer raises ``error`` at its ``at_call``-th train_step, or
    (None) hangs there for 1 s, past the recipes' ``timeouts.train_s`` of 0.3 s (a rank that stopped answering)."""
    made = []

    class Failing(FakeTrainer):
        def train_step(self, batch, dph=None):
            if len(self.updates) + 1 == at_call:
                if error is None:
                    time.sleep(1.0)
                    return super().train_step(batch, dph)
                raise error
            return super().train_step(batch, dph)

    def make():
        ex = FakeExecutor()
        if not made:
            _swap_class(ex, "trainer0", Failing)
        made.append(ex)
        return ex

    return make, made


def test_which_failures_a_restart_mends():
    assert restart_cause(RoleError("x", "trainer0", died=True)) == "the trainer0 role's process died"
    assert restart_cause(RoleError("x", "engine0", timed_out=True)) == "engine0 overran its deadline"
    assert restart_cause(WeightSyncError("x")) == "the weight sync failed"
    assert restart_cause(RoleError("trainer0.train_step failed: RuntimeError: a bug")) is None  # raises again
    assert restart_cause(ValueError("bad recipe")) is None
    assert [backoff_s(10.0, k) for k in (1, 2, 3, 6, 7)] == [10.0, 20.0, 40.0, 300.0, 300.0]


def test_a_hung_trainer_restarts_from_the_checkpoint_and_each_step_is_logged_once(tmp_path, caplog):
    """4 steps, a checkpoint every 2; the trainer hangs at its 3rd update (step 3) past timeouts.train_s: the run
    restarts from step_000002 after 1.5 s and redoes steps 3 and 4; metrics.jsonl holds steps 1-4 once each. (A
    dead role's process is a Ray actor's death: restart_cause above; under Ray: the chaos test, to come.)"""
    r = _recipe(tmp_path, "run.steps=4", "checkpoint.every_steps=2", "run.max_restarts=1")
    make, made = _failing(3, None)
    waits: list[float] = []
    run_dir = prepare_run_dir(r)
    with caplog.at_level(logging.WARNING, logger="rlvr.runtime.restarts"):
        res = train_with_restarts(r, run_dir, make, sleep=waits.append)
    assert Path(res.run_dir) == run_dir and len(made) == 2 and waits == [1.5]
    assert _steps(run_dir) == [1, 2, 3, 4]
    assert made[1].objects["trainer0"].result().updates == [16, 16]  # the restart trained steps 3 and 4 only
    assert "restart 1 of 1 in 2s from " in caplog.text and "step_000002" in caplog.text
    assert "trainer0 overran its deadline" in caplog.text
    # RUN/train.log: both attempts' records and the restart's cause, each once (one handler however nested)
    log_text = (run_dir / "train.log").read_text()
    assert log_text.count("restart 1 of 1 in 2s") == 1 and log_text.count("run folder: ") == 2
    logging.getLogger("rlvr").warning("a record after the run")  # the run's log ended with it
    assert "a record after the run" not in (run_dir / "train.log").read_text()


def test_before_any_checkpoint_the_restart_begins_at_step_1_without_duplicate_rows(tmp_path):
    r = _recipe(tmp_path, "run.steps=3", "checkpoint.every_steps=0", "run.max_restarts=2")
    make, made = _failing(2, None)
    run_dir = prepare_run_dir(r)
    train_with_restarts(r, run_dir, make, sleep=lambda s: None)
    assert len(made) == 2 and _steps(run_dir) == [1, 2, 3]
    assert made[1].objects["trainer0"].result().updates == [16, 16, 16]


@pytest.mark.parametrize("error", [RoleError("trainer0.train_step failed: RuntimeError: a bug", "trainer0"),
                                   ValueError("a bad row")])
def test_a_cause_no_restart_mends_ends_the_run_at_once(tmp_path, error):
    r = _recipe(tmp_path, "run.steps=3", "checkpoint.every_steps=1", "run.max_restarts=3")
    make, made = _failing(2, error)
    with pytest.raises(RoleError, match="trainer0.train_step failed: (RoleError|ValueError)"):  # as the executor reports it
        train_with_restarts(r, prepare_run_dir(r), make, sleep=lambda s: None)
    assert len(made) == 1


def test_restarts_spent_the_last_failure_ends_the_run(tmp_path):
    r = _recipe(tmp_path, "run.steps=3", "checkpoint.every_steps=1", "run.max_restarts=0")
    make, made = _failing(2, None)
    with pytest.raises(RoleError, match="did not finish within 0.3s"):
        train_with_restarts(r, prepare_run_dir(r), make, sleep=lambda s: None)
    assert len(made) == 1


def test_which_failures_keep_the_other_roles_running(tmp_path):
    """A dead trainer rank or critic under Ray: the engines and the other roles are kept and only the trainer group
    is rebuilt (controller.keeps_roles); anything else, or engines that hold the failed attempt's requests (in-flight
    updates) or adapter versions, restarts every role."""
    from rlvr.runtime.controller import keeps_roles

    ray = _recipe(tmp_path, "run.executor=ray")
    died = lambda role: RoleError("x", role, died=True)  # noqa: E731
    assert keeps_roles(died("trainer0"), ray) and keeps_roles(died("trainer1"), ray) and keeps_roles(died("critic"), ray)
    sync_err = WeightSyncError("the sync failed")
    sync_err.__cause__ = died("trainer0")  # the sender died mid-sync
    assert keeps_roles(sync_err, ray)
    assert not keeps_roles(died("engine0"), ray) and not keeps_roles(died("reward"), ray)
    assert not keeps_roles(RoleError("x", "trainer0", timed_out=True), ray)  # alive but stuck: replace everything
    assert not keeps_roles(ValueError("x"), ray) and not keeps_roles(died("trainer0"), _recipe(tmp_path))  # local
    in_flight = _recipe(tmp_path, "run.executor=ray", "rollout.in_flight_updates=true", "rollout.max_staleness=1")
    assert not keeps_roles(died("trainer0"), in_flight)


def test_a_failure_while_the_last_checkpoint_is_written_still_commits_it(tmp_path):
    """checkpoint.async_write with a checkpoint every step: step 2's rollout fails while the trainer writes step 1's
    checkpoint (committed only after that rollout when all goes well). The trainer lives, so the failed run still
    commits it once written: the restart loses only step 2, not steps 1 and 2."""
    from loop_fakes import FakeEngine

    from rlvr.runtime.checkpoint import list_complete
    from rlvr.runtime.controller import train

    class Failing(FakeEngine):
        def generate(self, prompts, sampling):
            if self.calls == 1:
                raise RuntimeError("the engine's own bug")
            return super().generate(prompts, sampling)

    ex = _swap_class(FakeExecutor(), "engine0", Failing)
    r = _recipe(tmp_path, "run.steps=3", "checkpoint.every_steps=1", "checkpoint.async_write=true", "timeouts.train_s=30")
    with pytest.raises(RoleError, match="the engine's own bug"):
        train(r, executor=ex)
    assert [p.name for p in list_complete(tmp_path / "tiny_test")] == ["step_000001"]
    assert not list((tmp_path / "tiny_test" / "checkpoints").glob("*.tmp-*"))


def test_a_dead_trainer_rank_is_rebuilt_and_the_other_roles_kept(tmp_path):
    """The fake loop as if under Ray (run.executor=ray; a role's death reported as Ray reports it): the trainer
    rank dies at its 3rd update (step 3) with a checkpoint every 2 steps. The same executor goes on (no new one),
    the engine and the reward worker are the ones it had, a new trainer rank loads step 2's checkpoint and trains
    steps 3 and 4; each step once in metrics.jsonl."""

    class Dying(FakeTrainer):
        def train_step(self, batch, dph=None):
            if len(self.updates) == 2:
                raise RoleError("step 3: policy update: the trainer0 actor died", "trainer0", died=True)
            return super().train_step(batch, dph)

    class RayLike(FakeExecutor):
        """Deaths pass through as RoleError(died=True), as RayExecutor reports them; kill drops the role."""

        def _get(self, calls, timeout_s, what, setting=None):
            try:
                return super()._get(calls, timeout_s, what, setting)
            except RoleError as e:
                if isinstance(e.__cause__, RoleError):
                    raise e.__cause__ from None
                raise

        def kill(self, handle):
            self.killed.append(handle.name)

    made, spawned = [], []

    def make():
        ex = RayLike()
        ex.killed = []
        spawn = ex.spawn

        def spawn_dying(name, cls, *args, **kwargs):
            h = spawn(name, cls, *args, **kwargs)
            spawned.append(name)
            if name == "trainer0" and spawned.count("trainer0") == 1:
                h._target[1].result().__class__ = Dying
            return h

        ex.spawn = spawn_dying
        made.append(ex)
        return ex

    r = _recipe(tmp_path, "run.executor=ray", "run.steps=4", "checkpoint.every_steps=2", "run.max_restarts=1",
                "timeouts.train_s=30")  # fmt: skip
    run_dir = prepare_run_dir(r)
    train_with_restarts(r, run_dir, make, sleep=lambda s: None)
    assert len(made) == 1 and made[0].killed == ["trainer0"]
    assert spawned.count("trainer0") == 2 and spawned.count("engine0") == 1 and spawned.count("reward") == 1
    assert made[0].objects["trainer0"].result().updates == [16, 16]  # the new rank trained steps 3 and 4
    assert _steps(run_dir) == [1, 2, 3, 4]
    assert "the engines and other roles are kept, the trainer group rebuilt" in (run_dir / "train.log").read_text()
