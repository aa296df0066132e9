"""Every wait on a role has a deadline from the recipe (issue 9 item 9), and an overrun names the role, the step and
the setting to raise. The executors are real (the local one runs roles on threads in this process)."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest

from rlvr.config import RecipeError
from rlvr.recipe import load_recipe
from rlvr.runtime.executors import LocalExecutor, RoleError

ROOT = Path(__file__).resolve().parents[2]


class _Slow:
    def __init__(self):
        self.release = threading.Event()

    def work(self, seconds):
        self.release.wait(seconds)
        return seconds


def test_an_overrun_names_the_role_the_call_and_the_setting():
    ex = LocalExecutor()
    h = ex.spawn("trainer0", _Slow)
    t0 = time.monotonic()
    with pytest.raises(RoleError) as ei:
        ex.get([h.call("work", 5.0)], 0.2, "step 3: policy update", "timeouts.train_s")
    assert time.monotonic() - t0 < 2.0
    msg = str(ei.value)
    assert msg.startswith("step 3: policy update: trainer0.work did not finish within 0.2s: raise timeouts.train_s")
    assert ei.value.timed_out and ei.value.role == "trainer0" and not ei.value.died
    ex.shutdown()


def test_the_deadline_covers_the_whole_wait_not_each_call():
    """Three calls of 0.4 s on three roles, 0.6 s allowed: waiting 0.6 s per call would pass, the deadline does not."""
    ex = LocalExecutor()
    hs = [ex.spawn(f"engine{i}", _Slow) for i in range(3)]
    calls = [hs[0].call("work", 0.4), hs[1].call("work", 0.8), hs[2].call("work", 1.2)]
    with pytest.raises(RoleError, match="engine2.work did not finish"):
        ex.get(calls, 1.0, "rollout", "timeouts.rollout_s")
    ex.shutdown()


def test_as_completed_names_the_late_role():
    ex = LocalExecutor()
    fast, slow = ex.spawn("engine0", _Slow), ex.spawn("engine1", _Slow)
    got = []
    with pytest.raises(RoleError, match=r"rollout: engine1.work did not finish within 0.5s: raise timeouts.rollout_s"):
        for i, v in ex.as_completed([fast.call("work", 0.0), slow.call("work", 5.0)], 0.5, "rollout", "timeouts.rollout_s"):
            got.append(i)
    assert got == [0]
    ex.shutdown()


def test_timeouts_section_defaults_and_checks():
    r = load_recipe(None)
    assert (r.timeouts.startup_s, r.timeouts.rollout_s, r.timeouts.reward_s, r.timeouts.train_s,
            r.timeouts.checkpoint_s) == (1800.0, 3600.0, 600.0, 3600.0, 1800.0)  # fmt: skip
    with pytest.raises(RecipeError, match=r"timeouts.train_s must be > 0 seconds, got 0.0"):
        load_recipe(None, ["timeouts.train_s=0"])


def test_no_role_wait_without_a_deadline():
    """Static: every `.get(calls, timeout, ...)` / `.as_completed(...)` on roles in rlvr/runtime passes a timeout
    that is neither None nor a number literal (it comes from the recipe)."""
    bad = []
    for f in (ROOT / "rlvr" / "runtime").glob("*.py"):
        if f.name == "executors.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "as_completed"):
                if len(node.args) >= 3 and isinstance(node.args[0], (ast.List, ast.Name, ast.ListComp)):
                    timeout = node.args[1]
                    if isinstance(timeout, ast.Constant):
                        bad.append(f"{f.name}:{node.lineno} timeout {timeout.value!r}")
    assert not bad, bad


class _WithEngine:
    stopped: list = []

    def __init__(self, name, fail=False):
        self.name, self.fail = name, fail

    def shutdown(self):
        _WithEngine.stopped.append((self.name, threading.current_thread().name))
        if self.fail:
            raise RuntimeError("engine core already gone")


class _Broken:
    def __init__(self):
        raise ValueError("no model")

    def shutdown(self):  # never built: never called
        _WithEngine.stopped.append(("broken", ""))


def test_local_shutdown_stops_each_roles_engine_in_its_own_thread(caplog):
    """LocalExecutor.shutdown calls each built role's ``shutdown`` (VLLMEngine: the in-process engine core stops
    then, not whenever the garbage collector runs), in the role's own thread; one that raises is logged and the
    others are still stopped; a role whose construction failed, or that has no ``shutdown``, is left alone."""
    _WithEngine.stopped = []
    ex = LocalExecutor()
    hs = [ex.spawn("engine0", _WithEngine, "a", fail=True), ex.spawn("judge", _WithEngine, "b"),
          ex.spawn("broken", _Broken), ex.spawn("trainer0", _Slow)]
    ex.get([hs[0].call("__init__", "a", True), hs[1].call("__init__", "b")], 5, "built")  # construction finished
    with caplog.at_level("WARNING"):
        ex.shutdown()
    assert [n for n, _ in _WithEngine.stopped] == ["a", "b"]
    assert [t.split("_")[0] for _, t in _WithEngine.stopped] == ["rlvr-engine0", "rlvr-judge"]
    assert "engine core already gone" in caplog.text
    ex.shutdown()  # a second shutdown stops nothing twice
    assert len(_WithEngine.stopped) == 2
