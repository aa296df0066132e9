"""A role that fails to start leaks nothing (issue 23, "Start-up and clean-up"): on the fakes of
tests/unit/loop_fakes.py, a trainer whose ``setup`` raises (after the engine and the reward role are up) makes
:class:`rlvr.runtime.roles.Roles` close the reward pool and stop every role thread before the error reaches the
caller, and :func:`rlvr.runtime.controller.train` also closes its metric sinks; the same when the placement
groups cannot be reserved (nothing spawned yet)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from loop_fakes import FakeExecutor, FakeTrainer

import rlvr.runtime.controller as controller
from rlvr.recipe import load_recipe
from rlvr.runtime.executors import RoleError
from rlvr.runtime.roles import Roles

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")


class SetupFails(FakeTrainer):
    def setup(self, master_addr, master_port):
        self.log.add(self.role, "setup")
        raise RuntimeError("no room for the optimizer state")


class FailingExecutor(FakeExecutor):
    """The fakes, with trainer rank 0's ``setup`` raising; counts ``shutdown`` calls and the reward's ``close``."""

    def __init__(self, fail_reserve: bool = False) -> None:
        super().__init__()
        self.fail_reserve, self.shutdowns = fail_reserve, 0

    def reserve(self, groups, timeout_s, setting=None):
        if self.fail_reserve:
            raise RoleError("the recipe asks for more than the Ray cluster has: trainer[0] needs {GPU 1}")

    def spawn(self, name, cls, *args, resources=None, **kwargs):
        handle = super().spawn(name, cls, *args, resources=resources, **kwargs)
        if name == "trainer0":  # rebuild rank 0 from the failing class, on the thread the fake got
            thread, _ = handle._target
            handle._target = (thread, thread.submit(lambda: SetupFails(None, None, 0, 1, log=self.log, role=name)))
        return handle

    def _submit(self, target, method, args, kwargs):
        if method == "close":
            self.log.add("reward", "close")
        return super()._submit(target, method, args, kwargs)

    def shutdown(self):
        self.shutdowns += 1
        super().shutdown()


def _role_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("rlvr-") and t.is_alive()]


def _threads_gone(before: list[str], within_s: float = 5.0) -> list[str]:
    """The role threads started since ``before`` still alive after ``within_s`` seconds (empty: all stopped)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = [n for n in _role_threads() if n not in before]
        if not left:
            return []
        time.sleep(0.05)
    return left


def _model_dir(r) -> str:
    from rlvr.models import resolve_model

    return resolve_model(r.model.path)  # the tiny random model, built locally (the probe prompt needs its tokenizer)


def _recipe(tmp_path):
    return load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.steps=1",
                              "run.save_final=false", "checkpoint.every_steps=0"])  # fmt: skip


def test_a_role_that_fails_in_setup_stops_the_roles_already_started(tmp_path):
    before = _role_threads()
    ex, r = FailingExecutor(), _recipe(tmp_path)
    with pytest.raises(RoleError, match="trainer0.setup failed: RuntimeError: no room for the optimizer state"):
        Roles(r, _model_dir(r), tmp_path, ex)
    # engine0, reward and trainer0 had started (one thread each), the reward pool was closed, then the executor
    assert {"engine0", "reward", "trainer0"} <= set(ex.objects)
    assert ("reward", "close") in ex.log.calls and ex.shutdowns == 1
    assert ex._threads == [] and _threads_gone(before) == []


def test_train_closes_its_sinks_when_the_roles_fail_to_start(tmp_path, monkeypatch):
    closed = []
    real = controller.make_sinks

    def sinks(recipe, run_dir):
        s = real(recipe, run_dir)
        close = s.close
        s.close = lambda: (closed.append(True), close())[1]
        return s

    monkeypatch.setattr(controller, "make_sinks", sinks)
    before = _role_threads()
    ex = FailingExecutor()
    with pytest.raises(RoleError, match="trainer0.setup failed"):
        controller.train(_recipe(tmp_path), executor=ex)
    assert closed == [True] and ex.shutdowns == 1  # once: by Roles, not again by train (it holds no Roles)
    assert _threads_gone(before) == []


def test_a_reservation_that_fails_stops_the_executor(tmp_path):
    ex, r = FailingExecutor(fail_reserve=True), _recipe(tmp_path)
    with pytest.raises(RoleError, match="more than the Ray cluster has"):
        Roles(r, _model_dir(r), tmp_path, ex)
    assert ex.shutdowns == 1 and ex.objects == {}  # nothing spawned; no reward pool to close
    assert ("reward", "close") not in ex.log.calls
